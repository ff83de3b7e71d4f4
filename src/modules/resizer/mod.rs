//! resizer: external-resizer parity (volume expansion and modification).
//!
//! Bound claims of the driver whose request grew get `ControllerExpandVolume`
//! (or, with a driver that only expands on the node, the trivial resizer:
//! no call, the kubelet finishes), the PV's new capacity and upstream's
//! status fields, conditions, annotations and events ([`expand`]); claims
//! whose VolumeAttributesClass changed get `ControllerModifyVolume`
//! ([`modify`]). Decisions are in [`decide`]; this file holds what both
//! share (the state, the API writes, events) and the wiring: views of the
//! shared cache (bound claims, the driver's PVs, pods only for an
//! offline-only driver, classes only for the modify controller), the resize
//! queue `<driver>-pvc` and its sibling `<driver>-pvc-modify`, CSI calls
//! through the shared connection, and the Lease `external-resizer-<driver>`.

pub mod conditions;
pub mod config;
pub mod decide;
mod expand;
mod feed;
mod modify;
pub mod waiting;

use parking_lot::Mutex;
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::VolumeAttributesClass,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use tokio_util::sync::CancellationToken;

use crate::{
    compat::resizer as upstream,
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{controller_service_capability::rpc::Type as Rpc, node_service_capability, plugin_capability},
    },
    debug::WaitingFor,
    k8s::{
        cache::Cache,
        cached::{CachedPod, CachedPv, CachedPvc},
        events::{EventType, Recorder, reference},
        informers::{Change, Informer, Informers},
        key::ObjectKey,
        own_writes::OwnWrites,
        queue::{Backoff, WorkQueue},
    },
    modules::{
        contract::{Module, ModuleContext, ModuleError},
        kit::{Crew, Kit, Reconciled, Wait},
    },
};

/// The key of a claim's resize or modify sync.
type ClaimKey = ObjectKey<PersistentVolumeClaim>;
use config::{Gates, ResizerFlags};

const NAME: &str = "resizer";

/// How the driver expands volumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expander {
    /// `ControllerExpandVolume`.
    Csi,
    /// Only the node expands: no call, node expansion always required.
    Trivial,
}

/// Keys with the time they were added, forgotten after a retention.
#[derive(Default)]
struct SlowSet(Mutex<HashMap<String, Instant>>);

impl SlowSet {
    /// Time left for `key`, if it is (still) in the set.
    fn remaining(&self, key: &str, retention: Duration) -> Option<Duration> {
        let mut set = self.0.lock();
        let left = set.get(key).and_then(|t| retention.checked_sub(t.elapsed())).filter(|d| !d.is_zero());
        if left.is_none() {
            set.remove(key);
        }
        left
    }
    fn add(&self, key: &str) {
        self.0.lock().entry(key.to_string()).or_insert_with(Instant::now);
    }
    fn remove(&self, key: &str) {
        self.0.lock().remove(key);
    }
}

fn set_of(m: &Mutex<HashSet<String>>) -> parking_lot::MutexGuard<'_, HashSet<String>> {
    m.lock()
}

struct Resizer {
    cfg: ResizerFlags,
    gates: Gates,
    driver: Arc<DriverInfo>,
    expander: Expander,
    csi: Connection,
    client: Client,
    events: Recorder,
    claims: Cache<CachedPvc>,
    pvs: Cache<CachedPv>,
    /// Pods using claims, when the driver expands offline only and
    /// `--handle-volume-inuse-error` is on.
    pods: Option<Cache<CachedPod>>,
    /// Claims (by key) whose last expansion failed finally in this process.
    final_errors: Mutex<HashSet<String>>,
    /// Claims (by key) whose size was infeasible.
    slow: SlowSet,
    /// Claims (by UID) whose expansion failed with FailedPrecondition.
    in_use_errors: feed::InUseErrors,
    /// The modify controller's state, when it runs.
    modify: Option<ModifyState>,
    /// Claim versions our own status writes replaced: a sync that finds one
    /// in the cache waits for the watch to bring our newer write.
    own_writes: OwnWrites,
}

/// What the modify controller keeps.
struct ModifyState {
    vacs: Cache<VolumeAttributesClass>,
    /// Claims (by key) whose class may still be applying on the backend.
    uncertain: Mutex<HashSet<String>>,
    /// Claims (by key) whose class was infeasible.
    slow: SlowSet,
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Resizer {
    fn pvc_api(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn pv_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn event(&self, pvc: &PersistentVolumeClaim, kind: EventType, reason: &str, message: &str) {
        self.events.publish(reference(pvc), kind, reason, message);
    }

    /// The claim as the apiserver returned it after the patch. A strategic
    /// merge patch: the conditions merge by type ([`conditions`]), so only
    /// the ones decided on change, against the claim as it is now.
    async fn patch_status(
        &self,
        pvc: &PersistentVolumeClaim,
        patch: serde_json::Value,
    ) -> Result<PersistentVolumeClaim, kube::Error> {
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        let written = self.pvc_api(ns).patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await?;
        self.own_writes.wrote(
            &decide::claim_key(&pvc.metadata),
            pvc.metadata.resource_version.as_deref(),
            written.metadata.resource_version.as_deref(),
        );
        Ok(written)
    }

    /// If the cached `pvc` is a version our own status write replaced, the
    /// sync stops here with the claim still owed: it is synced again after
    /// `--retry-interval-start` (its backoff kept). The event of the newer
    /// version does not always queue it: a write of the other controller
    /// (the modify sync's, seen by the resize queue) changes nothing its
    /// handler looks at.
    fn superseded_by_own_write(&self, key: &str, pvc: &PersistentVolumeClaim) -> Option<Reconciled> {
        if !self.own_writes.is_stale(key, pvc.metadata.resource_version.as_deref()) {
            return None;
        }
        tracing::debug!("Cached claim predates our own write; syncing again once the watch brings it");
        Some(Err(Wait::on(WaitingFor::Retry).after(self.cfg.retry_interval_start)))
    }

    async fn patch_pv(&self, name: &str, patch: serde_json::Value) -> Result<(), kube::Error> {
        self.pv_api().patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(|_| ())
    }
}

/// The expander for the driver (upstream's `NewResizerFromClient`): Err is
/// upstream's fatal start-up error.
async fn expander(ctx: &ModuleContext, driver: &DriverInfo, timeout: Duration) -> Result<Option<Expander>, String> {
    if !driver.has_plugin_service(plugin_capability::service::Type::ControllerService) {
        return Err("CSI driver does not support controller service".into());
    }
    if driver.has_controller_capability(Rpc::ExpandVolume) {
        return Ok(Some(Expander::Csi));
    }
    let node = ctx.csi.node_get_capabilities(timeout).await;
    let node_expands = node.is_ok_and(|r| {
        r.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(node_service_capability::Type::Rpc(r))
                if r.r#type == node_service_capability::rpc::Type::ExpandVolume as i32)
        })
    });
    if node_expands {
        tracing::info!("The CSI driver supports node resize only, using trivial resizer to handle resize requests");
        return Ok(Some(Expander::Trivial));
    }
    Ok(None)
}

/// Whether the driver can expand only volumes not in use: it does not
/// advertise ONLINE expansion.
fn offline_only(driver: &DriverInfo) -> bool {
    use plugin_capability::{Type, volume_expansion::Type as Exp};
    !driver
        .plugin_capabilities
        .iter()
        .any(|c| matches!(&c.r#type, Some(Type::VolumeExpansion(v)) if v.r#type == Exp::Online as i32))
}

/// The module's entry points for the host.
impl Module for ResizerFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        ResizerFlags::validate(self).map(|_| ()).map_err(|message| ModuleError::Config { module: NAME, message })
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn master(&self) -> Option<&str> {
        self.master.as_deref()
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Runs the resizer until shutdown (or until its Lease is lost).
pub async fn run(cfg: ResizerFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(NAME, ctx)?.retrying(Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max });
    let fatal = |message: String| kit.fatal(message);
    let gates = cfg.validate().map_err(|message| kit.config_error(message))?;
    let Some(driver) = kit.driver().await else { return Ok(()) };
    let (ctx, kube) = (&kit.ctx, &kit.kube);
    let expander = expander(ctx, &driver, cfg.timeout).await.map_err(fatal)?;
    let mut gates = gates;
    if !gates.volume_attributes_class_explicit && !crate::k8s::discovery::vac_served(&kube.client).await {
        tracing::info!(
            "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass API is not served by the apiserver"
        );
        gates.volume_attributes_class = false;
    }
    let modifies = gates.volume_attributes_class && driver.has_controller_capability(Rpc::ModifyVolume);
    if expander.is_none() && !modifies {
        return Err(kit.config_error("CSI driver does not support resize nor modify"));
    }
    let watch_pods = cfg.handle_volume_inuse_error && expander == Some(Expander::Csi) && offline_only(&driver);
    let wiring = Wiring::new(&kit, &driver.name, modifies, watch_pods);
    tracing::info!(driver = %driver.name, ?expander, modifies, watch_pods, ?gates, "Resizer starting");

    let in_use_errors = feed::InUseErrors::default();
    wiring.add_handlers(&cfg, &ctx.shutdown, expander.is_some(), gates.recover, &in_use_errors);
    kube.informers.start(&ctx.process);
    let r = Arc::new(Resizer {
        gates,
        expander: expander.unwrap_or(Expander::Trivial),
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        events: kit.recorder(&upstream::event_component(&driver.name)),
        claims: wiring.claims.store(),
        pvs: wiring.pvs.store(),
        pods: wiring.pods.as_ref().map(|p| p.store()),
        final_errors: Mutex::default(),
        slow: SlowSet::default(),
        in_use_errors,
        own_writes: OwnWrites::default(),
        modify: wiring.vacs.as_ref().map(|v| ModifyState {
            vacs: v.store(),
            uncertain: Mutex::default(),
            slow: SlowSet::default(),
        }),
        driver: driver.clone(),
        cfg,
    });
    let expands = expander.is_some();
    kit.lead(&upstream::lease_lock_name(&driver.name), move |crew| wiring.lead(r, expands, crew)).await
}

/// What the resizer watches and queues: its views of the shared cache and
/// its two sibling queues.
struct Wiring {
    claims: Informer<CachedPvc>,
    pvs: Informer<CachedPv>,
    /// Pods using claims: only for an offline-only driver with
    /// `--handle-volume-inuse-error`.
    pods: Option<Informer<CachedPod>>,
    /// The classes: only when the modify controller runs.
    vacs: Option<Informer<VolumeAttributesClass>>,
    /// `<driver>-pvc`.
    resize: WorkQueue<ClaimKey>,
    /// `<driver>-pvc-modify`.
    modify: WorkQueue<ClaimKey>,
}

impl Wiring {
    fn new(kit: &Kit, driver: &str, modifies: bool, watch_pods: bool) -> Self {
        let informers: &Informers = &kit.kube.informers;
        let claims = crate::modules::views::bound_claims(informers, driver, decide::claim_may_be_for_driver);
        let pvs = crate::modules::views::driver_pvs(informers, driver);
        let vacs = modifies.then(|| informers.get::<VolumeAttributesClass>());
        let pods = watch_pods.then(|| crate::modules::views::pods_using_claims(informers));
        // One queue per process and driver: the name lives as long as the process.
        let queue_name: &'static str = Box::leak(upstream::queue_resize(driver).into_boxed_str());
        let resize = kit.queue::<PersistentVolumeClaim>(queue_name);
        // The modify queue has its own workers and metrics name, and never runs
        // a claim while the resize queue does (sibling queues).
        let modify_name: &'static str = Box::leak(upstream::queue_modify(driver).into_boxed_str());
        let modify = kit.sibling(&resize, modify_name);
        Wiring { claims, pvs, pods, vacs, resize, modify }
    }

    /// The change handlers feeding the queues: claims to the modify queue
    /// (when it runs) and to the resize queue (when the driver expands),
    /// ended pods and new PVs to the queues of their claims.
    fn add_handlers(
        &self,
        cfg: &ResizerFlags,
        shutdown: &CancellationToken,
        expands: bool,
        recover: bool,
        in_use_errors: &feed::InUseErrors,
    ) {
        // The classes are watched only when the modify controller runs.
        let modifies = self.vacs.is_some();
        if modifies {
            let q = self.modify.clone();
            self.claims.on_change_with_resync(cfg.resync_period, shutdown, move |c| {
                let key = ClaimKey::of(&c.object().metadata);
                match c {
                    Change::Deleted(_) => {
                        q.forget(&key);
                        q.untrack(&key);
                    }
                    Change::Updated { old, new } if !decide::modify_update_needs_sync(old, new) => {}
                    _ => q.add(key),
                }
            });
        }
        if expands {
            let (q, in_use) = (self.resize.clone(), in_use_errors.clone());
            self.claims.on_change_with_resync(cfg.resync_period, shutdown, move |c| {
                feed::resize_claim_changed(c, &q, recover, &in_use);
            });
        }
        if let Some(pods) = &self.pods {
            // A pod that ends or goes lets a held-back claim expand.
            let q = self.resize.clone();
            pods.on_change(shutdown, move |c| {
                let p = c.object();
                if c.is_deleted() {
                    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                    for claim in p.claims.iter() {
                        q.add(ClaimKey::namespaced(ns, claim.as_str()));
                    }
                }
            });
        }
        // A claim synced before its PV was cached is synced again when the PV comes.
        let (resize, modify) = (expands.then(|| self.resize.clone()), modifies.then(|| self.modify.clone()));
        self.pvs.on_change(shutdown, move |c| {
            if let Change::Added(pv) = c
                && let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_deref())
                && let (Some(ns), Some(name)) = (r.namespace.as_deref(), r.name.as_deref())
            {
                for q in resize.iter().chain(modify.iter()) {
                    q.add(ClaimKey::namespaced(ns, name));
                }
            }
        });
    }

    async fn synced(&self) {
        tokio::join!(
            self.claims.synced(),
            self.pvs.synced(),
            async {
                if let Some(p) = &self.pods {
                    p.synced().await
                }
            },
            async {
                if let Some(v) = &self.vacs {
                    v.synced().await
                }
            }
        );
    }

    /// The leader's work: once the caches are synced, the workers of the
    /// resize queue (when the driver expands) and of the modify queue (when
    /// it runs), until the crew stops.
    async fn lead(self, r: Arc<Resizer>, expands: bool, mut crew: Crew) {
        if !crew.synced("resizing", self.synced()).await {
            return;
        }
        r.recall_in_progress();
        let workers = r.cfg.workers;
        if r.modify.is_none() || expands {
            crew.serve(&self.resize, workers, &r, |r, key| async move { r.sync(key).await });
        }
        if r.modify.is_some() {
            crew.serve(&self.modify, workers, &r, |r, key| async move { r.sync_modify(key).await });
        }
        crew.run().await;
    }
}

#[cfg(test)]
mod tests;
