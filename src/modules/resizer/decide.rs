//! The resizer's decisions, pure: which claim needs what, the size to ask
//! for (upstream's recovery rules), which gRPC codes are final or
//! infeasible, and the exact status and PV patches. `mod.rs` does the I/O.

use k8s_openapi::{
    api::core::v1::{ModifyVolumeStatus, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition},
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
    jiff::Timestamp,
};
use serde_json::{Value, json};

use super::conditions::with_conditions;
use crate::{
    compat::{modifier, provisioner, resizer as upstream},
    csi::proto::csi::v1::{self as csi, volume_capability::access_mode::Mode},
    k8s::{
        cached::CachedPvc,
        quantity::{from_bytes, to_bytes},
    },
};

/// A claim or volume whose sizes cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A quantity that does not parse.
    #[error("invalid {field} {value:?} of {object}")]
    Quantity {
        /// `spec.resources.requests.storage`, ...
        field: &'static str,
        /// The text.
        value: String,
        /// `ns/name` or the PV name.
        object: String,
    },
    /// The PV has no CSI volume handle.
    #[error("empty volume handle")]
    EmptyHandle,
    /// Access modes that cannot be mapped to one CSI mode.
    #[error("{0}")]
    AccessModes(String),
}

/// Whether a claim can be one of the driver's: not annotated for another
/// driver (claims bound to pre-created PVs carry no annotation and are kept).
pub fn claim_may_be_for_driver(meta: &ObjectMeta, driver: &str) -> bool {
    let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).map(String::as_str);
    if ann(upstream::ANN_STORAGE_RESIZER) == Some(driver) || ann(provisioner::ANN_MIGRATED_TO) == Some(driver) {
        return true;
    }
    match ann(provisioner::ANN_STORAGE_PROVISIONER).or_else(|| ann(provisioner::ANN_BETA_STORAGE_PROVISIONER)) {
        Some(p) => p == driver,
        None => true,
    }
}

/// Whether a claim's update is worth a sync (upstream's `updatePVC`): the
/// request changed (grew, or with the recovery gate, changed at all), the
/// resizer annotation changed, the capacity grew, or the allocation state
/// changed.
pub fn update_needs_sync(old: &CachedPvc, new: &CachedPvc, recover: bool) -> bool {
    let req =
        |c: &CachedPvc| c.spec.as_ref().and_then(|s| s.requested_storage.as_ref()).and_then(|q| to_bytes(&q.0).ok());
    let cap =
        |c: &CachedPvc| c.status.as_ref().and_then(|s| s.capacity_storage.as_ref()).and_then(|q| to_bytes(&q.0).ok());
    let st = |c: &CachedPvc| c.status.as_ref().and_then(|s| s.allocated_status_storage.clone());
    let resizer =
        |c: &CachedPvc| c.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_STORAGE_RESIZER)).cloned();
    let (ro, rn) = (req(old), req(new));
    let request_changed = if recover { ro != rn } else { rn > ro };
    request_changed || resizer(old) != resizer(new) || cap(new) > cap(old) || st(old) != st(new)
}

/// The sizes of a claim and its volume, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// `spec.resources.requests.storage`.
    pub spec: i64,
    /// `status.capacity.storage` (0 if absent).
    pub capacity: i64,
    /// `status.allocatedResources.storage`.
    pub allocated: Option<i64>,
    /// The PV's `spec.capacity.storage` (0 if absent).
    pub pv: i64,
}

fn storage_bytes(q: Option<&Quantity>, field: &'static str, object: &str) -> Result<Option<i64>, InputError> {
    q.map(|q| {
        to_bytes(&q.0).map_err(|_| InputError::Quantity { field, value: q.0.clone(), object: object.to_string() })
    })
    .transpose()
}

/// `ns/name` of a claim.
pub fn claim_key(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

fn storage(m: Option<&std::collections::BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    m.and_then(|m| m.get("storage"))
}

/// Reads the sizes; `None` if the claim requests no storage.
pub fn sizes(pvc: &PersistentVolumeClaim, pv: Option<&PersistentVolume>) -> Result<Option<Sizes>, InputError> {
    let key = claim_key(&pvc.metadata);
    let spec = storage_bytes(
        storage(pvc.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref())),
        "spec.resources.requests.storage",
        &key,
    )?;
    let Some(spec) = spec else { return Ok(None) };
    let st = pvc.status.as_ref();
    let capacity = storage_bytes(storage(st.and_then(|s| s.capacity.as_ref())), "status.capacity.storage", &key)?;
    let allocated = storage_bytes(
        storage(st.and_then(|s| s.allocated_resources.as_ref())),
        "status.allocatedResources.storage",
        &key,
    )?;
    let pv_name = pv.and_then(|p| p.metadata.name.clone()).unwrap_or_default();
    let pv_size = match pv {
        Some(pv) => storage_bytes(
            storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
            "spec.capacity.storage",
            &pv_name,
        )?,
        None => None,
    };
    Ok(Some(Sizes { spec, capacity: capacity.unwrap_or(0), allocated, pv: pv_size.unwrap_or(0) }))
}

fn phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref()?.phase.as_deref()
}

/// `status.allocatedResourceStatuses.storage`.
pub fn allocation_state(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref()?.allocated_resource_statuses.as_ref()?.get("storage").map(String::as_str)
}

fn condition_true(pvc: &PersistentVolumeClaim, type_: &str) -> bool {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Upstream's `pvcNeedResize`: bound, and the request above the capacity.
pub fn needs_resize(pvc: &PersistentVolumeClaim, sizes: &Sizes) -> bool {
    phase(pvc) == Some("Bound")
        && pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty())
        && sizes.spec > sizes.capacity
}

/// A claim whose PV is not cached: whether a resize was asked for, so the
/// missing volume is worth an event. A claim just bound has no capacity yet
/// (its PV is on the way); a claim whose PV is gone is `Lost`, and the
/// binder has cleared its capacity (an allocated size shows the request).
pub fn resize_asked_without_volume(pvc: &PersistentVolumeClaim, sizes: &Sizes) -> bool {
    if sizes.capacity > 0 {
        return sizes.spec > sizes.capacity;
    }
    phase(pvc) == Some("Lost") && sizes.allocated.is_some()
}

/// Whether the PV is the driver's volume of this claim (`CanSupport` and
/// the claimRef's namespace and UID).
pub fn pv_is_ours(pv: &PersistentVolume, pvc: &PersistentVolumeClaim, driver: &str) -> bool {
    let Some(spec) = pv.spec.as_ref() else { return false };
    let ours = match &spec.csi {
        Some(c) => c.driver == driver,
        // An in-tree volume of a plugin that migrates to the driver (upstream
        // `CanSupport`): the driver's once kube-controller-manager's expand
        // controller named it the claim's resizer.
        None => crate::migration::is_migrated_to(pv, driver) && resizer_of(pvc) == Some(driver),
    };
    let claim = spec.claim_ref.as_ref();
    ours && claim.and_then(|c| c.namespace.as_deref()) == pvc.metadata.namespace.as_deref()
        && claim.and_then(|c| c.uid.as_deref()) == pvc.metadata.uid.as_deref()
}

/// The claim's `volume.kubernetes.io/storage-resizer` annotation.
fn resizer_of(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.metadata.annotations.as_ref()?.get(upstream::ANN_STORAGE_RESIZER).map(String::as_str)
}

/// The PV as the driver is asked to expand it: a CSI PV as it is, a
/// migrated in-tree PV translated (`true`: the `migrated` metric label).
pub fn csi_form(pv: &PersistentVolume, driver: &str) -> Result<(PersistentVolume, bool), String> {
    crate::migration::csi_form(pv.clone(), driver).map_err(|e| format!("failed to translate persistent volume: {e}"))
}

/// Whether the PV's pre-resize annotation can go: the claim's capacity
/// caught up with the PV.
pub fn pre_resize_annotation_stale(pv: &PersistentVolume, sizes: &Sizes) -> bool {
    pv.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(upstream::ANN_PRE_RESIZE_CAPACITY))
        && sizes.capacity >= sizes.pv
}

/// What the resize controller does with a claim that needs a resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing now (the kubelet's turn, or nothing to do).
    Skip,
    /// The size was infeasible and is still what is allocated: wait.
    HeldBack,
    /// Ask the driver for `target` bytes; `update_status`: write the
    /// in-progress allocation state (false when `target` is already allocated).
    Expand {
        /// Bytes to request.
        target: i64,
        /// Write `ControllerResizeInProgress`.
        update_status: bool,
    },
}

/// What is known besides the claim's own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// A final error was seen for this claim in this process.
    pub final_error: bool,
    /// The claim is in the slow set (an infeasible size, within `--retry-interval-max`).
    pub slow: bool,
    /// The driver expands on the controller (not the trivial resizer).
    pub controller_expansion: bool,
}

/// Upstream's `expandAndRecover` target rule (RecoverVolumeExpansionFailure).
/// A user who lowered the request after a final error gets the lower size
/// at once; after an error that may still be running on the backend, the
/// size in flight is kept (never a second size before the first ends).
pub fn plan(pvc: &PersistentVolumeClaim, s: &Sizes, m: Memory) -> Step {
    let st = allocation_state(pvc).unwrap_or("");
    let allocated = s.allocated.unwrap_or(s.spec);
    let target = if s.pv < s.spec {
        match st {
            upstream::NODE_RESIZE_INFEASIBLE => allocated,
            upstream::NODE_RESIZE_PENDING | upstream::NODE_RESIZE_IN_PROGRESS => {
                if s.pv >= allocated {
                    return Step::Skip;
                }
                allocated
            }
            upstream::CONTROLLER_RESIZE_IN_PROGRESS if !m.final_error => allocated,
            _ => s.spec,
        }
    } else {
        match st {
            upstream::NODE_RESIZE_PENDING | upstream::NODE_RESIZE_IN_PROGRESS => return Step::Skip,
            upstream::NODE_RESIZE_INFEASIBLE if m.controller_expansion && s.allocated.is_some() => allocated,
            upstream::NODE_RESIZE_INFEASIBLE => s.spec,
            upstream::CONTROLLER_RESIZE_IN_PROGRESS | upstream::CONTROLLER_RESIZE_INFEASIBLE => allocated,
            "" if s.allocated.is_some() => allocated,
            _ if condition_true(pvc, upstream::COND_FS_RESIZE_PENDING) => return Step::Skip,
            _ => s.spec,
        }
    };
    if s.allocated == Some(target) {
        if m.slow {
            return Step::HeldBack;
        }
        return Step::Expand { target, update_status: false };
    }
    Step::Expand { target, update_status: true }
}

/// How a failed `ControllerExpandVolume` is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// May still be running on the backend: retried at the same size.
    Uncertain,
    /// Final, the size may work later (e.g. Internal).
    Final,
    /// Final and the size cannot work: `ControllerResizeInfeasible`.
    Infeasible,
}

/// Classifies a gRPC status (upstream's `IsFinalError`/`IsInfeasibleError`);
/// a failure without a gRPC status is [`Failure::Uncertain`].
pub fn classify(code: Option<tonic::Code>) -> Failure {
    use tonic::Code::*;
    match code {
        None | Some(Cancelled | DeadlineExceeded | Unavailable | ResourceExhausted | Aborted) => Failure::Uncertain,
        Some(InvalidArgument | OutOfRange | NotFound) => Failure::Infeasible,
        Some(_) => Failure::Final,
    }
}

/// The resize condition types (upstream's `knownResizeConditions`).
const RESIZE_CONDITIONS: &[&str] = &[
    upstream::COND_RESIZING,
    upstream::COND_FS_RESIZE_PENDING,
    upstream::COND_CONTROLLER_RESIZE_ERROR,
    upstream::COND_NODE_RESIZE_ERROR,
];

fn condition(type_: &str, message: &str, now: Timestamp) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: type_.to_string(),
        status: "True".to_string(),
        last_transition_time: Some(Time(now)),
        message: (!message.is_empty()).then(|| message.to_string()),
        ..Default::default()
    }
}

/// Upstream's `MergeResizeConditionOnPVC`: other conditions are kept; a
/// resize condition given anew replaces the old one unless its status is
/// the same (then the old one, with its time, stays); old resize
/// conditions not given stay only with `keep_old`.
pub fn merge_conditions(
    old: &[PersistentVolumeClaimCondition],
    new: &[PersistentVolumeClaimCondition],
    keep_old: bool,
) -> Vec<PersistentVolumeClaimCondition> {
    let mut out = Vec::new();
    let mut used = vec![false; new.len()];
    for c in old {
        if !RESIZE_CONDITIONS.contains(&c.type_.as_str()) {
            out.push(c.clone());
            continue;
        }
        if let Some(i) = new.iter().position(|n| n.type_ == c.type_) {
            out.push(if new[i].status != c.status { new[i].clone() } else { c.clone() });
            used[i] = true;
        } else if keep_old {
            out.push(c.clone());
        }
    }
    out.extend(new.iter().zip(used).filter(|(_, u)| !u).map(|(n, _)| n.clone()));
    out
}

fn conditions_of(pvc: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    pvc.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn has_annotation(pvc: &PersistentVolumeClaim, key: &str) -> bool {
    pvc.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(key))
}

/// The `/status` strategic merge patch that marks the resize in progress, locked to
/// the claim's resourceVersion (a stale cache gets a conflict, never a
/// second call): condition `Resizing`, allocation state and size (with the
/// recovery gate), the node-expansion-not-required annotation removed.
pub fn in_progress_patch(
    pvc: &PersistentVolumeClaim,
    target: i64,
    update_status: bool,
    recover: bool,
    now: Timestamp,
) -> Value {
    let conds = merge_conditions(conditions_of(pvc), &[condition(upstream::COND_RESIZING, "", now)], !update_status);
    let mut status = with_conditions(json!({}), conditions_of(pvc), &conds);
    if recover {
        status["allocatedResources"] = json!({ "storage": from_bytes(target) });
        if update_status {
            status["allocatedResourceStatuses"] = json!({ "storage": upstream::CONTROLLER_RESIZE_IN_PROGRESS });
        }
    }
    let mut meta = json!({ "resourceVersion": pvc.metadata.resource_version });
    if has_annotation(pvc, upstream::ANN_NODE_EXPANSION_NOT_REQUIRED) {
        meta["annotations"] = json!({ upstream::ANN_NODE_EXPANSION_NOT_REQUIRED: null });
    }
    json!({ "metadata": meta, "status": status })
}

/// The `/status` strategic merge patch after a final failure: `ControllerResizeError`
/// (other resize conditions kept) and, if infeasible,
/// `ControllerResizeInfeasible`.
pub fn failure_patch(pvc: &PersistentVolumeClaim, error: &str, infeasible: bool, now: Timestamp) -> Value {
    let c = condition(upstream::COND_CONTROLLER_RESIZE_ERROR, &upstream::text_controller_resize_error(error), now);
    let conds = merge_conditions(conditions_of(pvc), &[c], true);
    let mut status = with_conditions(json!({}), conditions_of(pvc), &conds);
    if infeasible {
        status["allocatedResourceStatuses"] = json!({ "storage": upstream::CONTROLLER_RESIZE_INFEASIBLE });
    }
    json!({ "status": status })
}

/// The `/status` strategic merge patch after a successful controller expansion.
/// `node_required`: `FileSystemResizePending` and `NodeResizePending` (the
/// kubelet finishes); otherwise the new capacity, the resize conditions
/// and allocation state gone, and the node-expansion-not-required annotation.
pub fn success_patch(
    pvc: &PersistentVolumeClaim,
    new_size: i64,
    node_required: bool,
    recover: bool,
    now: Timestamp,
) -> Value {
    if node_required {
        let c = condition(upstream::COND_FS_RESIZE_PENDING, upstream::TEXT_FS_RESIZE_PENDING, now);
        let conds = merge_conditions(conditions_of(pvc), &[c], true);
        let mut status = with_conditions(json!({}), conditions_of(pvc), &conds);
        if recover {
            status["allocatedResourceStatuses"] = json!({ "storage": upstream::NODE_RESIZE_PENDING });
        }
        let mut patch = json!({ "status": status });
        if has_annotation(pvc, upstream::ANN_NODE_EXPANSION_NOT_REQUIRED) {
            patch["metadata"] = json!({ "annotations": { upstream::ANN_NODE_EXPANSION_NOT_REQUIRED: null } });
        }
        return patch;
    }
    let conds = merge_conditions(conditions_of(pvc), &[], false);
    let mut status =
        with_conditions(json!({ "capacity": { "storage": from_bytes(new_size) } }), conditions_of(pvc), &conds);
    if recover || allocation_state(pvc).is_some() {
        status["allocatedResourceStatuses"] = json!({ "storage": null });
    }
    json!({
        "metadata": { "annotations": { upstream::ANN_NODE_EXPANSION_NOT_REQUIRED: "true" } },
        "status": status,
    })
}

/// The PV strategic merge patch after a successful expansion: the new
/// capacity and, when the node must finish and `annotate` (AnnotateFsResize)
/// is on, the claim's old capacity in the pre-resize annotation.
pub fn pv_patch(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
    new_size: i64,
    node_required: bool,
    annotate: bool,
) -> Value {
    let mut patch = json!({ "spec": { "capacity": { "storage": from_bytes(new_size) } } });
    let annotated = pv.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(upstream::ANN_PRE_RESIZE_CAPACITY));
    let old = pvc.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
    if node_required
        && annotate
        && !annotated
        && let Some(old) = old
    {
        patch["metadata"] = json!({ "annotations": { upstream::ANN_PRE_RESIZE_CAPACITY: old.0 } });
    }
    patch
}

/// The PV patch that removes the pre-resize annotation.
pub fn pv_annotation_removal() -> Value {
    json!({ "metadata": { "annotations": { upstream::ANN_PRE_RESIZE_CAPACITY: null } } })
}

/// The driver's answer, checked: a capacity below the request is an error
/// (upstream would write it into the PV).
pub fn checked_capacity(requested: i64, answered: i64) -> Result<i64, String> {
    if answered < requested {
        return Err(format!(
            "the CSI driver answered ControllerExpandVolume with capacity {answered} bytes, less than the requested {requested}"
        ));
    }
    Ok(answered)
}

/// The CSI access mode of a PV's access modes (csi-lib-utils' mapping).
pub fn access_mode(modes: &[String], single_node_multi_writer: bool) -> Result<Mode, InputError> {
    let has = |m: &str| modes.iter().any(|x| x == m);
    if has("ReadWriteOncePod") {
        if modes.len() > 1 {
            return Err(InputError::AccessModes(
                "Kubernetes does not support use of ReadWriteOncePod with other access modes".into(),
            ));
        }
        return Ok(if single_node_multi_writer { Mode::SingleNodeSingleWriter } else { Mode::SingleNodeWriter });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    if has("ReadOnlyMany") && has("ReadWriteOnce") {
        return Err(InputError::AccessModes(
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume".into(),
        ));
    }
    if has("ReadOnlyMany") {
        return Ok(Mode::MultiNodeReaderOnly);
    }
    if has("ReadWriteOnce") {
        return Ok(if single_node_multi_writer { Mode::SingleNodeMultiWriter } else { Mode::SingleNodeWriter });
    }
    Err(InputError::AccessModes(format!("unsupported access modes {modes:?}")))
}

/// The `ControllerExpandVolume` request for `target` bytes (secrets added by the caller).
pub fn expand_request(
    pv: &PersistentVolume,
    target: i64,
    single_node_multi_writer: bool,
) -> Result<csi::ControllerExpandVolumeRequest, InputError> {
    let spec = pv.spec.as_ref();
    let source = spec.and_then(|s| s.csi.as_ref());
    let volume_id = source.map(|c| c.volume_handle.clone()).filter(|h| !h.is_empty()).ok_or(InputError::EmptyHandle)?;
    let modes = spec.and_then(|s| s.access_modes.clone()).unwrap_or_default();
    let mode = access_mode(&modes, single_node_multi_writer)?;
    let access_type = if spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {})
    } else {
        csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: source.and_then(|c| c.fs_type.clone()).unwrap_or_default(),
            mount_flags: spec.and_then(|s| s.mount_options.clone()).unwrap_or_default(),
            ..Default::default()
        })
    };
    Ok(csi::ControllerExpandVolumeRequest {
        volume_id,
        capacity_range: Some(csi::CapacityRange { required_bytes: target, limit_bytes: 0 }),
        secrets: Default::default(),
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(access_type),
        }),
    })
}

mod modify;
pub use modify::*;

#[cfg(test)]
mod tests;
