//! Data sources of a claim (upstream external-provisioner's `dataSource`,
//! `getPVCSource`, `getSnapshotSource`, `IsGranted`, the cloning-protection
//! controller and the snapshot-finalizer sweep): pure functions over the
//! objects the executor read, table-tested. Every error text is upstream's.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::{
    compat::provisioner as upstream,
    csi::proto::csi::v1::{VolumeContentSource, volume_content_source},
    k8s::{
        cached::CachedPvc,
        quantity,
        reference_grant::ReferenceGrant,
        snapshot_api::{self, VolumeSnapshot, VolumeSnapshotContent},
    },
};

/// The data source a claim names, normalised from `spec.dataSource` or
/// `spec.dataSourceRef` (upstream's `dataSource`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRef {
    /// Kind (`PersistentVolumeClaim`, `VolumeSnapshot`, or a populator's).
    pub kind: String,
    /// API group (`""`: core, or none given).
    pub api_group: String,
    /// Name (may be empty: refused by [`classify`]).
    pub name: String,
    /// Namespace: the claim's, or `dataSourceRef.namespace`.
    pub namespace: String,
}

/// What the provisioner does with a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// Clone a PVC: `content_source.volume`.
    Clone,
    /// Restore a VolumeSnapshot: `content_source.snapshot`.
    Snapshot,
}

/// A resolved source as the plan records it (the in-flight bookkeeping and
/// the protection controllers read it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSource {
    /// Clone or restore.
    pub kind: SourceKind,
    /// The source object's namespace.
    pub namespace: String,
    /// The source object's name.
    pub name: String,
}

impl PlanSource {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why the source is refused (upstream's texts).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// `dataSourceRef.namespace` without the feature gate.
    #[error("dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled")]
    CrossNamespaceDisabled,
    /// No ReferenceGrant allows it.
    #[error("accessing {namespace}/{name} of {kind} dataSource from {claim_namespace}/{claim_name} isn't allowed")]
    NotGranted {
        /// Source namespace.
        namespace: String,
        /// Source name.
        name: String,
        /// Source kind.
        kind: String,
        /// Claim namespace.
        claim_namespace: String,
        /// Claim name.
        claim_name: String,
    },
    /// A source without a name.
    #[error("the PVC source not found for PVC {0}")]
    NoName(String),
    /// A VolumeSnapshot of another API group.
    #[error("the PVC source does not belong to the right APIGroup. Expected {expected}, Got {got}")]
    WrongGroup {
        /// The snapshot group.
        expected: &'static str,
        /// What the claim said.
        got: String,
    },
    /// A kind an external populator handles (not an error upstream: the
    /// claim is left alone).
    #[error("data source ({0}) is not handled by the provisioner, assuming an external populator will provision it")]
    Populator(String),
}

fn meta_name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.metadata.name.as_deref().unwrap_or_default()
}

fn meta_ns(pvc: &PersistentVolumeClaim) -> &str {
    pvc.metadata.namespace.as_deref().unwrap_or_default()
}

/// `spec.dataSource`, else `spec.dataSourceRef` (whose namespace needs the
/// gate `CrossNamespaceVolumeDataSource`); `None` without either.
pub fn data_source(pvc: &PersistentVolumeClaim, cross_namespace_gate: bool) -> Result<Option<SourceRef>, SourceError> {
    let Some(spec) = pvc.spec.as_ref() else { return Ok(None) };
    if let Some(ds) = &spec.data_source {
        return Ok(Some(SourceRef {
            kind: ds.kind.clone(),
            api_group: ds.api_group.clone().unwrap_or_default(),
            name: ds.name.clone(),
            namespace: meta_ns(pvc).to_string(),
        }));
    }
    let Some(r) = &spec.data_source_ref else { return Ok(None) };
    let ns = r.namespace.as_deref().filter(|n| !n.is_empty());
    if ns.is_some() && !cross_namespace_gate {
        return Err(SourceError::CrossNamespaceDisabled);
    }
    Ok(Some(SourceRef {
        kind: r.kind.clone(),
        api_group: r.api_group.clone().unwrap_or_default(),
        name: r.name.clone(),
        namespace: ns.unwrap_or(meta_ns(pvc)).to_string(),
    }))
}

/// Whether a ReferenceGrant of the source's namespace lets this claim use a
/// source in another namespace (upstream `IsGranted`).
pub fn check_granted(
    pvc: &PersistentVolumeClaim,
    src: &SourceRef,
    grants: &[ReferenceGrant],
) -> Result<(), SourceError> {
    let claim_ns = meta_ns(pvc);
    let allowed = grants.iter().filter(|g| g.metadata.namespace.as_deref() == Some(src.namespace.as_str())).any(|g| {
        let from_ok =
            g.spec.from.iter().any(|f| f.group.is_empty() && f.kind == upstream::KIND_PVC && f.namespace == claim_ns);
        from_ok
            && g.spec.to.iter().any(|t| {
                t.group == src.api_group
                    && t.kind == src.kind
                    && t.name.as_deref().is_none_or(|n| n.is_empty() || n == src.name)
            })
    });
    if allowed {
        return Ok(());
    }
    Err(SourceError::NotGranted {
        namespace: src.namespace.clone(),
        name: src.name.clone(),
        kind: src.kind.clone(),
        claim_namespace: claim_ns.to_string(),
        claim_name: meta_name(pvc).to_string(),
    })
}

/// Clone, restore, or someone else's (`Populator`).
pub fn classify(pvc: &PersistentVolumeClaim, src: &SourceRef) -> Result<SourceKind, SourceError> {
    if src.name.is_empty() {
        return Err(SourceError::NoName(meta_name(pvc).to_string()));
    }
    match src.kind.as_str() {
        upstream::KIND_SNAPSHOT if src.api_group != snapshot_api::GROUP => {
            Err(SourceError::WrongGroup { expected: snapshot_api::GROUP, got: src.api_group.clone() })
        }
        upstream::KIND_SNAPSHOT => Ok(SourceKind::Snapshot),
        upstream::KIND_PVC => Ok(SourceKind::Clone),
        other => Err(SourceError::Populator(other.to_string())),
    }
}

/// The `ProvisioningFailed` text of a source that cannot be used now
/// (retried: the source may become usable).
pub fn handle_error(kind: &str, name: &str, why: &str) -> String {
    format!("error getting handle for DataSource Type {kind} by Name {name}: {why}")
}

/// Why the clone source claim could not be read (upstream `getPVCSource`,
/// which reads it from its lister: a missing claim is the lister's
/// `persistentvolumeclaim "<name>" not found`, not the apiserver's plural).
pub fn source_claim_error(name: &str, claim_namespace: &str, not_found: bool, api_error: &str) -> String {
    let why = if not_found { format!("persistentvolumeclaim \"{name}\" not found") } else { api_error.to_string() };
    format!("error getting PVC {name} (namespace {claim_namespace:?}) from api server: {why}")
}

fn requested_bytes(pvc: &PersistentVolumeClaim) -> Option<i64> {
    let q = pvc.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage")?;
    Some(quantity::to_bytes(&q.0).unwrap_or(0))
}

const NOT_BOUND_OR_INVALID: &str = "claim in dataSource not bound or invalid";

/// Checks a clone source (upstream `getPVCSource`): `source` is the source
/// claim as read, `pv` its volume (`None`: could not be read).
pub fn clone_source(
    claim: &PersistentVolumeClaim,
    sc_provisioner: &str,
    source: &PersistentVolumeClaim,
    pv: Option<&PersistentVolume>,
) -> Result<VolumeContentSource, String> {
    let src_name = meta_name(source);
    let phase = source.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    if phase != "Bound" {
        return Err(format!("the PVC DataSource {src_name} must have a status of Bound.  Got {{Phase:{phase}}}"));
    }
    if source.metadata.deletion_timestamp.is_some() {
        return Err(format!("the PVC DataSource {src_name} is currently being deleted"));
    }
    let src_spec = source.spec.clone().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    if src_spec.storage_class_name.is_none() {
        return Err(format!("the source PVC ({src_name}) storageclass cannot be empty"));
    }
    if spec.storage_class_name.is_none() {
        return Err(format!("the requested PVC ({}) storageclass cannot be empty", meta_name(claim)));
    }
    let (want, have) = (requested_bytes(claim).unwrap_or(0), requested_bytes(source).unwrap_or(0));
    if want < have {
        return Err(format!(
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {want} but source is {have}"
        ));
    }
    if src_spec.volume_name.as_deref().is_none_or(str::is_empty) {
        return Err(format!("volume name is empty in source PVC {src_name}"));
    }
    let Some(pv) = pv else { return Err(NOT_BOUND_OR_INVALID.into()) };
    let pv_spec = pv.spec.clone().unwrap_or_default();
    let Some(csi) = pv_spec.csi.as_ref() else { return Err(NOT_BOUND_OR_INVALID.into()) };
    if csi.driver != sc_provisioner {
        return Err(NOT_BOUND_OR_INVALID.into());
    }
    let Some(claim_ref) = pv_spec.claim_ref.as_ref() else { return Err(NOT_BOUND_OR_INVALID.into()) };
    if claim_ref.uid != source.metadata.uid
        || claim_ref.namespace != source.metadata.namespace
        || claim_ref.name != source.metadata.name
    {
        return Err(NOT_BOUND_OR_INVALID.into());
    }
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(NOT_BOUND_OR_INVALID.into());
    }
    let claim_block = spec.volume_mode.as_deref() == Some("Block");
    let source_block = pv_spec.volume_mode.as_deref() == Some("Block");
    let source_filesystem = pv_spec.volume_mode.as_deref().is_none_or(|m| m == "Filesystem");
    if !claim_block && !source_filesystem {
        return Err("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem".into());
    }
    if claim_block && !source_block {
        return Err("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block".into());
    }
    Ok(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(volume_content_source::VolumeSource {
            volume_id: csi.volume_handle.clone(),
        })),
    })
}

/// Whether a snapshot may be restored from at all: one being deleted only
/// if a restore already started (it carries the provisioner's finalizer).
pub fn snapshot_usable(snapshot: &VolumeSnapshot) -> Result<(), String> {
    let protected = snapshot.metadata.finalizers.iter().flatten().any(|f| f == upstream::SNAPSHOT_SOURCE_FINALIZER);
    if snapshot.metadata.deletion_timestamp.is_some() && !protected {
        return Err(format!("snapshot {} is being deleted", snapshot.metadata.name.as_deref().unwrap_or_default()));
    }
    Ok(())
}

/// The content a snapshot is bound to, by name, if it says one.
pub fn bound_content_name(snapshot: &VolumeSnapshot) -> Option<&str> {
    snapshot.status.as_ref()?.bound_volume_snapshot_content_name.as_deref()
}

/// Checks a snapshot source (upstream `getSnapshotSource`, after
/// [`snapshot_usable`]): `content` is the bound content as read (`None`:
/// none, or it could not be read).
pub fn snapshot_source(
    claim: &PersistentVolumeClaim,
    sc_provisioner: &str,
    snapshot: &VolumeSnapshot,
    content: Option<&VolumeSnapshotContent>,
    prevent_volume_mode_conversion: bool,
) -> Result<VolumeContentSource, String> {
    let name = snapshot.metadata.name.as_deref().unwrap_or_default();
    let not_bound = || format!("snapshot {name} not bound");
    if bound_content_name(snapshot).is_none() {
        return Err(not_bound());
    }
    let Some(content) = content else { return Err(not_bound()) };
    let r = &content.spec.volume_snapshot_ref;
    if r.uid != snapshot.metadata.uid || r.namespace != snapshot.metadata.namespace || r.name != snapshot.metadata.name
    {
        return Err(not_bound());
    }
    if content.spec.driver != sc_provisioner {
        return Err(not_bound());
    }
    let status = snapshot.status.as_ref();
    if status.and_then(|s| s.ready_to_use) != Some(true) {
        return Err(format!("snapshot {name} is not Ready"));
    }
    let Some(handle) = content.status.as_ref().and_then(|s| s.snapshot_handle.clone()) else {
        return Err(format!("snapshot handle {name} is not available"));
    };
    if let Some(restore) = status.and_then(|s| s.restore_size.as_ref()) {
        let Some(want) = requested_bytes(claim) else {
            return Err(format!("error getting capacity for PVC {} when creating snapshot {name}", meta_name(claim)));
        };
        let restore = quantity::to_bytes(&restore.0).unwrap_or(0);
        if want < restore {
            return Err(format!(
                "requested volume size {want} is less than the size {restore} for the source snapshot {name}"
            ));
        }
    }
    let claim_mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    if prevent_volume_mode_conversion
        && let (Some(source_mode), Some(claim_mode)) = (content.spec.source_volume_mode.as_deref(), claim_mode)
        && source_mode != claim_mode
    {
        let content_name = content.metadata.name.as_deref().unwrap_or_default();
        let prefix = format!(
            "requested volume {}/{} modifies the mode of the source volume but does not have permission to do so.",
            meta_ns(claim),
            meta_name(claim)
        );
        let ann = upstream::ANN_ALLOW_VOLUME_MODE_CHANGE;
        match content.metadata.annotations.as_ref().and_then(|a| a.get(ann)) {
            None => return Err(format!("{prefix} {ann} annotation is not present on snapshotcontent {content_name}")),
            Some(v) => match crate::flags::goflags::parse_go_bool(v) {
                Err(_) => {
                    return Err(format!(
                        "{prefix} failed to convert {ann} annotation value to boolean with error: strconv.ParseBool: parsing {v:?}: invalid syntax"
                    ));
                }
                Ok(false) => return Err(format!("{prefix} {ann} is set to false on snapshotcontent {content_name}")),
                Ok(true) => {}
            },
        }
    }
    Ok(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
            snapshot_id: handle,
        })),
    })
}

/// The source a claim still waiting for a volume refers to, as
/// `(kind, namespace, name)`: `spec.dataSource`, or `spec.dataSourceRef`
/// (with its namespace). Kinds other than clones and restores: `None`.
pub fn referenced_source(c: &CachedPvc) -> Option<(SourceKind, String, String)> {
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let spec = c.spec.as_ref()?;
    let kind_of = |kind: &str, group: Option<&str>| match kind {
        upstream::KIND_PVC if group.is_none_or(str::is_empty) => Some(SourceKind::Clone),
        upstream::KIND_SNAPSHOT if group.is_none_or(|g| g == snapshot_api::GROUP) => Some(SourceKind::Snapshot),
        _ => None,
    };
    if let Some(ds) = &spec.data_source {
        return Some((kind_of(&ds.kind, ds.api_group.as_deref())?, ns, ds.name.clone()));
    }
    let r = spec.data_source_ref.as_ref()?;
    let ns = r.namespace.clone().filter(|n| !n.is_empty()).unwrap_or(ns);
    Some((kind_of(&r.kind, r.api_group.as_deref())?, ns, r.name.clone()))
}

/// Whether a claim waits for a volume made from a clone or restore source
/// (the view the protection controllers read).
pub fn waits_for_source(c: &CachedPvc) -> bool {
    is_pending(c) && referenced_source(c).is_some()
}

/// Whether a claim is still waiting for its volume (phase `Pending`, or no
/// phase yet).
pub fn is_pending(c: &CachedPvc) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|p| p.is_empty() || p == "Pending")
}

/// What the cloning-protection controller does with a source claim.
#[derive(Debug, PartialEq, Eq)]
pub enum CloneProtection {
    /// Nothing: no finalizer, or the source is not being deleted.
    Nothing,
    /// A clone still needs it (the claim or the in-flight create named):
    /// look again later.
    Wait(String),
    /// Remove the finalizer.
    Release,
}

/// Upstream's rule: the finalizer goes once the source is being deleted and
/// no claim waiting for a volume clones it. Here also: no CreateVolume of
/// a clone whose claim is gone is still unfinished (`in_flight`: the keys
/// `namespace/name` of the sources of unfinished creates).
pub fn clone_protection<'a>(
    source: &CachedPvc,
    pending: impl IntoIterator<Item = &'a CachedPvc>,
    in_flight: &[String],
) -> CloneProtection {
    let has = source.metadata.finalizers.iter().flatten().any(|f| f == upstream::CLONE_FINALIZER);
    if !has || source.metadata.deletion_timestamp.is_none() {
        return CloneProtection::Nothing;
    }
    let ns = source.metadata.namespace.clone().unwrap_or_default();
    let name = source.metadata.name.clone().unwrap_or_default();
    for c in pending {
        if is_pending(c) && referenced_source(c) == Some((SourceKind::Clone, ns.clone(), name.clone())) {
            return CloneProtection::Wait(format!(
                "PVC '{}' is in 'Pending' state, cloning in progress",
                c.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    let key = format!("{ns}/{name}");
    if in_flight.contains(&key) {
        return CloneProtection::Wait("a CreateVolume cloning it is unfinished".into());
    }
    CloneProtection::Release
}

/// After a restore's PV was saved: why the snapshot `key` (`namespace/name`)
/// still needs the provisioner's finalizer, `None` when it does not. It
/// does while another claim waiting for a volume restores from it or an
/// unfinished CreateVolume (`in_flight`: the source keys of unfinished
/// creates) does. `provisioned` tells the claims whose volume exists
/// already (the claim just restored, and others whose PV is saved): they
/// stay `Pending` until the binder binds them but no longer read the
/// snapshot. (Upstream releases the snapshot after any one restore.)
pub fn snapshot_still_needed<'a>(
    key: &str,
    pending: impl IntoIterator<Item = &'a CachedPvc>,
    in_flight: &[String],
    provisioned: impl Fn(&CachedPvc) -> bool,
) -> Option<String> {
    for c in pending {
        if !is_pending(c) || provisioned(c) {
            continue;
        }
        if let Some((SourceKind::Snapshot, ns, name)) = referenced_source(c)
            && format!("{ns}/{name}") == key
        {
            return Some(format!(
                "PVC '{}/{}' waits for a volume restored from it",
                c.metadata.namespace.as_deref().unwrap_or_default(),
                c.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    in_flight.iter().any(|k| k == key).then(|| "a CreateVolume restoring from it is unfinished".to_string())
}

/// The snapshot-finalizer sweep: the `namespace/name` keys of `snapshots`
/// (those carrying the provisioner's finalizer) that no claim waiting for a
/// volume and no unfinished CreateVolume (`in_flight`) restores from.
pub fn orphaned_snapshots<'a>(
    snapshots: impl IntoIterator<Item = &'a VolumeSnapshot>,
    pending: impl IntoIterator<Item = &'a CachedPvc>,
    in_flight: &[String],
) -> Vec<String> {
    let needed: std::collections::HashSet<String> = pending
        .into_iter()
        .filter(|c| is_pending(c))
        .filter_map(referenced_source)
        .filter(|(k, _, _)| *k == SourceKind::Snapshot)
        .map(|(_, ns, name)| format!("{ns}/{name}"))
        .chain(in_flight.iter().cloned())
        .collect();
    snapshots
        .into_iter()
        .filter(|s| s.metadata.finalizers.iter().flatten().any(|f| f == upstream::SNAPSHOT_SOURCE_FINALIZER))
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .filter(|k| !needed.contains(k))
        .collect()
}

#[cfg(test)]
mod tests;
