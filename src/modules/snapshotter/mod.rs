//! snapshotter: csi-snapshotter parity (the sidecar half of
//! external-snapshotter; snapshot-controller does the rest).
//!
//! The driver's VolumeSnapshotContents get `CreateSnapshot` (dynamic ones),
//! `ListSnapshots` (pre-provisioned ones), `DeleteSnapshot` (on deletion
//! with policy Delete), their status, the being-created annotation, the
//! finalizer removal and upstream's events. Decisions are in [`decide`];
//! this file does the I/O: the content view and the class cache of the
//! shared informers, the queue `csi-snapshotter-content`, CSI calls through
//! the shared connection, JSON patches, events, and the Lease
//! `external-snapshotter-leader-<driver>`.
//!
//! With the `CSIVolumeGroupSnapshot` gate (default on) and the group
//! snapshot API installed, [`group`] serves the driver's
//! VolumeGroupSnapshotContents too, on its own queue
//! `csi-snapshotter-groupsnapshotcontent` under the same Lease.

pub mod config;
pub mod decide;
mod discovery;
mod group;
pub mod group_decide;
pub mod waiting;
mod written;

use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, runtime::reflector::ObjectRef};
use tokio_util::sync::CancellationToken;

use crate::{
    compat::{self, snapshotter as upstream},
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{self as csi, controller_service_capability::rpc::Type as Rpc},
    },
    debug::WaitingFor,
    k8s::{
        cache::Cache,
        events::{EventType, Recorder, reference},
        informers::{Change, Informer},
        key::ObjectKey,
        queue::{Backoff, WorkQueue},
        snapshot_api::{VolumeSnapshotClass, VolumeSnapshotContent},
    },
    modules::{
        contract::{Module, ModuleContext, ModuleError},
        kit::{Done, Kit, Reconciled, Wait},
    },
};
use config::SnapshotterFlags;
use decide::{Naming, Observed, SnapError, Step};

const NAME: &str = "snapshotter";

/// The newest version of each content this process wrote (see `written`).
type Written = written::Written<VolumeSnapshotContent>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

struct Snapshotter {
    cfg: SnapshotterFlags,
    naming: Naming,
    driver: Arc<DriverInfo>,
    csi: Connection,
    client: Client,
    events: Recorder,
    contents: Cache<VolumeSnapshotContent>,
    classes: Cache<VolumeSnapshotClass>,
    written: Written,
}

impl Snapshotter {
    fn api(&self) -> Api<VolumeSnapshotContent> {
        Api::all(self.client.clone())
    }

    /// The content to act on: the cached one, or the one we wrote if the
    /// cache is behind it.
    fn current(&self, name: &str) -> Option<Arc<VolumeSnapshotContent>> {
        written::current(&self.written, name, self.contents.get(&ObjectRef::new(name)))
    }

    async fn patch(&self, name: &str, patch: serde_json::Value) -> Result<Arc<VolumeSnapshotContent>, kube::Error> {
        written::patch(&self.api(), &self.written, name, patch, false).await
    }

    async fn patch_status(
        &self,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<Arc<VolumeSnapshotContent>, kube::Error> {
        written::patch(&self.api(), &self.written, name, patch, true).await
    }

    fn event(&self, c: &VolumeSnapshotContent, kind: EventType, reason: &str, message: &str) {
        self.events.publish(reference(c), kind, reason, message);
    }

    fn class(&self, c: &VolumeSnapshotContent) -> Option<Arc<VolumeSnapshotClass>> {
        c.spec.volume_snapshot_class_name.as_deref().and_then(|n| self.classes.get(&ObjectRef::new(n)))
    }

    async fn sync(&self, key: ObjectKey<VolumeSnapshotContent>) -> Reconciled {
        let name = key.name();
        let Some(content) = self.current(name) else {
            tracing::debug!("Content gone");
            return Ok(Done::Finished);
        };
        let class = self.class(&content);
        if !decide::is_ours(&content, &self.driver.name, class.as_deref()) {
            tracing::trace!("Not this driver's content");
            return Ok(Done::Finished);
        }
        let step = decide::step(&content);
        tracing::debug!(?step, "Synchronizing VolumeSnapshotContent");
        match step {
            Step::Delete { snapshot_id } => self.delete(content, snapshot_id).await,
            Step::Create { first } => {
                let (reason, text): (&str, fn(&str) -> String) = if first {
                    (upstream::REASON_CREATION_FAILED, upstream::text_creation_failed)
                } else {
                    (upstream::REASON_CHECK_FAILED, upstream::text_check_failed)
                };
                match self.create(content, class.as_deref()).await {
                    Ok(c) => self.ready_or_poll(&c),
                    Err((latest, e)) => {
                        tracing::warn!(error = %e, "CreateSnapshot failed");
                        self.record_error(&latest, reason, &text(&e.to_string())).await;
                        Err(Wait::on(waiting::create_waiting(&latest, &e)))
                    }
                }
            }
            Step::Ready { remove_annotation } => {
                if !remove_annotation {
                    return Ok(Done::Finished);
                }
                match self.patch(name, decide::remove_being_created_patch()).await {
                    Ok(c) => self.ready_or_poll(&c),
                    Err(e) => {
                        tracing::warn!(error = %e, "Removing the being-created annotation failed");
                        Err(Wait::on(WaitingFor::ApiServer))
                    }
                }
            }
            Step::Check { snapshot_id, group_member } => {
                match self.check(content.clone(), class.as_deref(), &snapshot_id, group_member).await {
                    Ok(c) => self.ready_or_poll(&c),
                    Err(e) => {
                        tracing::warn!(snapshot = %snapshot_id, error = %e, "Checking the snapshot failed");
                        let latest = self.current(name).unwrap_or(content);
                        self.record_error(
                            &latest,
                            upstream::REASON_CHECK_FAILED,
                            &upstream::text_check_failed(&e.to_string()),
                        )
                        .await;
                        Err(Wait::on(e.waiting_for()))
                    }
                }
            }
            step @ Step::Wait => Err(Wait::on(step.waiting_for().unwrap_or(WaitingFor::Retry))),
        }
    }

    fn ready_or_poll(&self, c: &VolumeSnapshotContent) -> Reconciled {
        ready_or_poll(c, self.cfg.retry_interval_start)
    }

    async fn record_error(&self, c: &VolumeSnapshotContent, reason: &str, message: &str) {
        record_error(&self.api(), &self.written, &self.events, c, (reason, message), "content").await
    }

    async fn secrets(&self, name: &str, namespace: &str) -> Result<HashMap<String, String>, String> {
        crate::k8s::secrets::secret_data(&self.client, name, namespace).await
    }

    /// CreateSnapshot and the status. Err: the newest content read and the
    /// error.
    async fn create(
        &self,
        content: Arc<VolumeSnapshotContent>,
        class: Option<&VolumeSnapshotClass>,
    ) -> Result<Arc<VolumeSnapshotContent>, (Arc<VolumeSnapshotContent>, SnapError)> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut req = match decide::create_request(&content, class, &self.naming) {
            Ok(r) => r,
            Err(e) => return Err((content, e)),
        };
        if let Ok(Some((secret, ns))) = decide::deletion_secret_ref(&content) {
            match self.secrets(&secret, &ns).await {
                Ok(s) => req.secrets = s,
                Err(e) => {
                    tracing::warn!(error = %e, "Reading the snapshotter secret failed");
                    let source = Box::new(SnapError::Credentials(name.clone()));
                    return Err((content, SnapError::CreateInput { content: name, source }));
                }
            }
        }
        let mut content = content;
        // Whether `content` is the apiserver's latest (our own write's answer).
        let mut fresh = false;
        if !decide::has_annotation(&content, upstream::ANN_BEING_CREATED) {
            content = match self.patch(&name, decide::being_created_patch(content.as_ref())).await {
                Ok(c) => c,
                Err(e) => {
                    let error = crate::k8s::error_text(&e);
                    return Err((content, SnapError::AddAnnotation { content: name, error }));
                }
            };
            fresh = true;
        }
        let volume = req.source_volume_id.clone();
        tracing::info!(snapshot = %req.name, volume = %volume, "Creating snapshot through the driver");
        let resp = match self.csi.create_snapshot(self.cfg.timeout, req).await {
            Ok(r) => r,
            Err(status) => {
                let error = compat::grpc_error_text(&status);
                if decide::is_final(Some(status.code())) {
                    match self.patch(&name, decide::remove_being_created_patch()).await {
                        Ok(c) => content = c,
                        Err(e) => {
                            let error = format!(
                                "failed to remove VolumeSnapshotBeingCreated annotation from the content {name}: {}",
                                crate::k8s::error_text(&e)
                            );
                            return Err((content, SnapError::Take { volume, error }));
                        }
                    }
                }
                return Err((content, SnapError::Take { volume, error }));
            }
        };
        let observed = match decide::observe(resp.snapshot.as_ref(), Timestamp::now()) {
            Ok(o) => o,
            // Nonsense: the driver may still have made something, so the
            // annotation stays (like a timeout).
            Err(e) => return Err((content, SnapError::Take { volume, error: e.to_string() })),
        };
        tracing::debug!(?observed, "Snapshot created");
        let content = self.write_status(&name, content, &observed, fresh).await?;
        match self.patch(&name, decide::remove_being_created_patch()).await {
            Ok(c) => Ok(c),
            Err(e) => Err((content, SnapError::RemoveAnnotation { content: name, error: crate::k8s::error_text(&e) })),
        }
    }

    /// Writes the status an observation gives, against `content` when it
    /// is `fresh` (the apiserver's answer to our own write just before the
    /// call: only this sidecar writes a content's status), else against a
    /// fresh read (upstream always reads).
    async fn write_status(
        &self,
        name: &str,
        content: Arc<VolumeSnapshotContent>,
        observed: &Observed,
        fresh: bool,
    ) -> Result<Arc<VolumeSnapshotContent>, (Arc<VolumeSnapshotContent>, SnapError)> {
        let err = |e: kube::Error| SnapError::Status { content: name.to_string(), error: crate::k8s::error_text(&e) };
        let fresh = if fresh {
            content
        } else {
            match self.api().get(name).await {
                Ok(c) => written::wrote(&self.written, c),
                Err(e) => return Err((content, err(e))),
            }
        };
        let Some(status) = decide::status_update(fresh.status.as_ref(), observed) else { return Ok(fresh) };
        match self.patch_status(name, decide::status_patch(&status)).await {
            Ok(c) => Ok(c),
            Err(e) => Err((fresh, err(e))),
        }
    }

    /// ListSnapshots (or, without LIST_SNAPSHOTS, "ready") and the status.
    async fn check(
        &self,
        content: Arc<VolumeSnapshotContent>,
        class: Option<&VolumeSnapshotClass>,
        snapshot_id: &str,
        group_member: bool,
    ) -> Result<Arc<VolumeSnapshotContent>, SnapError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut secrets = HashMap::new();
        if let Some(class_name) = &content.spec.volume_snapshot_class_name {
            let class = class.ok_or_else(|| SnapError::CheckClass {
                class: class_name.clone(),
                content: name.clone(),
                error: SnapError::ClassNotFound(class_name.clone()).to_string(),
            })?;
            let r = decide::list_secret_ref(class.parameters.as_ref(), &name)
                .map_err(|error| SnapError::ListSecretRef { content: name.clone(), error })?;
            if let Some((secret, ns)) = r {
                secrets = self
                    .secrets(&secret, &ns)
                    .await
                    .map_err(|error| SnapError::ListCredentials { content: name.clone(), error })?;
            }
        }
        if group_member {
            let member = |e| SnapError::MemberCredentials { content: name.clone(), source: Box::new(e) };
            if let Some((secret, ns)) = decide::deletion_secret_ref(&content).map_err(member)? {
                secrets = self.secrets(&secret, &ns).await.map_err(|_| member(SnapError::Credentials(name.clone())))?;
            }
        }
        let now = Timestamp::now();
        let observed = if self.driver.has_controller_capability(Rpc::ListSnapshots) {
            let req = csi::ListSnapshotsRequest { snapshot_id: snapshot_id.to_string(), secrets, ..Default::default() };
            let resp = self
                .csi
                .list_snapshots(self.cfg.timeout, req)
                .await
                .map_err(|s| SnapError::List { content: name.clone(), error: compat::grpc_error_text(&s) })?;
            let not_found = || SnapError::List { content: name.clone(), error: SnapError::not_found(snapshot_id) };
            let entry = resp.entries.first().ok_or_else(not_found)?;
            let snap = entry.snapshot.as_ref().ok_or_else(not_found)?;
            Observed {
                handle: snapshot_id.to_string(),
                ready: snap.ready_to_use,
                created_ns: decide::creation_ns(snap.creation_time.as_ref(), now),
                size: snap.size_bytes,
                group_id: snap.group_snapshot_id.clone(),
            }
        } else {
            Observed {
                handle: snapshot_id.to_string(),
                ready: true,
                created_ns: decide::creation_ns(None, now),
                size: 0,
                group_id: String::new(),
            }
        };
        tracing::debug!(?observed, "Snapshot checked");
        self.write_status(&name, content, &observed, false).await.map_err(|(_, e)| e)
    }

    /// DeleteSnapshot (when there is a backend snapshot to delete), then
    /// the finalizer.
    async fn delete(&self, content: Arc<VolumeSnapshotContent>, snapshot_id: Option<String>) -> Reconciled {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut content = content;
        if let Some(id) = snapshot_id {
            let secrets = match decide::deletion_secret_ref(&content) {
                Ok(None) => HashMap::new(),
                Ok(Some((secret, ns))) => match self.secrets(&secret, &ns).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "Reading the snapshotter secret failed");
                        self.event(
                            &content,
                            EventType::Warning,
                            upstream::REASON_DELETE_ERROR,
                            upstream::TEXT_DELETE_CREDENTIALS,
                        );
                        return Err(Wait::on(WaitingFor::Secret));
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "No snapshotter secret for the deletion");
                    self.event(
                        &content,
                        EventType::Warning,
                        upstream::REASON_DELETE_ERROR,
                        upstream::TEXT_DELETE_CREDENTIALS,
                    );
                    return Err(Wait::on(e.waiting_for()));
                }
            };
            tracing::info!(snapshot = %id, "Deleting snapshot through the driver");
            let req = csi::DeleteSnapshotRequest { snapshot_id: id.clone(), secrets };
            if let Err(s) = self.csi.delete_snapshot(self.cfg.timeout, req).await {
                tracing::warn!(snapshot = %id, error = %compat::grpc_error_text(&s), "DeleteSnapshot failed");
                self.event(&content, EventType::Warning, upstream::REASON_DELETE_ERROR, upstream::TEXT_DELETE_FAILED);
                return Err(Wait::on(WaitingFor::Driver));
            }
            let cleared = async {
                let fresh = self.api().get(&name).await?;
                let status = decide::cleared_status(fresh.status.as_ref());
                self.patch_status(&name, decide::status_patch(&status)).await
            };
            match cleared.await {
                Ok(c) => content = c,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Done::Finished),
                Err(e) => {
                    tracing::warn!(error = %e, "Clearing the content status failed");
                    self.event(
                        &content,
                        EventType::Warning,
                        upstream::REASON_DELETE_ERROR,
                        upstream::TEXT_DELETE_CLEAR_STATUS,
                    );
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
            }
        }
        match crate::k8s::finalizers::remove(&self.api(), &*content, upstream::CONTENT_FINALIZER).await {
            Ok(()) => {
                tracing::debug!("Removed the content's protection finalizer");
                Ok(Done::Finished)
            }
            Err(e) => {
                tracing::warn!(error = %e, "Removing the content finalizer failed");
                Err(Wait::on(WaitingFor::ApiServer))
            }
        }
    }
}

/// After a create or check of a content or group content: done when ready,
/// else polled with backoff. A ready one that is being deleted is synced
/// again `soon`: the deletion waited for the being-created annotation,
/// whose removal is our own change and so not announced to us (upstream
/// waits for the resync there).
fn ready_or_poll<K: decide::Content>(c: &K, soon: Duration) -> Reconciled {
    let Some(w) = waiting::after_answer(c) else { return Ok(Done::Finished) };
    // Not done and ready: being deleted.
    Err(if c.is_ready() { Wait::on(w).after(soon) } else { Wait::on(w) })
}

/// Records a failure (`reason`, `message`) in the `status.error` of `c`
/// and as a Warning event, unless the same message is already recorded
/// (`what`: the kind in the log, "content" or "group content").
async fn record_error<K>(
    api: &Api<K>,
    written: &written::Written<K>,
    events: &Recorder,
    c: &K,
    (reason, message): (&str, &str),
    what: &str,
) where
    K: decide::Content<DynamicType = ()> + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(patch) = decide::error_patch(c.status(), message, Timestamp::now()) else {
        tracing::debug!("The same error is already recorded");
        return;
    };
    let name = c.meta().name.clone().unwrap_or_default();
    if let Err(e) = written::patch(api, written, &name, patch, true).await {
        tracing::warn!(error = %e, "Recording the error in the {what} status failed");
    }
    // Emitted even when the status write failed, so the user sees it.
    events.publish(reference(c), EventType::Warning, reason, message);
}

/// Feeds the changes of a content (or group content) view into its queue,
/// resynced every `period`: a deleted one is forgotten by the queue, the
/// written store and `/debug/objects`, an update is queued only when [`decide::should_enqueue`]
/// says so, and anything else is queued.
fn feed<K: decide::Content + Send + Sync + 'static>(
    inf: &Informer<K>,
    period: Duration,
    shutdown: &CancellationToken,
    q: WorkQueue<ObjectKey<K>>,
    written: written::Written<K>,
) {
    inf.on_change_with_resync(period, shutdown, move |c| {
        let key = ObjectKey::of(c.object().meta());
        match c {
            Change::Deleted(_) => {
                q.forget(&key);
                q.untrack(&key);
                lock(&written).remove(key.name());
            }
            Change::Updated { old, new } if !decide::should_enqueue(*old, *new) => {}
            _ => q.add(key),
        }
    });
}

/// The module's entry points for the host.
impl Module for SnapshotterFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        SnapshotterFlags::validate(self).map(|_| ()).map_err(|message| ModuleError::Config { module: NAME, message })
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Runs the snapshotter until shutdown (or until its Lease is lost).
pub async fn run(cfg: SnapshotterFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(NAME, ctx)?.retrying(Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max });
    let config = |message: &str| kit.config_error(message);
    let (kube, ctx) = (&kit.kube, &kit.ctx);
    let gates = cfg.validate().map_err(|e| config(&e))?;
    if cfg.node_deployment && kube.leader.enabled {
        return Err(config(upstream::TEXT_NODE_DEPLOYMENT_LEADER));
    }
    let node = if cfg.node_deployment {
        match std::env::var(upstream::NODE_NAME_ENV) {
            Ok(n) if !n.is_empty() => Some(n),
            _ => {
                return Err(config(upstream::TEXT_NODE_NAME_MISSING));
            }
        }
    } else {
        None
    };
    let Some(driver) = kit.driver().await else { return Ok(()) };
    if !driver.has_controller_capability(Rpc::CreateDeleteSnapshot) {
        return Err(kit.config_error(upstream::text_no_create_capability(&driver.name)));
    }
    if !discovery::wait_for_api(&kube.client, &ctx.shutdown).await {
        return Ok(());
    }
    let groups =
        gates.volume_group_snapshot && discovery::group_api(&kube.client, &ctx.csi, &driver.name, cfg.timeout).await;
    if groups && cfg.groupsnapshot_name_prefix.is_empty() {
        return Err(config(upstream::TEXT_EMPTY_GROUP_PREFIX));
    }
    let informers = &kube.informers;
    let content_inf = match &node {
        None => crate::modules::views::driver_snapshot_contents(informers, &driver.name),
        Some(node) => {
            let (d, n) = (driver.name.to_string(), node.clone());
            informers.view(&format!("driver={d},managed-by={n}"), move |c: &VolumeSnapshotContent| {
                c.spec.driver == d && decide::managed_by(c, &n)
            })
        }
    };
    let class_inf = crate::modules::views::snapshot_classes(informers);
    let group_infs = groups.then(|| {
        (
            crate::modules::views::driver_group_snapshot_contents(informers, &driver.name),
            crate::modules::views::group_snapshot_classes(informers),
        )
    });
    tracing::info!(driver = %driver.name, node = ?node, ?gates, group_snapshots = groups, "Snapshotter starting");

    let queue = kit.queue::<VolumeSnapshotContent>(upstream::QUEUE_CONTENT);
    let written: Written = Arc::default();
    feed(&content_inf, cfg.resync_period, &ctx.shutdown, queue.clone(), written.clone());
    // Created only with group snapshots: its metrics exist only then, as upstream's.
    let group_queue = group_infs.as_ref().map(|_| {
        kit.queue::<crate::k8s::group_snapshot_api::VolumeGroupSnapshotContent>(upstream::QUEUE_GROUP_CONTENT)
    });
    let group_written: group::Written = Arc::default();
    if let (Some((inf, _)), Some(group_queue)) = (&group_infs, &group_queue) {
        feed(inf, cfg.resync_period, &ctx.shutdown, group_queue.clone(), group_written.clone());
    }
    informers.start(&ctx.process);
    let events = kit.recorder(&upstream::event_component(&driver.name));
    let group = group_infs.as_ref().map(|(contents, classes)| {
        Arc::new(group::GroupSnapshotter {
            cfg: cfg.clone(),
            naming: Naming {
                prefix: cfg.groupsnapshot_name_prefix.clone(),
                uuid_length: cfg.groupsnapshot_name_uuid_length,
                extra_metadata: cfg.extra_create_metadata,
            },
            driver: driver.name.clone(),
            csi: ctx.csi.clone(),
            client: kube.client.clone(),
            events: events.clone(),
            contents: contents.store(),
            classes: classes.store(),
            written: group_written,
        })
    });
    let s = Arc::new(Snapshotter {
        naming: Naming {
            prefix: cfg.snapshot_name_prefix.clone(),
            uuid_length: cfg.snapshot_name_uuid_length,
            extra_metadata: cfg.extra_create_metadata,
        },
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        events,
        contents: content_inf.store(),
        classes: class_inf.store(),
        written,
        driver: driver.clone(),
        cfg,
    });
    kit.lead(&upstream::lease_lock_name(&driver.name), move |mut crew| async move {
        let synced = async {
            tokio::join!(content_inf.synced(), class_inf.synced());
            if let Some((contents, classes)) = &group_infs {
                tokio::join!(contents.synced(), classes.synced());
            }
        };
        if !crew.synced("snapshotting", synced).await {
            return;
        }
        let workers = s.cfg.worker_threads;
        crew.serve(&queue, workers, &s, |s, key| async move { s.sync(key).await });
        if let (Some(g), Some(group_queue)) = (group, group_queue) {
            crew.serve(&group_queue, workers, &g, |g, key| async move { g.sync(key).await });
        }
        crew.run().await;
    })
    .await
}

#[cfg(test)]
mod tests;
