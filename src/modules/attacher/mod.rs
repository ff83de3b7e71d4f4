//! attacher: external-attacher parity.
//!
//! VolumeAttachments of the driver are attached with
//! `ControllerPublishVolume` and detached with `ControllerUnpublishVolume`,
//! with upstream's finalizers, annotation and status fields. Beyond upstream,
//! attaches and detaches have separate queues and worker budgets, so a pile
//! of failing detaches cannot starve attaches (external-attacher#761), and
//! each queue's backlog is a metric (external-attacher#706).

pub mod config;
pub mod decide;
mod reconcile;
mod settling;
pub mod status;
pub mod waiting;

use parking_lot::Mutex;
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::future::BoxFuture;
use k8s_openapi::{
    api::{
        core::v1::PersistentVolume,
        storage::v1::{CSINode, VolumeAttachment, VolumeError},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};

use crate::{
    compat::{self, attacher as upstream},
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{self as csi, controller_service_capability::rpc::Type as Rpc},
    },
    k8s::{
        cache::Cache,
        cached::{CachedPv, CachedVa},
        informers::Change,
        key::ObjectKey,
        queue::{Backoff, WorkQueue},
    },
    modules::{
        contract::{Module, ModuleContext, ModuleError},
        kit::{Done, Kit, Reconciled, Wait},
    },
};
use config::{AttacherFlags, Gates};
use decide::{Handler, VaAction, VolumeSource};
use status::Write;
use waiting::Stop;

const NAME: &str = "attacher";

/// The key of an attach or detach.
type VaKey = ObjectKey<VolumeAttachment>;
/// The key of a PV finalizer sync.
type PvKey = ObjectKey<PersistentVolume>;

struct Attacher {
    cfg: AttacherFlags,
    gates: Gates,
    driver: Arc<DriverInfo>,
    handler: Handler,
    finalizer: String,
    csi: Connection,
    client: Client,
    vas: Cache<CachedVa>,
    pvs: Cache<CachedPv>,
    csinodes: Cache<CSINode>,
    /// VAs the reconciler found out of sync with the driver.
    forced: Forced,
    /// The syncs' recent touches, which a reconcile pass leaves alone.
    settling: settling::Settling,
    pv_queue: WorkQueue<PvKey>,
}

/// Names of the VolumeAttachments the reconciler found out of sync with the
/// driver; shared by the workers and the VolumeAttachment handler (which
/// forgets a deleted one).
type Forced = Arc<Mutex<HashSet<String>>>;

/// The attacher's work queues, as the VolumeAttachment handler feeds them.
#[derive(Clone)]
struct Queues {
    attach: WorkQueue<VaKey>,
    detach: WorkQueue<VaKey>,
    pv: WorkQueue<PvKey>,
}

impl Queues {
    /// Queues what a change of a VolumeAttachment calls for
    /// ([`decide::va_work`]).
    fn va_changed(&self, change: &Change<'_, CachedVa>, finalizer: &str, forced: &Forced) {
        let work = decide::va_work(change, finalizer);
        if work == decide::VaWork::default() {
            tracing::trace!(
                va = change.object().metadata.name.as_deref().unwrap_or_default(),
                "Nothing to do for this change (our own status or metadata write)"
            );
        }
        if let Some(name) = work.gone {
            forced.lock().remove(&name);
            let key = VaKey::named(name);
            self.attach.untrack(&key);
            self.detach.untrack(&key);
        }
        if let Some(name) = work.detach {
            let key = VaKey::named(name);
            // Being deleted: what an attach waited for no longer matters
            // (the detach files its own entry).
            self.attach.untrack(&key);
            self.detach.add(key);
        }
        if let Some(name) = work.attach {
            self.attach.add(VaKey::named(name));
        }
        if let Some(name) = work.pv {
            self.pv.add(PvKey::named(name));
        }
    }
}

/// Where a sync stopped, for `/debug/objects`: what the object waits
/// for, and `msg` (the error written into its status) as its last error.
fn stopped(stop: Stop, msg: String) -> Wait {
    Wait::failed(stop.waiting_for(), msg)
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Attacher {
    fn va_api(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    /// Writes `write` into the attachment's status: one merge patch from
    /// the status it has (as cached) to the new one, so keys the new status
    /// lacks are removed ([`status`]).
    async fn write_status(&self, va: &VolumeAttachment, write: Write) -> Result<(), kube::Error> {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let old = va.status.as_ref();
        let patch = status::patch(old, &status::next(old, write));
        match self.va_api().patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(written) => {
                self.settling.wrote(name, written.metadata.resource_version);
                Ok(())
            }
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Records an error as `attachError` or `detachError` (`field`); the
    /// gRPC `code` only while `MutableCSINodeAllocatableCount` is on.
    async fn error_status(
        &self,
        va: &VolumeAttachment,
        field: fn(VolumeError) -> Write,
        message: &str,
        code: Option<tonic::Code>,
    ) {
        let error = status::volume_error(message, Timestamp::now(), code, self.gates.error_code);
        if let Err(e) = self.write_status(va, field(error)).await {
            let name = va.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(va = name, error = %e, "Cannot record the error in the VolumeAttachment status");
        }
    }

    async fn secrets(&self, pv: &PersistentVolume) -> Result<HashMap<String, String>, String> {
        let Some(r) =
            pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| c.controller_publish_secret_ref.as_ref())
        else {
            return Ok(HashMap::new());
        };
        let (name, ns) = (r.name.clone().unwrap_or_default(), r.namespace.clone().unwrap_or_default());
        crate::k8s::secrets::secret_data(&self.client, &name, &ns).await
    }

    fn pv(&self, name: &str) -> Option<PersistentVolume> {
        self.pvs.get(&ObjectRef::new(name)).map(|p| p.to_full())
    }

    /// The volume of an attachment, from its source: the cached PV (`None`
    /// if not cached) or the inline spec. Err: the source is invalid, or
    /// the PV cannot be translated (with the step that stopped).
    /// An in-tree PV of a migrated plugin comes translated to its CSI form.
    fn volume_of(&self, va: &VolumeAttachment) -> Result<(Option<PersistentVolume>, VolumeSource), (Stop, String)> {
        let source = decide::volume_source(va).map_err(|e| (Stop::Source, e))?;
        let pv = match &source {
            VolumeSource::Pv(name) => match self.pv(name) {
                Some(pv) => Some(decide::csi_form(pv, &self.driver.name).map_err(|e| (Stop::Volume, e))?.0),
                None => None,
            },
            VolumeSource::Inline => decide::inline_volume(va),
        };
        Ok((pv, source))
    }

    /// Whether an attachment is of a migrated in-tree volume (the
    /// `migrated` metric label): an inline volume always is (only the
    /// attach-detach controller's migration creates one), a PV if its
    /// source is in-tree.
    fn is_migrated(&self, va: &VolumeAttachment) -> bool {
        match decide::volume_source(va) {
            Ok(VolumeSource::Inline) => true,
            Ok(VolumeSource::Pv(name)) => self.pvs.get(&ObjectRef::new(&name)).is_some_and(|p| {
                p.spec.as_ref().is_some_and(|s| s.csi.is_none() && s.migrated_driver() == Some(&*self.driver.name))
            }),
            Err(_) => false,
        }
    }

    /// The volume of an attachment being attached: its PV, which must exist
    /// and not be deleting, or its inline spec.
    fn volume_to_attach(&self, va: &VolumeAttachment) -> Result<(PersistentVolume, VolumeSource), (Stop, String)> {
        let (pv, source) = self.volume_of(va)?;
        let pv = match (&source, pv) {
            (VolumeSource::Pv(name), None) => {
                return Err((Stop::Volume, format!("persistentvolume \"{name}\" not found")));
            }
            (VolumeSource::Pv(name), Some(pv)) if pv.metadata.deletion_timestamp.is_some() => {
                return Err((Stop::Volume, format!("PersistentVolume {name} is marked for deletion")));
            }
            (_, Some(pv)) => pv,
            (VolumeSource::Inline, None) => return Err((Stop::Source, "the inline volume spec is gone".into())),
        };
        Ok((pv, source))
    }

    /// The finalizer and node-id annotation, unless present: one strategic
    /// merge patch without a resourceVersion (the finalizer list merges, so
    /// another controller's finalizer is kept and nothing conflicts; the
    /// finalizer is appended, see `kube::finalizers::strategic_add`).
    async fn mark_attaching(&self, va: &VolumeAttachment, node_id: &str) -> Result<(), kube::Error> {
        let has_finalizer = va.metadata.finalizers.iter().flatten().any(|f| *f == self.finalizer);
        let annotated = va.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_NODE_ID)).map(String::as_str)
            == Some(node_id);
        if has_finalizer && annotated {
            return Ok(());
        }
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let mut patch = if has_finalizer {
            serde_json::json!({"metadata": {}})
        } else {
            crate::k8s::finalizers::strategic_add(va.metadata.finalizers.as_deref(), &self.finalizer)
        };
        patch["metadata"]["annotations"] = serde_json::json!({upstream::ANN_NODE_ID: node_id});
        self.va_api().patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(|_| ())
    }

    async fn sync(&self, key: VaKey) -> Reconciled {
        let name = key.name();
        let Some(va) = self.vas.get(&key.cache_ref()).map(|v| v.to_full()) else {
            // Gone (a reconcile pass may have marked it after the deletion).
            self.forced.lock().remove(name);
            return Ok(Done::Finished);
        };
        let forced = self.forced.lock().contains(name);
        let _touch = self.settling.begin(name);
        match decide::decide_va(&va, &self.driver.name, self.handler, forced) {
            VaAction::Ignore => Ok(Done::Finished),
            VaAction::Attach if self.handler == Handler::Trivial => {
                match self.write_status(&va, Write::Attached(HashMap::new())).await {
                    Ok(()) => Ok(Done::Finished),
                    Err(e) => {
                        tracing::warn!(error = %e, "Marking attached failed");
                        Err(Wait::on(Stop::Api.waiting_for()))
                    }
                }
            }
            VaAction::Attach => crate::csi::connection::migrated_scope(self.is_migrated(&va), self.attach(&va)).await,
            VaAction::Detach => crate::csi::connection::migrated_scope(self.is_migrated(&va), self.detach(&va)).await,
        }
    }

    async fn attach(&self, va: &VolumeAttachment) -> Reconciled {
        let name = va.metadata.name.clone().unwrap_or_default();
        let fail = async |stop: Stop, msg: String, code: Option<tonic::Code>| {
            self.error_status(va, Write::AttachError, &msg, code).await;
            Err(stopped(stop, msg))
        };
        let (pv, source) = match self.volume_to_attach(va) {
            Ok(v) => v,
            Err((stop, e)) => return fail(stop, e, None).await,
        };
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let node_id = match decide::node_id(
            self.csinodes.get(&ObjectRef::new(&va.spec.node_name)).as_deref(),
            &va.spec.node_name,
            &self.driver.name,
        ) {
            Ok(id) => id,
            Err(e) => return fail(Stop::Node, e, None).await,
        };
        let mut req = match decide::publish_request(&pv, &node_id, &self.driver, &self.cfg.default_fstype) {
            Ok(r) => r,
            Err(e) => return fail(Stop::Volume, e, None).await,
        };
        // Finalizers first: from now on a detach is owed.
        if source != VolumeSource::Inline
            && let Err(e) =
                add_finalizer(&Api::<PersistentVolume>::all(self.client.clone()), &pv, &self.finalizer).await
        {
            let msg = format!("could not add PersistentVolume finalizer: {}", crate::k8s::error_text(&e));
            return fail(Stop::Api, msg, None).await;
        }
        if let Err(e) = self.mark_attaching(va, &node_id).await {
            return fail(Stop::Api, format!("could not add finalizer: {}", crate::k8s::error_text(&e)), None).await;
        }
        match self.secrets(&pv).await {
            Ok(s) => req.secrets = s,
            Err(e) => return fail(Stop::Secret, e, None).await,
        }
        let resp = self.csi.controller_publish_volume(self.cfg.timeout, req).await;
        match resp {
            Ok(r) => {
                if let Err(e) = self.write_status(va, Write::Attached(r.publish_context)).await {
                    let msg = format!("could not save the attach status: {}", crate::k8s::error_text(&e));
                    return Err(stopped(Stop::Api, msg));
                }
                self.forced.lock().remove(&name);
                tracing::info!(volume = %pv_name, node = %va.spec.node_name, "Attached");
                Ok(Done::Finished)
            }
            Err(s) => fail(Stop::Driver, compat::grpc_error_text(&s), Some(s.code())).await,
        }
    }

    async fn detach(&self, va: &VolumeAttachment) -> Reconciled {
        let name = va.metadata.name.clone().unwrap_or_default();
        let fail = async |stop: Stop, msg: String| {
            self.error_status(va, Write::DetachError, &msg, None).await;
            Err(stopped(stop, msg))
        };
        let csinode = self.csinodes.get(&ObjectRef::new(&va.spec.node_name));
        let node_id = match decide::detach_node_id(va, csinode.as_deref(), &self.driver.name) {
            Ok(id) => id,
            Err(e) => return fail(Stop::Node, e).await,
        };
        // A PV being deleted is still detached (its finalizer holds it).
        let pv = match self.volume_of(va) {
            Ok((pv, _)) => pv,
            Err((stop, e)) => return fail(stop, e).await,
        };
        let volume_id = pv.as_ref().and_then(|p| p.spec.as_ref()?.csi.as_ref().map(|c| c.volume_handle.clone()));
        let Some(volume_id) = volume_id else {
            return fail(Stop::Volume, "cannot find the volume handle: the PersistentVolume is gone".into()).await;
        };
        // Upstream fails the detach when the secret cannot be read: a driver
        // must never be asked to unpublish with credentials missing.
        let secrets = match &pv {
            Some(p) => match self.secrets(p).await {
                Ok(s) => s,
                Err(e) => return fail(Stop::Secret, e).await,
            },
            None => HashMap::new(),
        };
        let req = csi::ControllerUnpublishVolumeRequest { volume_id, node_id, secrets };
        let resp = self.csi.controller_unpublish_volume(self.cfg.timeout, req).await;
        if let Err(s) = resp {
            return fail(Stop::Driver, compat::grpc_error_text(&s)).await;
        }
        if let Err(e) = crate::k8s::finalizers::remove(&self.va_api(), va, &self.finalizer).await {
            return Err(stopped(Stop::Api, format!("could not remove finalizer: {}", crate::k8s::error_text(&e))));
        }
        let _ = self.write_status(va, Write::Detached).await;
        self.forced.lock().remove(&name);
        if let Some(pv) = va.spec.source.persistent_volume_name.clone() {
            self.pv_queue.add(PvKey::named(pv));
        }
        tracing::info!("Detached");
        Ok(Done::Finished)
    }

    async fn sync_pv(&self, key: PvKey) -> Reconciled {
        let name = key.name();
        let Some(pv) = self.pv(name) else { return Ok(Done::Finished) };
        let referenced = !self.vas.by_index(crate::modules::views::VA_BY_PV, name).is_empty();
        if !decide::pv_finalizer_removable(&pv, referenced, &self.finalizer, &self.driver.name) {
            let version = pv.metadata.resource_version.as_deref().unwrap_or_default();
            tracing::debug!(resource_version = %version, referenced, "PersistentVolume finalizer kept");
            // Done, but a PV held only by its attachments waits for their
            // deletion (which queues it again).
            return Ok(match waiting::pv_waiting(&pv, referenced, &self.finalizer, &self.driver.name) {
                Some(w) => Done::Parked(w),
                None => Done::Finished,
            });
        }
        match crate::k8s::finalizers::remove(&Api::<PersistentVolume>::all(self.client.clone()), &pv, &self.finalizer)
            .await
        {
            Ok(()) => Ok(Done::Finished),
            Err(e) => Err(stopped(
                Stop::Api,
                format!("could not remove PersistentVolume finalizer: {}", crate::k8s::error_text(&e)),
            )),
        }
    }
}

async fn add_finalizer(api: &Api<PersistentVolume>, pv: &PersistentVolume, finalizer: &str) -> Result<(), kube::Error> {
    crate::k8s::finalizers::add(api, pv, finalizer).await
}

/// The module's entry points for the host.
impl Module for AttacherFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        AttacherFlags::validate(self).map(|_| ()).map_err(|message| ModuleError::Config { module: NAME, message })
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Runs the attacher until shutdown (or until its Lease is lost).
pub async fn run(cfg: AttacherFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(NAME, ctx)?.retrying(Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max });
    let gates = cfg.validate().map_err(|message| kit.config_error(message))?;
    // One connection for the process: the cap holds for every module's responses.
    kit.ctx.csi.set_max_response_log_length(cfg.max_grpc_log_length);
    let Some(driver) = kit.driver().await else { return Ok(()) };
    let handler = decide::handler(&driver);
    tracing::info!(driver = %driver.name, ?handler, "Attacher starting");
    let informers = &kit.kube.informers;
    let va_inf = crate::modules::views::driver_vas(informers, &driver.name);
    let pv_inf = crate::modules::views::driver_pvs(informers, &driver.name);
    let csinode_inf = informers.get::<CSINode>();

    let attach = kit.queue::<VolumeAttachment>(upstream::QUEUE_ATTACH);
    // Its own workers (a pile of failing detaches cannot starve attaches),
    // but never at the same time as an attach of the same attachment.
    let queues =
        Queues { detach: kit.sibling(&attach, upstream::QUEUE_DETACH), pv: kit.queue(upstream::QUEUE_PV), attach };
    let forced = Forced::default();
    let finalizer = upstream::finalizer(&driver.name);
    {
        let (queues, finalizer, forced) = (queues.clone(), finalizer.clone(), forced.clone());
        va_inf.on_change_with_resync(cfg.resync, &kit.ctx.shutdown, move |c| {
            queues.va_changed(c, &finalizer, &forced);
        });
    }
    {
        let (pv_q, finalizer) = (queues.pv.clone(), finalizer.clone());
        pv_inf.on_change_with_resync(cfg.resync, &kit.ctx.shutdown, move |c| {
            let key = PvKey::of(&c.object().metadata);
            if c.is_deleted() {
                pv_q.untrack(&key);
            } else if c.object().metadata.finalizers.iter().flatten().any(|f| *f == finalizer) {
                pv_q.add(key);
            }
        });
    }
    informers.start(&kit.ctx.process);
    let reconciles = handler == Handler::Csi
        && driver.has_controller_capability(Rpc::ListVolumes)
        && driver.has_controller_capability(Rpc::ListVolumesPublishedNodes);
    let a = Arc::new(Attacher {
        finalizer,
        handler,
        csi: kit.ctx.csi.clone(),
        client: kit.kube.client.clone(),
        vas: va_inf.store(),
        pvs: pv_inf.store(),
        csinodes: csinode_inf.store(),
        forced,
        settling: settling::Settling::new(reconciles),
        pv_queue: queues.pv.clone(),
        driver: driver.clone(),
        cfg,
        gates,
    });
    // Lease name: upstream's for this module.
    kit.lead(&upstream::lease_lock_name(&driver.name), move |mut crew| async move {
        if !crew
            .synced("attaching", async { tokio::join!(va_inf.synced(), pv_inf.synced(), csinode_inf.synced()) })
            .await
        {
            return;
        }
        let workers = a.cfg.worker_threads;
        crew.serve(&queues.attach, workers, &a, |a, key| async move { a.sync(key).await });
        crew.serve(&queues.detach, workers, &a, |a, key| async move { a.sync(key).await });
        crew.serve(&queues.pv, workers, &a, |a, key| async move { a.sync_pv(key).await });
        if reconciles {
            let (a, token, queues) = (a.clone(), crew.token().clone(), queues.clone());
            crew.spawn(async move {
                let mut tick = tokio::time::interval(a.cfg.reconcile_sync);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tick.tick() => a.reconcile(&queues.attach, &queues.detach, &token).await,
                    }
                }
            });
        }
        crew.run().await;
    })
    .await
}

#[cfg(test)]
mod tests;
