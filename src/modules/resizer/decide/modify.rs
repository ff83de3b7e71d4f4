//! The modify controller's decisions (VolumeAttributesClass), free of I/O:
//! which step a claim needs, the `modifyVolumeStatus` and condition patches,
//! what a failed `ControllerModifyVolume` leaves behind, the request.

use super::*;

/// What the modify controller does with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyStep {
    /// Nothing to do.
    Nothing,
    /// The class was infeasible and is still the one asked for: wait.
    HeldBack,
    /// The user cleared the class before it applied: drop the
    /// `ModifyingVolume` condition (and say so, if there was one).
    Rollback {
        /// A `ModifyingVolume` condition exists.
        had_condition: bool,
    },
    /// Keep going to the class already in flight (no status pre-mark).
    Resume {
        /// The class.
        target: String,
    },
    /// Start modifying to the class the user asks for.
    Start {
        /// The class.
        target: String,
    },
}

/// The class the user asks for, the one applied, and the modify status.
pub fn vac_names(pvc: &PersistentVolumeClaim) -> (String, String, Option<&ModifyVolumeStatus>) {
    let spec = pvc.spec.as_ref().and_then(|s| s.volume_attributes_class_name.clone()).unwrap_or_default();
    let st = pvc.status.as_ref();
    let cur = st.and_then(|s| s.current_volume_attributes_class_name.clone()).unwrap_or_default();
    (spec, cur, st.and_then(|s| s.modify_volume_status.as_ref()))
}

/// Whether the slow set should hold this claim: its modify status is
/// Infeasible for the class still asked for. `Some(false)`: the user asked
/// for another class since (the slow entry goes).
pub fn modify_infeasible_same_target(pvc: &PersistentVolumeClaim) -> Option<bool> {
    let (spec, _, st) = vac_names(pvc);
    let st = st?;
    if st.target_volume_attributes_class_name.as_deref().unwrap_or_default() != spec {
        return Some(false);
    }
    (st.status == modifier::INFEASIBLE).then_some(true)
}

/// Upstream's `modify` decision. `uncertain`: a non-final error (or an
/// InProgress status at start-up) left the class in flight; `slow`: the
/// claim was in the slow set before this sync.
pub fn plan_modify(pvc: &PersistentVolumeClaim, uncertain: bool, slow: bool) -> ModifyStep {
    if modify_infeasible_same_target(pvc) == Some(true) && slow {
        return ModifyStep::HeldBack;
    }
    let (spec, cur, st) = vac_names(pvc);
    if st.is_none() && spec == cur {
        return ModifyStep::Nothing;
    }
    let in_progress = st.is_some_and(|s| s.status == modifier::IN_PROGRESS);
    if spec.is_empty() && !in_progress {
        return ModifyStep::Rollback { had_condition: find_condition(pvc, upstream::COND_MODIFYING_VOLUME).is_some() };
    }
    if (in_progress && uncertain) || spec.is_empty() {
        return match st.and_then(|s| s.target_volume_attributes_class_name.clone()).filter(|t| !t.is_empty()) {
            Some(target) => ModifyStep::Resume { target },
            None => ModifyStep::Nothing,
        };
    }
    ModifyStep::Start { target: spec }
}

fn find_condition<'a>(pvc: &'a PersistentVolumeClaim, type_: &str) -> Option<&'a PersistentVolumeClaimCondition> {
    conditions_of(pvc).iter().find(|c| c.type_ == type_)
}

/// `conds` with `c` set: a condition of its type with the same status and
/// reason keeps its lastTransitionTime.
fn set_condition(conds: &mut Vec<PersistentVolumeClaimCondition>, mut c: PersistentVolumeClaimCondition) {
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(old) => {
            if old.status == c.status && old.reason == c.reason {
                c.last_transition_time = old.last_transition_time.clone();
            }
            *old = c;
        }
        None => conds.push(c),
    }
}

fn without(pvc: &PersistentVolumeClaim, types: &[&str]) -> Vec<PersistentVolumeClaimCondition> {
    conditions_of(pvc).iter().filter(|c| !types.contains(&c.type_.as_str())).cloned().collect()
}

fn modify_status(status: &str, target: &str) -> Value {
    json!({ "status": status, "targetVolumeAttributesClassName": target })
}

/// The class is not there (or not the driver's): `Pending`, no condition,
/// and no target: the patch names only the state, so a claim without a
/// modify status gets `{status: Pending}` and one with a status keeps the
/// target of its last attempt, as upstream's patch from its copy does;
/// locked to the claim's resourceVersion, as every mark made before a call.
pub fn modify_pending_patch(pvc: &PersistentVolumeClaim) -> Value {
    json!({
        "metadata": { "resourceVersion": pvc.metadata.resource_version },
        "status": { "modifyVolumeStatus": { "status": modifier::PENDING } },
    })
}

/// What a failed `ControllerModifyVolume` leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyFailed {
    /// The `modifyVolumeStatus.status` written.
    pub state: &'static str,
    /// The class may still be applying on the backend (a non-final code):
    /// the next sync keeps going to it.
    pub uncertain: bool,
    /// The class is infeasible: the claim goes into the slow set at once,
    /// so the retry that follows is held back (no second call) until the
    /// user picks another class or the window ends.
    pub hold_back: bool,
}

/// Upstream's handling of a failed `ControllerModifyVolume` with `code`:
/// non-final codes stay `InProgress` and uncertain; a final
/// `InvalidArgument` is `Infeasible` and held back; other final codes stay
/// `InProgress` and are retried with backoff.
pub fn modify_failed(code: tonic::Code) -> ModifyFailed {
    if classify(Some(code)) == Failure::Uncertain {
        return ModifyFailed { state: modifier::IN_PROGRESS, uncertain: true, hold_back: false };
    }
    let infeasible = code == tonic::Code::InvalidArgument;
    ModifyFailed {
        state: if infeasible { modifier::INFEASIBLE } else { modifier::IN_PROGRESS },
        uncertain: false,
        hold_back: infeasible,
    }
}

/// `InProgress` with the `ModifyingVolume` condition, locked to the
/// claim's resourceVersion: a copy from a lagging cache gets a conflict
/// (and a requeue) before `ControllerModifyVolume` is called.
pub fn modify_in_progress_patch(pvc: &PersistentVolumeClaim, target: &str, now: Timestamp) -> Value {
    let mut conds = conditions_of(pvc).to_vec();
    set_condition(&mut conds, condition(upstream::COND_MODIFYING_VOLUME, &modifier::text_in_progress(target), now));
    json!({
        "metadata": { "resourceVersion": pvc.metadata.resource_version },
        "status": with_conditions(
            json!({ "modifyVolumeStatus": modify_status(modifier::IN_PROGRESS, target) }),
            conditions_of(pvc),
            &conds,
        ),
    })
}

/// After a failed `ControllerModifyVolume` with a gRPC status: `Infeasible`
/// on a final InvalidArgument, else `InProgress`; `ModifyingVolume` and
/// `ModifyVolumeError` (reason: the code's name).
pub fn modify_failure_patch(
    pvc: &PersistentVolumeClaim,
    target: &str,
    status: &tonic::Status,
    now: Timestamp,
) -> Value {
    let failed = modify_failed(status.code());
    let state = failed.state;
    let text =
        if failed.uncertain { modifier::text_still_in_progress(target) } else { modifier::text_failed_waiting(target) };
    let mut conds = conditions_of(pvc).to_vec();
    set_condition(&mut conds, condition(upstream::COND_MODIFYING_VOLUME, &text, now));
    let mut err = condition(upstream::COND_MODIFY_VOLUME_ERROR, status.message(), now);
    err.reason = Some(crate::compat::grpc_code_name(status.code()).to_string());
    set_condition(&mut conds, err);
    let status = json!({ "modifyVolumeStatus": modify_status(state, target) });
    json!({ "status": with_conditions(status, conditions_of(pvc), &conds) })
}

/// After success: the class applied, no modify status, no modify conditions.
pub fn modify_success_patch(pvc: &PersistentVolumeClaim, target: &str) -> Value {
    let status = json!({ "currentVolumeAttributesClassName": target, "modifyVolumeStatus": null });
    let conds = without(pvc, &[upstream::COND_MODIFYING_VOLUME, upstream::COND_MODIFY_VOLUME_ERROR]);
    json!({ "status": with_conditions(status, conditions_of(pvc), &conds) })
}

/// A rollback: the `ModifyingVolume` condition goes.
pub fn modify_rollback_patch(pvc: &PersistentVolumeClaim) -> Value {
    let conds = without(pvc, &[upstream::COND_MODIFYING_VOLUME]);
    json!({ "status": with_conditions(json!({}), conditions_of(pvc), &conds) })
}

/// The PV after success.
pub fn pv_vac_patch(target: &str) -> Value {
    json!({ "spec": { "volumeAttributesClassName": target } })
}

/// The Secret for `ControllerModifyVolume`: the PV's modify-secret
/// annotations when both are set, else its controller-expand secret.
pub fn modify_secret_ref(pv: &PersistentVolume) -> Option<(String, String)> {
    let ann = |k: &str| pv.metadata.annotations.as_ref().and_then(|a| a.get(k)).filter(|v| !v.is_empty()).cloned();
    if let (Some(name), Some(ns)) =
        (ann(provisioner::ANN_MODIFY_SECRET_NAME), ann(provisioner::ANN_MODIFY_SECRET_NAMESPACE))
    {
        return Some((name, ns));
    }
    let r = pv.spec.as_ref()?.csi.as_ref()?.controller_expand_secret_ref.as_ref()?;
    Some((r.name.clone().unwrap_or_default(), r.namespace.clone().unwrap_or_default()))
}

/// The `ControllerModifyVolume` request (secrets added by the caller):
/// the class's parameters, plus the claim's and PV's names with `extra`
/// (`--extra-modify-metadata`).
pub fn modify_request(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
    parameters: Option<&std::collections::BTreeMap<String, String>>,
    extra: bool,
) -> Result<csi::ControllerModifyVolumeRequest, InputError> {
    let volume_id = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .filter(|h| !h.is_empty())
        .ok_or(InputError::EmptyHandle)?;
    let mut mutable_parameters: std::collections::HashMap<String, String> =
        parameters.map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
    if extra {
        mutable_parameters.insert(modifier::PARAM_PVC_NAME.into(), pvc.metadata.name.clone().unwrap_or_default());
        mutable_parameters
            .insert(modifier::PARAM_PVC_NAMESPACE.into(), pvc.metadata.namespace.clone().unwrap_or_default());
        mutable_parameters.insert(modifier::PARAM_PV_NAME.into(), pv.metadata.name.clone().unwrap_or_default());
    }
    Ok(csi::ControllerModifyVolumeRequest { volume_id, secrets: Default::default(), mutable_parameters })
}

/// Whether a claim's update is worth a modify sync (upstream's
/// `updatePVC` of the modify controller, without the PV lookup).
pub fn modify_update_needs_sync(old: &CachedPvc, new: &CachedPvc) -> bool {
    let bound = new.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let vac = |c: &CachedPvc| c.spec.as_ref().and_then(|s| s.volume_attributes_class_name.clone());
    let no_status = new.status.as_ref().is_none_or(|s| s.modify_volume_status.is_none());
    bound && (vac(old) != vac(new) || (no_status && vac(new).is_some()))
}
