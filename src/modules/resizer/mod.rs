//! resizer: external-resizer parity (volume expansion).
//!
//! Bound claims of the driver whose request grew get `ControllerExpandVolume`
//! (or, with a driver that only expands on the node, the trivial resizer:
//! no call, the kubelet finishes), the PV's new capacity and upstream's
//! status fields, conditions, annotations and events. Decisions are in
//! [`decide`]; this file does the I/O: views of the shared cache (bound
//! claims, the driver's PVs, and pods only for an offline-only driver), the
//! resize queue `<driver>-pvc`, CSI calls through the shared connection,
//! events, and the Lease `external-resizer-<driver>`.

pub mod conditions;
pub mod config;
pub mod decide;
mod feed;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ::kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};
use k8s_openapi::{
    api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::VolumeAttributesClass,
    },
    jiff::Timestamp,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    compat::{self, modifier as mo, resizer as up},
    csi::{
        Connection, DriverInfo,
        proto::csi::v1::{controller_service_capability::rpc::Type as Rpc, node_service_capability, plugin_capability},
    },
    kube::{
        KubeContext,
        cache::Cache,
        cached::{CachedPod, CachedPv, CachedPvc},
        events::{EventType, Recorder, reference},
        informers::Change,
        queue::{Backoff, Outcome, WorkQueue},
    },
    modules::{ModuleContext, ModuleError},
};
use config::{Gates, ResizerFlags};
use decide::{Failure, Memory, ModifyStep, Step};

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
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let left = set.get(key).and_then(|t| retention.checked_sub(t.elapsed())).filter(|d| !d.is_zero());
        if left.is_none() {
            set.remove(key);
        }
        left
    }
    fn add(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_insert_with(Instant::now);
    }
    fn remove(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

fn set_of(m: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
}

/// What the modify controller keeps.
struct ModifyState {
    vacs: Cache<VolumeAttributesClass>,
    /// Claims (by key) whose class may still be applying on the backend.
    uncertain: Mutex<HashSet<String>>,
    /// Claims (by key) whose class was infeasible.
    slow: SlowSet,
}

fn is_status(e: &::kube::Error, code: u16) -> bool {
    matches!(e, ::kube::Error::Api(s) if s.code == code)
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
    ) -> Result<PersistentVolumeClaim, ::kube::Error> {
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        self.pvc_api(ns).patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await
    }

    async fn patch_pv(&self, name: &str, patch: serde_json::Value) -> Result<(), ::kube::Error> {
        self.pv_api().patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(|_| ())
    }

    /// Whether a non-terminated pod uses the claim (only tracked with the pod view).
    fn in_use(&self, pvc: &PersistentVolumeClaim) -> bool {
        let Some(pods) = &self.pods else { return false };
        let (ns, name) = (pvc.metadata.namespace.as_deref(), pvc.metadata.name.as_deref().unwrap_or_default());
        crate::modules::views::claim_in_use(pods, ns, name)
    }

    fn forget(&self, key: &str) {
        set_of(&self.final_errors).remove(key);
        self.slow.remove(key);
    }

    async fn sync(&self, key: String) -> Outcome {
        let (ns, name) = key.split_once('/').unwrap_or(("", &key));
        let Some(cached) = self.claims.get_named(Some(ns), name) else {
            self.forget(&key);
            return Outcome::Done;
        };
        let pvc = cached.to_full();
        let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()) else {
            return Outcome::Done;
        };
        let pv = self.pvs.get(&ObjectRef::new(&pv_name)).map(|p| p.to_full());
        let sizes = match decide::sizes(&pvc, pv.as_ref()) {
            Ok(Some(s)) => s,
            Ok(None) => return Outcome::Done,
            Err(e) => {
                // Bad input: said once per change (a fix re-queues the claim).
                tracing::warn!(error = %e, "Cannot read the claim's sizes");
                self.event(&pvc, EventType::Warning, up::REASON_RESIZE_FAILED, &e.to_string());
                return Outcome::Done;
            }
        };
        let Some(pv) = pv else {
            // Not one of the driver's PVs, or gone (the claim is then
            // Lost, but still asks for more). A claim annotated for the
            // driver is told so and retried.
            if decide::resize_asked_without_volume(&pvc, &sizes) && annotated_for(&pvc, &self.driver.name) {
                let msg = format!("PersistentVolume {pv_name} of claim {key} not found; cannot resize");
                tracing::warn!(pv = %pv_name, "{msg}");
                self.event(&pvc, EventType::Warning, up::REASON_RESIZE_FAILED, &msg);
                return Outcome::Retry;
            }
            tracing::debug!(pv = %pv_name, "PV not among the driver's; ignoring the claim");
            return Outcome::Done;
        };
        if self.gates.annotate_fs_resize
            && decide::pre_resize_annotation_stale(&pv, &sizes)
            && let Err(e) = self.patch_pv(&pv_name, decide::pv_annotation_removal()).await
        {
            tracing::warn!(pv = %pv_name, error = %e, "Removing the pre-resize annotation failed");
            return Outcome::Retry;
        }
        if !decide::needs_resize(&pvc, &sizes) {
            tracing::trace!("No resize needed");
            return Outcome::Done;
        }
        if !decide::pv_is_ours(&pv, &pvc, &self.driver.name) {
            tracing::debug!(pv = %pv_name, "PV is not this driver's volume of this claim");
            return Outcome::Done;
        }
        let (target, update_status) = if self.gates.recover {
            let slow = self.slow.remaining(&key, self.cfg.retry_interval_max);
            if decide::allocation_state(&pvc) == Some(up::CONTROLLER_RESIZE_INFEASIBLE) {
                self.slow.add(&key);
            }
            let memory = Memory {
                final_error: set_of(&self.final_errors).contains(&key),
                slow: slow.is_some(),
                controller_expansion: self.expander == Expander::Csi,
            };
            match decide::plan(&pvc, &sizes, memory) {
                Step::Skip => return Outcome::Done,
                Step::HeldBack => {
                    let left = slow.unwrap_or(self.cfg.retry_interval_max);
                    tracing::info!(retry_in = ?left, "{}", up::text_infeasible_skipped(&key));
                    return Outcome::RetryAfter(left);
                }
                Step::Expand { target, update_status } => (target, update_status),
            }
        } else {
            (sizes.spec, false)
        };
        let patch = decide::in_progress_patch(&pvc, target, update_status, self.gates.recover, Timestamp::now());
        // From here on the claim as written (its conditions are the base of the next patches).
        let pvc = match self.patch_status(&pvc, patch).await {
            Ok(written) => written,
            Err(e) => {
                // A conflict: the cache is behind our own or the user's write;
                // the newer version re-queues the claim.
                if is_status(&e, 409) {
                    tracing::debug!("Claim changed meanwhile; syncing again");
                } else {
                    tracing::warn!(error = %e, "Marking the resize in progress failed");
                }
                return Outcome::Retry;
            }
        };
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        if set_of(&self.in_use_errors).contains(&uid) && self.in_use(&pvc) {
            let msg = up::text_in_use(&key, &self.driver.name);
            tracing::info!("{msg}");
            self.event(&pvc, EventType::Warning, up::REASON_RESIZE_FAILED, &msg);
            return Outcome::Retry;
        }
        self.event(&pvc, EventType::Normal, up::REASON_RESIZING, &up::text_resizing(&pv_name));
        set_of(&self.in_use_errors).remove(&uid);
        match self.expand(&pv, target).await {
            Ok((new_size, node_required)) => self.expanded(&key, &pvc, &pv, new_size, node_required).await,
            Err((code, err)) => self.failed(&key, &pvc, &pv_name, code, &err).await,
        }
    }

    /// The driver's call (or the trivial answer): the new size and whether
    /// the node must finish. Err: the gRPC code (if any) and the error text.
    async fn expand(&self, pv: &PersistentVolume, target: i64) -> Result<(i64, bool), (Option<tonic::Code>, String)> {
        if self.expander == Expander::Trivial {
            return Ok((target, true));
        }
        let (pv, migrated) = decide::csi_form(pv, &self.driver.name).map_err(|e| (None, e))?;
        let smw = self.driver.has_controller_capability(Rpc::SingleNodeMultiWriter);
        let mut req = decide::expand_request(&pv, target, smw).map_err(|e| (None, e.to_string()))?;
        if let Some(r) =
            pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| c.controller_expand_secret_ref.as_ref())
        {
            let (name, ns) = (r.name.clone().unwrap_or_default(), r.namespace.clone().unwrap_or_default());
            req.secrets = crate::kube::secrets::secret_data(&self.client, &name, &ns).await.map_err(|e| (None, e))?;
        }
        let call = self.csi.controller_expand_volume(self.cfg.timeout, req);
        let resp = crate::csi::connection::migrated_scope(migrated, call)
            .await
            .map_err(|s| (Some(s.code()), compat::grpc_error_text(&s)))?;
        let size = decide::checked_capacity(target, resp.capacity_bytes).map_err(|e| (None, e))?;
        Ok((size, resp.node_expansion_required))
    }

    async fn expanded(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        new_size: i64,
        node_required: bool,
    ) -> Outcome {
        self.forget(key);
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let patch = decide::pv_patch(pv, pvc, new_size, node_required, self.gates.annotate_fs_resize);
        if let Err(e) = self.patch_pv(&pv_name, patch).await {
            tracing::warn!(pv = %pv_name, error = %e, "Updating the PV capacity failed");
            return Outcome::Retry;
        }
        let patch = decide::success_patch(pvc, new_size, node_required, self.gates.recover, Timestamp::now());
        if let Err(e) = self.patch_status(pvc, patch).await {
            tracing::warn!(error = %e, "Updating the claim status failed");
            return Outcome::Retry;
        }
        if node_required {
            tracing::info!(pv = %pv_name, size = new_size, "Volume expanded; the node must finish");
            self.event(pvc, EventType::Normal, up::REASON_FS_RESIZE_REQUIRED, up::TEXT_FS_RESIZE_REQUIRED);
        } else {
            tracing::info!(pv = %pv_name, size = new_size, "Volume expanded");
            self.event(pvc, EventType::Normal, up::REASON_RESIZE_SUCCESSFUL, up::TEXT_RESIZE_SUCCESSFUL);
        }
        Outcome::Done
    }

    async fn failed(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        pv_name: &str,
        code: Option<tonic::Code>,
        err: &str,
    ) -> Outcome {
        if code == Some(tonic::Code::FailedPrecondition) && self.pods.is_some() {
            set_of(&self.in_use_errors).insert(pvc.metadata.uid.clone().unwrap_or_default());
        }
        let failure = decide::classify(code);
        tracing::warn!(pv = %pv_name, error = %err, ?failure, "Expansion failed");
        match failure {
            Failure::Uncertain => {
                self.forget(key);
            }
            Failure::Final | Failure::Infeasible => {
                set_of(&self.final_errors).insert(key.to_string());
                if failure == Failure::Final {
                    self.slow.remove(key);
                }
                if self.gates.recover {
                    let patch = decide::failure_patch(pvc, err, failure == Failure::Infeasible, Timestamp::now());
                    if let Err(e) = self.patch_status(pvc, patch).await
                        && !is_status(&e, 404)
                    {
                        tracing::warn!(error = %e, "Recording the expansion error failed");
                    }
                }
            }
        }
        let text = up::text_resize_failed(pv_name, &self.driver.name, err);
        self.event(pvc, EventType::Warning, up::REASON_RESIZE_FAILED, &text);
        Outcome::Retry
    }
}

impl Resizer {
    async fn sync_modify(&self, key: String) -> Outcome {
        let Some(m) = &self.modify else { return Outcome::Done };
        let (ns, name) = key.split_once('/').unwrap_or(("", &key));
        let Some(cached) = self.claims.get_named(Some(ns), name) else {
            set_of(&m.uncertain).remove(&key);
            m.slow.remove(&key);
            return Outcome::Done;
        };
        let pvc = cached.to_full();
        let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()) else {
            return Outcome::Done;
        };
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Outcome::Done;
        }
        let Some(pv) = self.pvs.get(&ObjectRef::new(&pv_name)).map(|p| p.to_full()) else {
            tracing::debug!(pv = %pv_name, "PV not among the driver's; no modification");
            return Outcome::Done;
        };
        if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none_or(|c| *c.driver != *self.driver.name) {
            return Outcome::Done;
        }
        let slow = match decide::modify_infeasible_same_target(&pvc) {
            Some(true) => {
                let was = m.slow.remaining(&key, self.cfg.retry_interval_max).is_some();
                m.slow.add(&key);
                was
            }
            Some(false) => {
                m.slow.remove(&key);
                false
            }
            None => false,
        };
        let uncertain = set_of(&m.uncertain).contains(&key);
        let pvc_name = pvc.metadata.name.clone().unwrap_or_default();
        let (pvc, target) = match decide::plan_modify(&pvc, uncertain, slow) {
            ModifyStep::Nothing => return Outcome::Done,
            ModifyStep::HeldBack => {
                tracing::info!("{}", mo::text_infeasible_skipped(&key));
                return Outcome::Retry;
            }
            ModifyStep::Rollback { had_condition } => {
                if !had_condition {
                    return Outcome::Done;
                }
                if let Err(e) = self.patch_status(&pvc, decide::modify_rollback_patch(&pvc)).await {
                    tracing::warn!(error = %e, "Removing the ModifyingVolume condition failed");
                    return Outcome::Retry;
                }
                self.event(&pvc, EventType::Normal, mo::REASON_MODIFY_CANCELED, mo::TEXT_CANCELED);
                return Outcome::Done;
            }
            ModifyStep::Resume { target } => (pvc, target),
            ModifyStep::Start { target } => {
                let vac = m.vacs.get(&ObjectRef::new(&target));
                let problem = match &vac {
                    None => Some(mo::text_vac_missing(&target)),
                    Some(v) if v.driver_name != *self.driver.name => Some(format!(
                        "VAC \"{target}\" is for driver {}, not {}; not modifying",
                        v.driver_name, self.driver.name
                    )),
                    Some(_) => None,
                };
                if let Some(msg) = problem {
                    // Pending until the user changes the class (upstream
                    // does not retry either: the write ends the sync).
                    tracing::warn!(vac = %target, "{msg}");
                    self.event(&pvc, EventType::Warning, mo::REASON_MODIFY_FAILED, &msg);
                    return match self.patch_status(&pvc, decide::modify_pending_patch(&pvc)).await {
                        Ok(_) => Outcome::Done,
                        Err(e) => {
                            tracing::warn!(error = %e, "Marking the modification pending failed");
                            Outcome::Retry
                        }
                    };
                }
                let patch = decide::modify_in_progress_patch(&pvc, &target, Timestamp::now());
                let written = match self.patch_status(&pvc, patch).await {
                    Ok(w) => w,
                    // A conflict: the cache was behind; the newer version
                    // re-queues the claim, and no call was made.
                    Err(e) if is_status(&e, 409) => {
                        tracing::debug!("Claim changed meanwhile; syncing again");
                        return Outcome::Retry;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Marking the modification in progress failed");
                        return Outcome::Retry;
                    }
                };
                self.event(&written, EventType::Normal, mo::REASON_MODIFY, &mo::text_modifying(&pvc_name, &target));
                (written, target)
            }
        };
        let Some(vac) = m.vacs.get(&ObjectRef::new(&target)) else {
            self.event(&pvc, EventType::Warning, mo::REASON_MODIFY_FAILED, &mo::text_vac_missing(&target));
            return Outcome::Retry;
        };
        let mut req = match decide::modify_request(&pv, &pvc, vac.parameters.as_ref(), self.cfg.extra_modify_metadata) {
            Ok(r) => r,
            Err(e) => {
                self.event(&pvc, EventType::Warning, mo::REASON_MODIFY_FAILED, &e.to_string());
                return Outcome::Retry;
            }
        };
        if let Some((name, ns)) = decide::modify_secret_ref(&pv) {
            match crate::kube::secrets::secret_data(&self.client, &name, &ns).await {
                Ok(s) => req.secrets = s,
                Err(e) => {
                    self.event(&pvc, EventType::Warning, mo::REASON_MODIFY_FAILED, &e);
                    return Outcome::Retry;
                }
            }
        }
        let resp = self.csi.controller_modify_volume(self.cfg.timeout, req).await;
        match resp {
            Ok(_) => {
                set_of(&m.uncertain).remove(&key);
                m.slow.remove(&key);
                if let Err(e) = self.patch_pv(&pv_name, decide::pv_vac_patch(&target)).await {
                    tracing::warn!(pv = %pv_name, error = %e, "Recording the class on the PV failed");
                    return Outcome::Retry;
                }
                if let Err(e) = self.patch_status(&pvc, decide::modify_success_patch(&pvc, &target)).await {
                    tracing::warn!(error = %e, "Recording the class on the claim failed");
                    return Outcome::Retry;
                }
                tracing::info!(vac = %target, "Volume modified");
                self.event(
                    &pvc,
                    EventType::Normal,
                    mo::REASON_MODIFY_SUCCESSFUL,
                    &mo::text_modified(&pvc_name, &target),
                );
                Outcome::Done
            }
            Err(status) => {
                let mut text = compat::grpc_error_text(&status);
                let failed = decide::modify_failed(status.code());
                if failed.uncertain {
                    set_of(&m.uncertain).insert(key.clone());
                    text.push_str(&mo::text_still_modifying(&target));
                } else {
                    set_of(&m.uncertain).remove(&key);
                }
                tracing::warn!(vac = %target, error = %text, "Modification failed");
                let patch = decide::modify_failure_patch(&pvc, &target, &status, Timestamp::now());
                match self.patch_status(&pvc, patch).await {
                    // Held back from the next retry on, as upstream.
                    Ok(_) if failed.hold_back => m.slow.add(&key),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "Recording the modification error failed"),
                }
                self.event(&pvc, EventType::Warning, mo::REASON_MODIFY_FAILED, &text);
                Outcome::Retry
            }
        }
    }
}

fn annotated_for(pvc: &PersistentVolumeClaim, driver: &str) -> bool {
    let a = pvc.metadata.annotations.as_ref();
    [
        compat::provisioner::ANN_STORAGE_PROVISIONER,
        compat::provisioner::ANN_BETA_STORAGE_PROVISIONER,
        up::ANN_STORAGE_RESIZER,
    ]
    .iter()
    .any(|k| a.and_then(|a| a.get(*k)).map(String::as_str) == Some(driver))
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

/// Runs the resizer until shutdown (or until its Lease is lost).
pub async fn run(cfg: ResizerFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let fatal = |message: String| ModuleError::Fatal { module: NAME, message };
    let kube: KubeContext = ctx.kube.clone().ok_or_else(|| fatal("no Kubernetes client".into()))?;
    let gates = cfg.validate().map_err(|message| ModuleError::Config { module: NAME, message })?;
    let Some(driver) = ctx.csi.wait_for_driver(&ctx.shutdown).await else { return Ok(()) };
    let expander = expander(&ctx, &driver, cfg.timeout).await.map_err(fatal)?;
    let mut gates = gates;
    if !gates.volume_attributes_class_explicit && !crate::kube::discovery::vac_served(&kube.client).await {
        tracing::info!(
            "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass API is not served by the apiserver"
        );
        gates.volume_attributes_class = false;
    }
    let modifies = gates.volume_attributes_class && driver.has_controller_capability(Rpc::ModifyVolume);
    if expander.is_none() && !modifies {
        return Err(fatal("CSI driver does not support resize nor modify".into()));
    }
    let informers = &kube.informers;
    let claim_inf = crate::modules::views::bound_claims(informers, &driver.name, decide::claim_may_be_for_driver);
    let pv_inf = crate::modules::views::driver_pvs(informers, &driver.name);
    let watch_pods = cfg.handle_volume_inuse_error && expander == Some(Expander::Csi) && offline_only(&driver);
    let vac_inf = modifies.then(|| informers.get::<VolumeAttributesClass>());
    let pod_inf = watch_pods.then(|| crate::modules::views::pods_using_claims(informers));
    tracing::info!(driver = %driver.name, ?expander, modifies, watch_pods, ?gates, "Resizer starting");

    let backoff = Backoff { start: cfg.retry_interval_start, max: cfg.retry_interval_max };
    // One queue per process and driver: the name lives as long as the process.
    let queue_name: &'static str = Box::leak(up::queue_resize(&driver.name).into_boxed_str());
    let queue: WorkQueue<String> = WorkQueue::new(queue_name, backoff);
    // The modify queue has its own workers and metrics name, and never runs
    // a claim while the resize queue does (sibling queues).
    let modify_name: &'static str = Box::leak(up::queue_modify(&driver.name).into_boxed_str());
    let modify_queue: WorkQueue<String> = queue.sibling(modify_name);
    let in_use_errors = feed::InUseErrors::default();
    if modifies {
        let q = modify_queue.clone();
        claim_inf.on_change_with_resync(cfg.resync_period, &ctx.shutdown, move |c| {
            let key = decide::claim_key(&c.object().metadata);
            match c {
                Change::Deleted(_) => q.forget(&key),
                Change::Updated { old, new } if !decide::modify_update_needs_sync(old, new) => {}
                _ => q.add(key),
            }
        });
    }
    if expander.is_some() {
        let (q, recover, in_use) = (queue.clone(), gates.recover, in_use_errors.clone());
        claim_inf.on_change_with_resync(cfg.resync_period, &ctx.shutdown, move |c| {
            feed::resize_claim_changed(c, &q, recover, &in_use);
        });
    }
    if let Some(pods) = &pod_inf {
        // A pod that ends or goes lets a held-back claim expand.
        let q = queue.clone();
        pods.on_change(move |c| {
            let p = c.object();
            if c.is_deleted() {
                let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                for claim in p.claims.iter() {
                    q.add(format!("{ns}/{claim}"));
                }
            }
        });
    }
    {
        // A claim synced before its PV was cached is synced again when the PV comes.
        let (resize, modify) = (expander.is_some().then(|| queue.clone()), modifies.then(|| modify_queue.clone()));
        pv_inf.on_change(move |c| {
            if let Change::Added(pv) = c
                && let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_deref())
                && let (Some(ns), Some(name)) = (r.namespace.as_deref(), r.name.as_deref())
            {
                for q in resize.iter().chain(modify.iter()) {
                    q.add(format!("{ns}/{name}"));
                }
            }
        });
    }
    informers.start(&ctx.shutdown);
    let r = Arc::new(Resizer {
        gates,
        expander: expander.unwrap_or(Expander::Trivial),
        csi: ctx.csi.clone(),
        client: kube.client.clone(),
        events: Recorder::new(kube.client.clone(), &up::event_component(&driver.name), "", &ctx.shutdown),
        claims: claim_inf.store(),
        pvs: pv_inf.store(),
        pods: pod_inf.as_ref().map(|p| p.store()),
        final_errors: Mutex::default(),
        slow: SlowSet::default(),
        in_use_errors,
        modify: vac_inf.as_ref().map(|v| ModifyState {
            vacs: v.store(),
            uncertain: Mutex::default(),
            slow: SlowSet::default(),
        }),
        driver: driver.clone(),
        cfg,
    });
    let work = move |token: CancellationToken| async move {
        let synced = async {
            tokio::join!(
                claim_inf.synced(),
                pv_inf.synced(),
                async {
                    if let Some(p) = &pod_inf {
                        p.synced().await
                    }
                },
                async {
                    if let Some(v) = &vac_inf {
                        v.synced().await
                    }
                }
            )
        };
        if token.run_until_cancelled(synced).await.is_none() {
            return;
        }
        if let Some(m) = &r.modify {
            // A modification InProgress when the last leader stopped may
            // still be applying: keep its target.
            let mut uncertain = set_of(&m.uncertain);
            for c in r.claims.state() {
                let st = c.status.as_ref().and_then(|s| s.modify_volume_status.as_ref());
                if st.is_some_and(|s| s.status == mo::IN_PROGRESS) {
                    uncertain.insert(decide::claim_key(&c.metadata));
                }
            }
        }
        tracing::info!("Caches synced; resizing");
        let workers = r.cfg.workers;
        let resize = {
            let (r, token) = (r.clone(), token.clone());
            async move {
                if r.modify.is_some() && expander.is_none() {
                    return;
                }
                queue
                    .run(workers, token, move |key| {
                        let r = r.clone();
                        let span = tracing::info_span!("pvc", key = %key);
                        async move { r.sync(key).await }.instrument(span)
                    })
                    .await
            }
        };
        let modify = async move {
            if r.modify.is_none() {
                return;
            }
            modify_queue
                .run(workers, token, move |key| {
                    let r = r.clone();
                    let span = tracing::info_span!("pvc-modify", key = %key);
                    async move { r.sync_modify(key).await }.instrument(span)
                })
                .await
        };
        tokio::join!(resize, modify);
    };
    crate::modules::led::run_led(&ctx, NAME, &up::lease_lock_name(&driver.name), work).await
}
