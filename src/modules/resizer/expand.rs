//! The expansion path: a claim's resize sync (`ControllerExpandVolume` or the
//! trivial resizer), its writes (the claim's in-progress, success and failure
//! marks, the PV's capacity and annotations) and its events; what to do is
//! decided in [`super::decide`].

use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeClaim},
    jiff::Timestamp,
};
use kube::runtime::reflector::ObjectRef;

use super::{
    ClaimKey, Expander, Resizer,
    decide::{self, Failure, Memory, Step},
    is_status, set_of,
    waiting::ExpandStop,
};
use crate::{
    compat::{self, resizer as upstream},
    csi::proto::csi::v1::controller_service_capability::rpc::Type as Rpc,
    debug::WaitingFor,
    k8s::events::EventType,
    modules::kit::{Done, Reconciled, Wait},
};

impl Resizer {
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

    pub(super) async fn sync(&self, claim: ClaimKey) -> Reconciled {
        let key = claim.to_string();
        let Some(cached) = self.claims.get_named(claim.namespace(), claim.name()) else {
            self.forget(&key);
            self.own_writes.forget(&key);
            return Ok(Done::Finished);
        };
        let pvc = cached.to_full();
        if let Some(owed) = self.superseded_by_own_write(&key, &pvc) {
            return owed;
        }
        let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()) else {
            return Ok(Done::Finished);
        };
        let pv = self.pvs.get(&ObjectRef::new(&pv_name)).map(|p| p.to_full());
        let sizes = match decide::sizes(&pvc, pv.as_ref()) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(Done::Finished),
            Err(e) => {
                // Bad input: said once per change (a fix re-queues the claim).
                tracing::warn!(error = %e, "Cannot read the claim's sizes");
                self.event(&pvc, EventType::Warning, upstream::REASON_RESIZE_FAILED, &e.to_string());
                return Ok(Done::Parked(e.waiting_for()));
            }
        };
        let Some(pv) = pv else {
            // Not one of the driver's PVs, or gone (the claim is then
            // Lost, but still asks for more). A claim annotated for the
            // driver is told so and retried.
            if decide::resize_asked_without_volume(&pvc, &sizes) && annotated_for(&pvc, &self.driver.name) {
                let msg = format!("PersistentVolume {pv_name} of claim {key} not found; cannot resize");
                tracing::warn!(pv = %pv_name, "{msg}");
                self.event(&pvc, EventType::Warning, upstream::REASON_RESIZE_FAILED, &msg);
                return Err(Wait::on(WaitingFor::Dependent));
            }
            tracing::debug!(pv = %pv_name, "PV not among the driver's; ignoring the claim");
            return Ok(Done::Finished);
        };
        if self.gates.annotate_fs_resize
            && decide::pre_resize_annotation_stale(&pv, &sizes)
            && let Err(e) = self.patch_pv(&pv_name, decide::pv_annotation_removal()).await
        {
            tracing::warn!(pv = %pv_name, error = %e, "Removing the pre-resize annotation failed");
            return Err(Wait::on(WaitingFor::ApiServer));
        }
        if !decide::needs_resize(&pvc, &sizes) {
            tracing::trace!("No resize needed");
            return Ok(Done::Finished);
        }
        if !decide::pv_is_ours(&pv, &pvc, &self.driver.name) {
            tracing::debug!(pv = %pv_name, "PV is not this driver's volume of this claim");
            return Ok(Done::Finished);
        }
        let (target, update_status) = if self.gates.recover {
            let slow = self.slow.remaining(&key, self.cfg.retry_interval_max);
            if decide::allocation_state(&pvc) == Some(upstream::CONTROLLER_RESIZE_INFEASIBLE) {
                self.slow.add(&key);
            }
            let memory = Memory {
                final_error: set_of(&self.final_errors).contains(&key),
                slow: slow.is_some(),
                controller_expansion: self.expander == Expander::Csi,
            };
            match decide::plan(&pvc, &sizes, memory) {
                Step::Skip => return Ok(Done::Finished),
                step @ Step::HeldBack => {
                    let left = slow.unwrap_or(self.cfg.retry_interval_max);
                    tracing::info!(retry_in = ?left, "{}", upstream::text_infeasible_skipped(&key));
                    return Err(Wait::on(step.waiting_for().unwrap_or(WaitingFor::Infeasible)).after(left));
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
                return Err(Wait::on(WaitingFor::ApiServer));
            }
        };
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        if set_of(&self.in_use_errors).contains(&uid) && self.in_use(&pvc) {
            let msg = upstream::text_in_use(&key, &self.driver.name);
            tracing::info!("{msg}");
            self.event(&pvc, EventType::Warning, upstream::REASON_RESIZE_FAILED, &msg);
            return Err(Wait::on(WaitingFor::VolumeInUse));
        }
        self.event(&pvc, EventType::Normal, upstream::REASON_RESIZING, &upstream::text_resizing(&pv_name));
        set_of(&self.in_use_errors).remove(&uid);
        match self.expand(&pv, target).await {
            Ok((new_size, node_required)) => self.expanded(&key, &pvc, &pv, new_size, node_required).await,
            Err((stop, err)) => self.failed(&key, &pvc, &pv_name, stop, &err).await,
        }
    }

    /// The driver's call (or the trivial answer): the new size and whether
    /// the node must finish. Err: where it stopped (with the gRPC code, if
    /// any) and the error text.
    async fn expand(&self, pv: &PersistentVolume, target: i64) -> Result<(i64, bool), (ExpandStop, String)> {
        if self.expander == Expander::Trivial {
            return Ok((target, true));
        }
        let (pv, migrated) = decide::csi_form(pv, &self.driver.name).map_err(|e| (ExpandStop::Volume, e))?;
        let smw = self.driver.has_controller_capability(Rpc::SingleNodeMultiWriter);
        let mut req = decide::expand_request(&pv, target, smw).map_err(|e| (ExpandStop::Volume, e.to_string()))?;
        if let Some(r) =
            pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| c.controller_expand_secret_ref.as_ref())
        {
            let (name, ns) = (r.name.clone().unwrap_or_default(), r.namespace.clone().unwrap_or_default());
            req.secrets = crate::k8s::secrets::secret_data(&self.client, &name, &ns)
                .await
                .map_err(|e| (ExpandStop::Secret, e))?;
        }
        let call = self.csi.controller_expand_volume(self.cfg.timeout, req);
        let resp = crate::csi::connection::migrated_scope(migrated, call)
            .await
            .map_err(|s| (ExpandStop::Call(s.code()), compat::grpc_error_text(&s)))?;
        let size = decide::checked_capacity(target, resp.capacity_bytes).map_err(|e| (ExpandStop::Answer, e))?;
        Ok((size, resp.node_expansion_required))
    }

    async fn expanded(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        new_size: i64,
        node_required: bool,
    ) -> Reconciled {
        self.forget(key);
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let patch = decide::pv_patch(pv, pvc, new_size, node_required, self.gates.annotate_fs_resize);
        if let Err(e) = self.patch_pv(&pv_name, patch).await {
            tracing::warn!(pv = %pv_name, error = %e, "Updating the PV capacity failed");
            return Err(Wait::on(WaitingFor::ApiServer));
        }
        let patch = decide::success_patch(pvc, new_size, node_required, self.gates.recover, Timestamp::now());
        if let Err(e) = self.patch_status(pvc, patch).await {
            tracing::warn!(error = %e, "Updating the claim status failed");
            return Err(Wait::on(WaitingFor::ApiServer));
        }
        if node_required {
            tracing::info!(pv = %pv_name, size = new_size, "Volume expanded; the node must finish");
            self.event(pvc, EventType::Normal, upstream::REASON_FS_RESIZE_REQUIRED, upstream::TEXT_FS_RESIZE_REQUIRED);
        } else {
            tracing::info!(pv = %pv_name, size = new_size, "Volume expanded");
            self.event(pvc, EventType::Normal, upstream::REASON_RESIZE_SUCCESSFUL, upstream::TEXT_RESIZE_SUCCESSFUL);
        }
        Ok(Done::Finished)
    }

    async fn failed(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        pv_name: &str,
        stop: ExpandStop,
        err: &str,
    ) -> Reconciled {
        let code = stop.code();
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
        let text = upstream::text_resize_failed(pv_name, &self.driver.name, err);
        self.event(pvc, EventType::Warning, upstream::REASON_RESIZE_FAILED, &text);
        Err(Wait::on(stop.waiting_for(self.pods.is_some())))
    }
}

/// Whether the claim is annotated as provisioned or resized by `driver`.
pub(super) fn annotated_for(pvc: &PersistentVolumeClaim, driver: &str) -> bool {
    let a = pvc.metadata.annotations.as_ref();
    [
        compat::provisioner::ANN_STORAGE_PROVISIONER,
        compat::provisioner::ANN_BETA_STORAGE_PROVISIONER,
        upstream::ANN_STORAGE_RESIZER,
    ]
    .iter()
    .any(|k| a.and_then(|a| a.get(*k)).map(String::as_str) == Some(driver))
}
