//! What to do with a PVC or a PV now: pure functions, table-tested. The
//! executor (`mod.rs`) does the I/O these decisions ask for.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
            SecretReference,
        },
        storage::v1::StorageClass,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};

use super::{
    params::{self, ParamError, SecretKind, SecretRef, TemplateContext},
    sources::{self, PlanSource, SourceKind, SourceRef},
};
use crate::{
    compat::provisioner as upstream,
    csi::{
        DriverInfo,
        proto::csi::v1::{
            self as csi, CapacityRange, CreateVolumeRequest, VolumeCapability,
            controller_service_capability::rpc::Type as Rpc, plugin_capability::service::Type as Svc,
            volume_capability,
        },
    },
    k8s::quantity,
    migration::{self, Plugin},
};

/// Settings from the provisioner's flags that shape requests and PVs.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `--volume-name-prefix`.
    pub volume_name_prefix: String,
    /// `--volume-name-uuid-length`.
    pub volume_name_uuid_length: i64,
    /// `--default-fstype`.
    pub default_fstype: String,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
}

/// The provisioner (driver) name a PVC (by its metadata) asks for.
pub fn requested_provisioner(pvc: &ObjectMeta) -> Option<&str> {
    let ann = pvc.annotations.as_ref()?;
    ann.get(upstream::ANN_STORAGE_PROVISIONER)
        .or_else(|| ann.get(upstream::ANN_BETA_STORAGE_PROVISIONER))
        .map(String::as_str)
}

/// Whether a PVC (by its metadata) is for `driver` (by provisioner
/// annotation or CSI migration).
pub fn is_for_driver(pvc: &ObjectMeta, driver: &str) -> bool {
    let migrated = pvc.annotations.as_ref().and_then(|a| a.get(upstream::ANN_MIGRATED_TO)).map(String::as_str);
    requested_provisioner(pvc) == Some(driver) || migrated == Some(driver)
}

/// `<prefix>-<uid>`, or with dashes removed and the UID cut to `uuid_length`.
pub fn volume_name(prefix: &str, uid: &str, uuid_length: i64) -> Result<String, String> {
    if prefix.is_empty() {
        return Err("volume name prefix cannot be of length 0".into());
    }
    if uid.is_empty() {
        return Err("corrupted PVC object, it is missing UID".into());
    }
    if uuid_length < 0 {
        return Ok(format!("{prefix}-{uid}"));
    }
    let compact: String = uid.chars().filter(|c| *c != '-').collect();
    let n = usize::try_from(uuid_length).unwrap_or(usize::MAX).min(compact.len());
    Ok(format!("{prefix}-{}", &compact[..n]))
}

/// What to do with a PVC.
#[derive(Debug, PartialEq)]
pub enum ClaimDecision {
    /// Not ours, or nothing to do (reason for debug logs).
    Ignore(&'static str),
    /// WaitForFirstConsumer without a selected node yet.
    WaitForScheduler,
    /// Provision it.
    Provision,
}

/// Whether a PVC needs a volume from this driver now. `pv_exists`: the PV
/// that provisioning would create is already in the cache.
pub fn decide_claim(
    pvc: &PersistentVolumeClaim,
    sc: Option<&StorageClass>,
    driver: &str,
    pv_exists: bool,
) -> ClaimDecision {
    let spec = pvc.spec.as_ref();
    if spec.and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty()) {
        return ClaimDecision::Ignore("already bound to a volume");
    }
    if !is_for_driver(&pvc.metadata, driver) {
        return ClaimDecision::Ignore("not for this driver");
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return ClaimDecision::Ignore("being deleted");
    }
    if pv_exists {
        return ClaimDecision::Ignore("volume already provisioned");
    }
    let wffc = sc.and_then(|s| s.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
    let selected = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(upstream::ANN_SELECTED_NODE))
        .is_some_and(|n| !n.is_empty());
    if wffc && !selected {
        return ClaimDecision::WaitForScheduler;
    }
    ClaimDecision::Provision
}

/// Why a PVC cannot be provisioned (the `ProvisioningFailed` event message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A parameter problem.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// Stripping reserved keys failed.
    #[error("failed to strip CSI Parameters of prefixed keys: {0}")]
    Strip(ParamError),
    /// The driver cannot do it.
    #[error("{0}")]
    Capability(String),
    /// Anything else, upstream's wording.
    #[error("{0}")]
    Invalid(String),
    /// The data source cannot be used (yet): what the claim waits for,
    /// and upstream's wording.
    #[error("{message}")]
    Source {
        /// What the claim waits for.
        waiting_for: crate::debug::WaitingFor,
        /// Upstream's text.
        message: String,
    },
    /// `spec.selector` is set.
    #[error("claim Selector is not supported")]
    Selector,
    /// A data source this provisioner leaves to an external populator.
    #[error("data source ({0}) is not handled by the provisioner, assuming an external populator will provision it")]
    ExternalPopulator(String),
}

/// Everything needed to call `CreateVolume` and then build the PV.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// PV name = CSI volume name.
    pub pv_name: String,
    /// The request, without secrets (fetched by the executor).
    pub request: CreateVolumeRequest,
    /// The provisioner secret, fetched for CreateVolume and recorded for DeleteVolume.
    pub provisioner_secret: Option<SecretRef>,
    /// The other secret references for the PV.
    pub pv_secrets: BTreeMap<&'static str, SecretRef>,
    /// The ControllerModify secret, recorded in PV annotations.
    pub modify_secret: Option<SecretRef>,
    /// fsType for the PV (not for block volumes).
    pub fs_type: String,
    /// Requested bytes.
    pub requested_bytes: i64,
    /// `volumeMode: Block`.
    pub block: bool,
    /// The clone or restore source (`request.volume_content_source` is set
    /// by the executor once it checked the source).
    pub source: Option<PlanSource>,
}

/// Maps one PVC access mode to a CSI access mode (csi-lib-utils `accessmodes`).
pub fn csi_access_mode(
    mode: &str,
    single_node_multi_writer: bool,
) -> Result<volume_capability::access_mode::Mode, String> {
    use volume_capability::access_mode::Mode;
    Ok(match (mode, single_node_multi_writer) {
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOnce", false) => Mode::SingleNodeWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        // csi-lib-utils names the one-mode list it was given.
        (other, _) => return Err(format!("unsupported AccessMode combination: [{other}]")),
    })
}

/// Checks and prepares a provisioning (upstream `prepareProvision`), for the
/// parts that need no API reads besides the PVC and its StorageClass.
/// `source`: the claim's data source ([`sources::data_source`], checked
/// against ReferenceGrants when in another namespace); the content source
/// itself needs API reads and is filled in by the executor.
pub fn plan(
    pvc: &PersistentVolumeClaim,
    sc: &StorageClass,
    driver: &DriverInfo,
    s: &Settings,
    source: Option<&SourceRef>,
) -> Result<Plan, PlanError> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let source = match source {
        None => None,
        Some(src) => match sources::classify(pvc, src) {
            Ok(kind) => Some(PlanSource { kind, namespace: src.namespace.clone(), name: src.name.clone() }),
            Err(sources::SourceError::Populator(kind)) => return Err(PlanError::ExternalPopulator(kind)),
            Err(e) => return Err(PlanError::Invalid(e.to_string())),
        },
    };
    if !driver.has_plugin_service(Svc::ControllerService) {
        return Err(PlanError::Capability(
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
                .into(),
        ));
    }
    if !driver.has_controller_capability(Rpc::CreateDeleteVolume) {
        return Err(PlanError::Capability(
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
                .into(),
        ));
    }
    match source.as_ref().map(|s| s.kind) {
        Some(SourceKind::Snapshot) if !driver.has_controller_capability(Rpc::CreateDeleteSnapshot) => {
            return Err(PlanError::Capability(
                "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
                    .into(),
            ));
        }
        Some(SourceKind::Clone) if !driver.has_controller_capability(Rpc::CloneVolume) => {
            return Err(PlanError::Capability(
                "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
                    .into(),
            ));
        }
        _ => {}
    }
    if spec.selector.is_some() {
        return Err(PlanError::Selector);
    }
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let pv_name = volume_name(&s.volume_name_prefix, &uid, s.volume_name_uuid_length).map_err(PlanError::Invalid)?;
    let sc_params = sc.parameters.clone().unwrap_or_default();
    let fs_type = params::fs_type(&sc_params, &s.default_fstype)?;
    let requested_bytes = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| quantity::to_bytes(&q.0))
        .transpose()
        .map_err(|e| PlanError::Invalid(e.to_string()))?
        .unwrap_or(0);
    let block = spec.volume_mode.as_deref() == Some("Block");
    let snmw = driver.has_controller_capability(Rpc::SingleNodeMultiWriter);
    let mut caps = Vec::new();
    for mode in spec.access_modes.iter().flatten() {
        let mode = csi_access_mode(mode, snmw).map_err(PlanError::Invalid)?;
        let access_type = if block {
            volume_capability::AccessType::Block(volume_capability::BlockVolume {})
        } else {
            volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type: fs_type.clone(),
                mount_flags: sc.mount_options.clone().unwrap_or_default(),
                volume_mount_group: String::new(),
            })
        };
        caps.push(VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(access_type),
        });
    }
    let ctx = TemplateContext {
        pv_name: &pv_name,
        pvc_name: pvc.metadata.name.as_deref(),
        pvc_namespace: pvc.metadata.namespace.as_deref(),
        pvc_annotations: pvc.metadata.annotations.as_ref(),
    };
    let provisioner_secret = params::secret_ref(SecretKind::Provisioner, &sc_params, &ctx)?;
    let mut pv_secrets = BTreeMap::new();
    for (kind, field) in [
        (SecretKind::ControllerPublish, "controllerPublishSecretRef"),
        (SecretKind::NodeStage, "nodeStageSecretRef"),
        (SecretKind::NodePublish, "nodePublishSecretRef"),
        (SecretKind::ControllerExpand, "controllerExpandSecretRef"),
        (SecretKind::NodeExpand, "nodeExpandSecretRef"),
    ] {
        if let Some(r) = params::secret_ref(kind, &sc_params, &ctx)? {
            pv_secrets.insert(field, r);
        }
    }
    let modify_secret = params::secret_ref(SecretKind::ControllerModify, &sc_params, &ctx)?;
    let mut parameters = params::strip_reserved(&sc_params).map_err(PlanError::Strip)?;
    if s.extra_create_metadata {
        parameters.insert(params::PVC_NAME.into(), pvc.metadata.name.clone().unwrap_or_default());
        parameters.insert(params::PVC_NAMESPACE.into(), pvc.metadata.namespace.clone().unwrap_or_default());
        parameters.insert(params::PV_NAME.into(), pv_name.clone());
    }
    let request = CreateVolumeRequest {
        name: pv_name.clone(),
        capacity_range: Some(CapacityRange { required_bytes: requested_bytes, limit_bytes: 0 }),
        volume_capabilities: caps,
        parameters,
        ..Default::default()
    };
    Ok(Plan {
        pv_name,
        request,
        provisioner_secret,
        pv_secrets,
        modify_secret,
        fs_type,
        requested_bytes,
        block,
        source,
    })
}

/// How a failed `CreateVolume` is handled (upstream `checkError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateFailure {
    /// The operation may still be running in the driver: retry until a final
    /// answer, even if the PVC is deleted meanwhile (no leak).
    InBackground,
    /// Not running: give up for now (retried with backoff while the PVC exists).
    Final,
    /// Ask the scheduler for another node (remove `selected-node`).
    Reschedule,
}

/// Classifies a `CreateVolume` error.
pub fn classify_create_error(code: tonic::Code, may_reschedule: bool) -> CreateFailure {
    use tonic::Code::*;
    match code {
        ResourceExhausted if may_reschedule => CreateFailure::Reschedule,
        Cancelled | DeadlineExceeded | Unavailable | Aborted => CreateFailure::InBackground,
        _ => CreateFailure::Final,
    }
}

/// The `ProvisioningFailed` text of a failed `CreateVolume` (the provisioning
/// library's `provisionClaimOperation`): an infeasible request
/// (`InvalidArgument`, tried again only after `--retry-interval-max`) says
/// so; any other error is reported as it is.
pub fn create_error_text(code: tonic::Code, error: &str) -> String {
    if code == tonic::Code::InvalidArgument {
        format!("Volume provisioning failed with infeasible error. Retries will be delayed. {error}")
    } else {
        error.to_string()
    }
}

/// The `ProvisioningFailed` text of an unusable `CreateVolume` answer whose
/// volume could not be deleted again (upstream `Provision`, which writes
/// "cleanup" in lower case after a missing content source only).
pub fn orphaned_volume_text(why: &str, pv_name: &str, cleanup_error: &str) -> String {
    let cleanup = if why == ResponseError::NoContentSource.to_string() { "cleanup" } else { "Cleanup" };
    format!("{why}. {cleanup} of volume {pv_name} failed, volume is orphaned: {cleanup_error}")
}

/// The driver answered something that cannot become a PV.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// No volume in the answer.
    #[error("CreateVolume returned no volume")]
    NoVolume,
    /// Empty volume ID.
    #[error("CreateVolume returned a volume without an ID")]
    NoVolumeId,
    /// A clone or restore answered without saying what it was made from.
    #[error("volume content source missing")]
    NoContentSource,
    /// Smaller than requested.
    #[error("created volume capacity {got} less than requested capacity {want}")]
    TooSmall {
        /// Returned.
        got: i64,
        /// Requested.
        want: i64,
    },
}

/// Builds the PV for a successful `CreateVolume` (upstream `Provision` plus
/// what the provisioner library adds: claimRef, class, annotation, finalizer).
pub fn build_pv(
    plan: &Plan,
    resp: &csi::CreateVolumeResponse,
    pvc: &PersistentVolumeClaim,
    sc: &StorageClass,
    driver: &str,
    identity: &str,
    s: &Settings,
) -> Result<PersistentVolume, ResponseError> {
    let vol = resp.volume.as_ref().ok_or(ResponseError::NoVolume)?;
    if vol.volume_id.is_empty() {
        return Err(ResponseError::NoVolumeId);
    }
    let capacity = match vol.capacity_bytes {
        0 => plan.requested_bytes,
        c if c < plan.requested_bytes => return Err(ResponseError::TooSmall { got: c, want: plan.requested_bytes }),
        c => c,
    };
    if plan.source.is_some() && vol.content_source.is_none() {
        return Err(ResponseError::NoContentSource);
    }
    let mut attributes: BTreeMap<String, String> =
        BTreeMap::from([(upstream::IDENTITY_KEY.to_string(), identity.to_string())]);
    attributes.extend(vol.volume_context.iter().map(|(k, v)| (k.clone(), v.clone())));
    let only_rox = plan.request.volume_capabilities.len() == 1
        && plan.request.volume_capabilities[0].access_mode.as_ref().map(|m| m.mode)
            == Some(volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32);
    let secret = |field: &str| {
        plan.pv_secrets
            .get(field)
            .map(|r| SecretReference { name: Some(r.name.clone()), namespace: Some(r.namespace.clone()) })
    };
    let csi = CSIPersistentVolumeSource {
        driver: driver.to_string(),
        volume_handle: vol.volume_id.clone(),
        volume_attributes: Some(attributes),
        fs_type: (!plan.block).then(|| plan.fs_type.clone()).filter(|f| !f.is_empty()),
        read_only: (only_rox && s.controller_publish_readonly).then_some(true),
        controller_publish_secret_ref: secret("controllerPublishSecretRef"),
        node_stage_secret_ref: secret("nodeStageSecretRef"),
        node_publish_secret_ref: secret("nodePublishSecretRef"),
        controller_expand_secret_ref: secret("controllerExpandSecretRef"),
        node_expand_secret_ref: secret("nodeExpandSecretRef"),
    };
    let mut annotations = BTreeMap::from([
        (upstream::ANN_PROVISIONED_BY.to_string(), sc.provisioner.clone()),
        (
            upstream::ANN_DELETION_SECRET_NAME.to_string(),
            plan.provisioner_secret.as_ref().map(|r| r.name.clone()).unwrap_or_default(),
        ),
        (
            upstream::ANN_DELETION_SECRET_NAMESPACE.to_string(),
            plan.provisioner_secret.as_ref().map(|r| r.namespace.clone()).unwrap_or_default(),
        ),
    ]);
    if let Some(m) = &plan.modify_secret {
        annotations.insert(upstream::ANN_MODIFY_SECRET_NAME.into(), m.name.clone());
        annotations.insert(upstream::ANN_MODIFY_SECRET_NAMESPACE.into(), m.namespace.clone());
    }
    let reclaim = sc.reclaim_policy.clone().unwrap_or_else(|| "Delete".to_string());
    let spec = pvc.spec.clone().unwrap_or_default();
    let affinity = node_affinity(&vol.accessible_topology);
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.pv_name.clone()),
            annotations: Some(annotations),
            finalizers: (reclaim == "Delete").then(|| vec![upstream::PV_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            mount_options: sc.mount_options.clone(),
            capacity: Some(BTreeMap::from([("storage".to_string(), Quantity(quantity::from_bytes(capacity)))])),
            csi: Some(csi),
            persistent_volume_reclaim_policy: Some(reclaim),
            node_affinity: affinity,
            volume_mode: spec.volume_mode.clone(),
            storage_class_name: sc.metadata.name.clone(),
            volume_attributes_class_name: spec.volume_attributes_class_name.clone().filter(|v| !v.is_empty()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                name: pvc.metadata.name.clone(),
                namespace: pvc.metadata.namespace.clone(),
                uid: pvc.metadata.uid.clone(),
                resource_version: pvc.metadata.resource_version.clone(),
                field_path: None,
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// `nodeAffinity` with one term per accessible topology segment.
pub fn node_affinity(topology: &[csi::Topology]) -> Option<k8s_openapi::api::core::v1::VolumeNodeAffinity> {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity};
    if topology.is_empty() {
        return None;
    }
    let terms = topology
        .iter()
        .map(|t| {
            let mut segments: Vec<_> = t.segments.iter().collect();
            segments.sort();
            NodeSelectorTerm {
                match_expressions: Some(
                    segments
                        .into_iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    Some(VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) })
}

/// What to do with a PV.
#[derive(Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Not ours or nothing to do.
    Ignore,
    /// Protect the backend volume with the finalizer.
    AddFinalizer,
    /// Retain/Recycle: the backend volume is not ours to delete.
    RemoveFinalizer,
    /// Released with reclaim Delete: DeleteVolume, delete the PV, drop the finalizer.
    Delete,
}

/// The class a claim of `driver` is provisioned with: a class of the
/// in-tree plugin the driver is the CSI migration target of is translated
/// (`Some`, upstream `TranslateInTreeStorageClassToCSI`); any other class is
/// used as it is (`None`).
pub fn migrated_class(sc: &StorageClass, driver: &str) -> Result<Option<StorageClass>, String> {
    match Plugin::for_driver(driver) {
        Some(p) if sc.provisioner == p.in_tree_name() => migration::in_tree_class_to_csi(p.in_tree_name(), sc)
            .map(Some)
            .map_err(|e| format!("failed to translate storage class: {e}")),
        _ => Ok(None),
    }
}

/// The backend volume of a PV: its CSI handle, or that of its translated
/// in-tree source (CSI migration; `true` = migrated).
pub fn volume_handle(pv: &PersistentVolume) -> Result<(String, bool), String> {
    let spec = pv.spec.as_ref();
    if let Some(c) = spec.and_then(|s| s.csi.as_ref()) {
        return Ok((c.volume_handle.clone(), false));
    }
    // Upstream `Delete` returns the translation error as it is.
    let csi = migration::in_tree_pv_to_csi(pv).map_err(|e| e.to_string())?;
    Ok((csi.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap_or_default(), true))
}

/// The provisioner secret DeleteVolume is called with (upstream
/// `handleSecretsForDeletion` and `getSecretsFromSC`): the PV's
/// deletion-secret annotations when it has both (none when either is empty),
/// else the provisioner secret of its StorageClass, resolved for the PV's
/// claim reference. No class (`class` is `None` when it is gone) or no claim
/// reference: none, as upstream. A class whose secret parameters are broken
/// refuses the deletion (the `VolumeFailedDelete` text).
pub fn deletion_secret_ref(pv: &PersistentVolume, class: Option<&StorageClass>) -> Result<Option<SecretRef>, String> {
    let ann = |k: &str| pv.metadata.annotations.as_ref().and_then(|a| a.get(k));
    if let (Some(name), Some(namespace)) =
        (ann(upstream::ANN_DELETION_SECRET_NAME), ann(upstream::ANN_DELETION_SECRET_NAMESPACE))
    {
        let both = !name.is_empty() && !namespace.is_empty();
        return Ok(both.then(|| SecretRef { name: name.clone(), namespace: namespace.clone() }));
    }
    let (Some(class), Some(claim)) = (class, pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())) else {
        return Ok(None);
    };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let ctx = TemplateContext {
        pv_name,
        pvc_name: claim.name.as_deref(),
        pvc_namespace: claim.namespace.as_deref(),
        pvc_annotations: None,
    };
    let params = class.parameters.clone().unwrap_or_default();
    params::secret_ref(SecretKind::Provisioner, &params, &ctx)
        .map_err(|e| format!("failed to get secretreference for volume {pv_name}: {e}"))
}

/// Decides for a PV provisioned by `driver` (upstream `shouldDelete` + the
/// finalizer rules).
pub fn decide_volume(pv: &PersistentVolume, driver: &str) -> VolumeDecision {
    let Some(spec) = pv.spec.as_ref() else { return VolumeDecision::Ignore };
    let ann = |k: &str| pv.metadata.annotations.as_ref().and_then(|a| a.get(k)).map(String::as_str);
    let provisioned_by = ann(upstream::ANN_PROVISIONED_BY);
    // Dynamically provisioned volumes: provisioned by the driver; a migrated
    // in-tree volume by the plugin's name (or annotated as migrated to the
    // driver).
    let in_tree = Plugin::for_driver(driver).map(Plugin::in_tree_name);
    let provisioned = provisioned_by == Some(driver)
        || (provisioned_by.is_some() && provisioned_by == in_tree && migration::is_migrated_to(pv, driver))
        || (provisioned_by.is_some() && ann(upstream::ANN_MIGRATED_TO) == Some(driver));
    // Statically provisioned ones name the driver in spec.csi (upstream's
    // HonorPVReclaimPolicy, KEP-2644): protected while bound, and deleted
    // only when they carry the finalizer.
    let made_by_hand = provisioned_by.is_none() && spec.csi.as_ref().is_some_and(|c| c.driver == driver);
    if !provisioned && !made_by_hand {
        return VolumeDecision::Ignore;
    }
    let has_finalizer = pv.metadata.finalizers.iter().flatten().any(|f| f == upstream::PV_FINALIZER);
    let reclaim = spec.persistent_volume_reclaim_policy.as_deref().unwrap_or("Delete");
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let deleting = pv.metadata.deletion_timestamp.is_some();
    match (reclaim, released, has_finalizer) {
        ("Delete", true, false) if made_by_hand => VolumeDecision::Ignore,
        ("Delete", true, _) => VolumeDecision::Delete,
        ("Delete", false, false) if !deleting => VolumeDecision::AddFinalizer,
        ("Delete", false, _) => VolumeDecision::Ignore,
        (_, _, true) => VolumeDecision::RemoveFinalizer,
        _ => VolumeDecision::Ignore,
    }
}

#[cfg(test)]
mod tests;
