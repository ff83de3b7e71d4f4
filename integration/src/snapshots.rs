//! Snapshot API helpers for the snapshotter tests: the three kinds as
//! dynamic objects (the tests write them like a user would, as JSON), the
//! content name snapshot-controller gives a VolumeSnapshot, and the events
//! csi-snapshotter writes on contents (cluster-scoped, so in `default`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};

use crate::{kube_support::wait_for, wait_until};

/// The snapshot kinds' APIs for one namespace.
pub struct SnapApis {
    /// VolumeSnapshotClasses (cluster).
    pub classes: Api<DynamicObject>,
    /// VolumeSnapshots (the namespace).
    pub snapshots: Api<DynamicObject>,
    /// VolumeSnapshotContents (cluster).
    pub contents: Api<DynamicObject>,
    client: Client,
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind))
}

/// `v` as a snapshot object of `kind`.
pub fn obj(kind: &str, mut v: serde_json::Value) -> DynamicObject {
    v["apiVersion"] = "snapshot.storage.k8s.io/v1".into();
    v["kind"] = kind.into();
    serde_json::from_value(v).expect("snapshot object")
}

/// The content snapshot-controller creates for a VolumeSnapshot.
pub fn content_name(snapshot_uid: &str) -> String {
    format!("snapcontent-{snapshot_uid}")
}

/// Whether a VolumeSnapshot or content says `readyToUse: true`.
pub fn ready(o: &DynamicObject) -> bool {
    o.data["status"]["readyToUse"].as_bool() == Some(true)
}

/// `status.error.message`, if any.
pub fn error_message(o: &DynamicObject) -> Option<String> {
    o.data["status"]["error"]["message"].as_str().map(str::to_string)
}

/// Whether the content has the being-created annotation.
pub fn being_created(o: &DynamicObject) -> bool {
    o.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("snapshot.storage.kubernetes.io/volumesnapshot-being-created"))
}

impl SnapApis {
    /// The APIs for namespace `ns`.
    pub fn new(client: &Client, ns: &str) -> SnapApis {
        SnapApis {
            classes: Api::all_with(client.clone(), &resource("VolumeSnapshotClass")),
            snapshots: Api::namespaced_with(client.clone(), ns, &resource("VolumeSnapshot")),
            contents: Api::all_with(client.clone(), &resource("VolumeSnapshotContent")),
            client: client.clone(),
        }
    }

    /// Creates class `name` of `driver` with `policy` and `params`.
    pub async fn class(&self, name: &str, driver: &str, policy: &str, params: serde_json::Value) {
        let mut v = serde_json::json!({"metadata": {"name": name}, "driver": driver, "deletionPolicy": policy});
        if !params.is_null() {
            v["parameters"] = params;
        }
        self.classes.create(&PostParams::default(), &obj("VolumeSnapshotClass", v)).await.expect("create class");
    }

    /// Creates VolumeSnapshot `name` of claim `pvc` with `class`; returns
    /// the name of the content snapshot-controller will create for it.
    pub async fn snapshot_of(&self, name: &str, class: &str, pvc: &str) -> String {
        let v = serde_json::json!({"metadata": {"name": name},
            "spec": {"volumeSnapshotClassName": class, "source": {"persistentVolumeClaimName": pvc}}});
        let s = self.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await.expect("snapshot");
        content_name(&s.metadata.uid.expect("uid"))
    }

    /// Waits until VolumeSnapshot `name` is ready to use; returns it.
    pub async fn wait_snapshot_ready(&self, name: &str, timeout: Duration) -> DynamicObject {
        wait_for(&self.snapshots, name, timeout, ready).await
    }

    /// Waits until content `name` is ready to use; returns it.
    pub async fn wait_content_ready(&self, name: &str, timeout: Duration) -> DynamicObject {
        wait_for(&self.contents, name, timeout, ready).await
    }

    /// Deletes VolumeSnapshot `name`.
    pub async fn delete_snapshot(&self, name: &str) {
        self.snapshots.delete(name, &DeleteParams::default()).await.expect("delete snapshot");
    }

    /// Deletes a content, dropping its finalizers (cleanup of a content no
    /// sidecar will release).
    pub async fn force_delete_content(&self, name: &str) {
        let _ = self.contents.delete(name, &DeleteParams::default()).await;
        let patch = serde_json::json!({"metadata": {"finalizers": null}});
        let _ = self.contents.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await;
    }

    /// Deletes class `name`.
    pub async fn delete_class(&self, name: &str) {
        let _ = self.classes.delete(name, &DeleteParams::default()).await;
    }

    /// Events on content `name` with `reason`: (source component, message, count).
    pub async fn content_events(&self, name: &str, reason: &str) -> Vec<(String, String, i32)> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        api.list(&lp)
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| {
                let component = e.source.and_then(|s| s.component).unwrap_or_default();
                (component, e.message.unwrap_or_default(), e.count.unwrap_or(1))
            })
            .collect()
    }

    /// Waits for an event on content `name` with `reason`.
    pub async fn wait_content_event(&self, name: &str, reason: &str, timeout: Duration) -> Vec<(String, String, i32)> {
        wait_until(&format!("event {reason} on {name}"), timeout, async || {
            let e = self.content_events(name, reason).await;
            (!e.is_empty(), e)
        })
        .await
    }
}
