//! The reads behind `explain`: the object, its class or content, its events
//! (from the API) and what csi-sidecar holds (from its debug endpoints).

use k8s_openapi::{
    api::{
        core::v1::{Event as CoreEvent, PersistentVolumeClaim},
        storage::v1::{StorageClass, VolumeAttachment},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectList},
};

use super::decide::{Attachment, Claim, Class, Event, Sidecar, Snapshot};
use crate::{
    compat::provisioner as upstream,
    debug::query::Query,
    k8s::snapshot_api::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent},
};

/// A read failed (the text names the object).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The object does not exist (exit 2: bad input).
    #[error("{kind} {name} not found")]
    NotFound {
        /// Its kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The API failed.
    #[error("reading {what}: {source}")]
    Api {
        /// What was read.
        what: String,
        /// Why it failed.
        source: kube::Error,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReadError {
    let what = what.into();
    move |source| ReadError::Api { what, source }
}

/// One object whose events are read: its namespace (`None`: cluster
/// scoped, its events in any namespace), kind and name.
pub type Subject<'a> = (Option<&'a str>, &'a str, &'a str);

/// The events about the `subjects` (an object and, say, its content), all
/// of them newest first.
pub async fn events(client: &Client, subjects: &[Subject<'_>]) -> Vec<Event> {
    let mut items = Vec::new();
    for (namespace, kind, name) in subjects {
        let api: Api<CoreEvent> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let lp = ListParams::default().fields(&format!("involvedObject.kind={kind},involvedObject.name={name}"));
        let list: ObjectList<CoreEvent> = match api.list(&lp).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot list the events");
                continue;
            }
        };
        items.extend(list.items);
    }
    let when = |e: &CoreEvent| -> Option<Timestamp> {
        e.last_timestamp.as_ref().map(|t| t.0).or(e.event_time.as_ref().map(|t| t.0)).or(e
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0))
    };
    items.sort_by_key(|e| std::cmp::Reverse(when(e)));
    items
        .into_iter()
        .map(|e| Event {
            kind: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
            count: e.count.unwrap_or(1),
        })
        .collect()
}

/// What every endpoint holds about (kind, namespace, name).
pub async fn sidecar(endpoints: &[String], kind: &str, namespace: Option<&str>, name: &str) -> Sidecar {
    if endpoints.is_empty() {
        return Sidecar::NotAsked;
    }
    let query = Query {
        kind: Some(kind.to_string()),
        namespace: namespace.map(str::to_string),
        name: Some(name.to_string()),
        limit: Some(10),
        ..Query::default()
    };
    let mut pages = Vec::new();
    let mut failures = Vec::new();
    for e in endpoints {
        match super::endpoint::fetch(e, &query).await {
            Ok(p) => pages.push(p),
            Err(why) => failures.push(why),
        }
    }
    if pages.is_empty() { Sidecar::Unreachable(failures.join("; ")) } else { Sidecar::Pages(pages) }
}

/// A claim and its class.
pub async fn claim(client: &Client, namespace: &str, name: &str) -> Result<(Claim, Class), ReadError> {
    let key = format!("{namespace}/{name}");
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(api_err(format!("PersistentVolumeClaim {key}")))?
        .ok_or_else(|| ReadError::NotFound { kind: "PersistentVolumeClaim", name: key.clone() })?;
    let spec = pvc.spec.clone().unwrap_or_default();
    let claim = Claim {
        key,
        phase: pvc.status.as_ref().and_then(|s| s.phase.clone()),
        volume_name: spec.volume_name.clone().filter(|v| !v.is_empty()),
        class_name: spec.storage_class_name.clone(),
        selected_node: pvc.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_SELECTED_NODE).cloned()),
        deleting: pvc.metadata.deletion_timestamp.as_ref().map(|_| pvc.metadata.finalizers.clone().unwrap_or_default()),
    };
    let class = match spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
        None => Class::None,
        Some(c) => match Api::<StorageClass>::all(client.clone())
            .get_opt(c)
            .await
            .map_err(api_err(format!("StorageClass {c}")))?
        {
            None => Class::Missing(c.to_string()),
            Some(sc) => Class::Found {
                name: c.to_string(),
                provisioner: sc.provisioner,
                wait_for_consumer: sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"),
            },
        },
    };
    Ok((claim, class))
}

/// A VolumeAttachment.
pub async fn attachment(client: &Client, name: &str) -> Result<Attachment, ReadError> {
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(api_err(format!("VolumeAttachment {name}")))?
        .ok_or_else(|| ReadError::NotFound { kind: "VolumeAttachment", name: name.to_string() })?;
    let status = va.status.unwrap_or_default();
    Ok(Attachment {
        name: name.to_string(),
        attacher: va.spec.attacher,
        node: va.spec.node_name,
        pv: va.spec.source.persistent_volume_name,
        attached: status.attached,
        attach_error: status.attach_error.and_then(|e| e.message),
        detach_error: status.detach_error.and_then(|e| e.message),
        deleting: va.metadata.deletion_timestamp.is_some(),
    })
}

/// A VolumeSnapshot, its class's driver and its content.
pub async fn snapshot(client: &Client, namespace: &str, name: &str) -> Result<Snapshot, ReadError> {
    let key = format!("{namespace}/{name}");
    let vs = Api::<VolumeSnapshot>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(api_err(format!("VolumeSnapshot {key}")))?
        .ok_or_else(|| ReadError::NotFound { kind: "VolumeSnapshot", name: key.clone() })?;
    let status = vs.status.clone().unwrap_or_default();
    let class_driver = match vs.spec.volume_snapshot_class_name.as_deref() {
        Some(c) => Api::<VolumeSnapshotClass>::all(client.clone()).get_opt(c).await.ok().flatten().map(|c| c.driver),
        None => None,
    };
    let content_name = status.bound_volume_snapshot_content_name.clone().filter(|c| !c.is_empty());
    let content = match &content_name {
        Some(c) => Api::<VolumeSnapshotContent>::all(client.clone()).get_opt(c).await.ok().flatten(),
        None => None,
    };
    let source_claim = vs.spec.source.persistent_volume_claim_name.clone();
    let source_claim_bound = match (&content_name, &source_claim) {
        (None, Some(c)) => Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
            .get_opt(c)
            .await
            .ok()
            .flatten()
            .and_then(|pvc| pvc.status?.phase)
            .is_some_and(|p| p == "Bound"),
        _ => false,
    };
    Ok(Snapshot {
        key,
        ready: status.ready_to_use == Some(true),
        content: content_name,
        error: status.error.and_then(|e| e.message),
        class_driver,
        source_claim,
        source_claim_bound,
        content_error: content.as_ref().and_then(|c| c.status.as_ref()?.error.as_ref()?.message.clone()),
        content_driver: content.map(|c| c.spec.driver),
        deleting: vs.metadata.deletion_timestamp.is_some(),
    })
}
