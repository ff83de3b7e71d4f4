//! The modify path: a claim's VolumeAttributesClass sync
//! (`ControllerModifyVolume`), its writes (the claim's `modifyVolumeStatus`
//! and conditions, the PV's class) and its events; what to do is decided in
//! [`super::decide`] (`decide/modify.rs`).

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use super::{
    ClaimKey, Resizer,
    decide::{self, ModifyStep},
    is_status, set_of,
};
use crate::{
    compat::{self, modifier},
    debug::WaitingFor,
    k8s::events::EventType,
    modules::kit::{Done, Reconciled, Wait},
};

impl Resizer {
    /// A modification InProgress when the last leader stopped may still be
    /// applying: its claim is uncertain (its target is kept).
    pub(super) fn recall_in_progress(&self) {
        let Some(m) = &self.modify else { return };
        let mut uncertain = set_of(&m.uncertain);
        for c in self.claims.state() {
            let st = c.status.as_ref().and_then(|s| s.modify_volume_status.as_ref());
            if st.is_some_and(|s| s.status == modifier::IN_PROGRESS) {
                uncertain.insert(decide::claim_key(&c.metadata));
            }
        }
    }

    pub(super) async fn sync_modify(&self, claim: ClaimKey) -> Reconciled {
        let Some(m) = &self.modify else { return Ok(Done::Finished) };
        let key = claim.to_string();
        let Some(cached) = self.claims.get_named(claim.namespace(), claim.name()) else {
            set_of(&m.uncertain).remove(&key);
            m.slow.remove(&key);
            return Ok(Done::Finished);
        };
        let pvc = cached.to_full();
        if let Some(owed) = self.superseded_by_own_write(&key, &pvc) {
            return owed;
        }
        let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()) else {
            return Ok(Done::Finished);
        };
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Ok(Done::Finished);
        }
        let Some(pv) = self.pvs.get(&ObjectRef::new(&pv_name)).map(|p| p.to_full()) else {
            tracing::debug!(pv = %pv_name, "PV not among the driver's; no modification");
            // Done; a claim of the driver waits for its PV (whose arrival
            // queues it again).
            let annotated = super::expand::annotated_for(&pvc, &self.driver.name);
            return Ok(super::waiting::modify_without_volume(&pvc, annotated).map_or(Done::Finished, Done::Parked));
        };
        if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none_or(|c| *c.driver != *self.driver.name) {
            return Ok(Done::Finished);
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
            ModifyStep::Nothing => return Ok(Done::Finished),
            step @ ModifyStep::HeldBack => {
                tracing::info!("{}", modifier::text_infeasible_skipped(&key));
                return Err(Wait::on(step.waiting_for().unwrap_or(WaitingFor::Infeasible)));
            }
            ModifyStep::Rollback { had_condition } => {
                if !had_condition {
                    return Ok(Done::Finished);
                }
                if let Err(e) = self.patch_status(&pvc, decide::modify_rollback_patch(&pvc)).await {
                    tracing::warn!(error = %e, "Removing the ModifyingVolume condition failed");
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
                self.event(&pvc, EventType::Normal, modifier::REASON_MODIFY_CANCELED, modifier::TEXT_CANCELED);
                return Ok(Done::Finished);
            }
            ModifyStep::Resume { target } => (pvc, target),
            ModifyStep::Start { target } => {
                let vac = m.vacs.get(&ObjectRef::new(&target));
                let problem = match &vac {
                    None => Some(modifier::text_vac_missing(&target)),
                    Some(v) if v.driver_name != *self.driver.name => Some(format!(
                        "VAC \"{target}\" is for driver {}, not {}; not modifying",
                        v.driver_name, self.driver.name
                    )),
                    Some(_) => None,
                };
                if let Some(msg) = problem {
                    // Pending until the user changes the class (upstream
                    // does not retry either: the write ends the sync), so
                    // done, but waiting for the class.
                    tracing::warn!(vac = %target, "{msg}");
                    self.event(&pvc, EventType::Warning, modifier::REASON_MODIFY_FAILED, &msg);
                    return match self.patch_status(&pvc, decide::modify_pending_patch(&pvc)).await {
                        Ok(_) => Ok(Done::Parked(WaitingFor::Class)),
                        Err(e) => {
                            tracing::warn!(error = %e, "Marking the modification pending failed");
                            Err(Wait::on(WaitingFor::Class))
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
                        return Err(Wait::on(WaitingFor::ApiServer));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Marking the modification in progress failed");
                        return Err(Wait::on(WaitingFor::ApiServer));
                    }
                };
                self.event(
                    &written,
                    EventType::Normal,
                    modifier::REASON_MODIFY,
                    &modifier::text_modifying(&pvc_name, &target),
                );
                (written, target)
            }
        };
        let Some(vac) = m.vacs.get(&ObjectRef::new(&target)) else {
            self.event(&pvc, EventType::Warning, modifier::REASON_MODIFY_FAILED, &modifier::text_vac_missing(&target));
            return Err(Wait::on(WaitingFor::Class));
        };
        let mut req = match decide::modify_request(&pv, &pvc, vac.parameters.as_ref(), self.cfg.extra_modify_metadata) {
            Ok(r) => r,
            Err(e) => {
                self.event(&pvc, EventType::Warning, modifier::REASON_MODIFY_FAILED, &e.to_string());
                return Err(Wait::on(e.waiting_for()));
            }
        };
        if let Some((name, ns)) = decide::modify_secret_ref(&pv) {
            match crate::k8s::secrets::secret_data(&self.client, &name, &ns).await {
                Ok(s) => req.secrets = s,
                Err(e) => {
                    self.event(&pvc, EventType::Warning, modifier::REASON_MODIFY_FAILED, &e);
                    return Err(Wait::on(WaitingFor::Secret));
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
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
                if let Err(e) = self.patch_status(&pvc, decide::modify_success_patch(&pvc, &target)).await {
                    tracing::warn!(error = %e, "Recording the class on the claim failed");
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
                tracing::info!(vac = %target, "Volume modified");
                self.event(
                    &pvc,
                    EventType::Normal,
                    modifier::REASON_MODIFY_SUCCESSFUL,
                    &modifier::text_modified(&pvc_name, &target),
                );
                Ok(Done::Finished)
            }
            Err(status) => {
                let mut text = compat::grpc_error_text(&status);
                let failed = decide::modify_failed(status.code());
                if failed.uncertain {
                    set_of(&m.uncertain).insert(key.clone());
                    text.push_str(&modifier::text_still_modifying(&target));
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
                self.event(&pvc, EventType::Warning, modifier::REASON_MODIFY_FAILED, &text);
                Err(Wait::on(failed.waiting_for()))
            }
        }
    }
}
