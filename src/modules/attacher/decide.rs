//! Attacher decisions: pure, table-tested.

use std::collections::HashMap;

use k8s_openapi::{
    api::{
        core::v1::PersistentVolume,
        storage::v1::{CSINode, VolumeAttachment},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::{
    compat::{attacher as upstream, provisioner},
    csi::{
        DriverInfo,
        proto::csi::v1::{
            ControllerPublishVolumeRequest, VolumeCapability, controller_service_capability::rpc::Type as Rpc,
            plugin_capability::service::Type as Svc, volume_capability,
        },
    },
    k8s::{cached::CachedVa, informers::Change},
};

/// Which handler the driver's capabilities call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// No controller service or no PUBLISH_UNPUBLISH_VOLUME: mark attached.
    Trivial,
    /// ControllerPublish/Unpublish.
    Csi,
}

/// Upstream's handler choice.
pub fn handler(driver: &DriverInfo) -> Handler {
    if driver.has_plugin_service(Svc::ControllerService)
        && driver.has_controller_capability(Rpc::PublishUnpublishVolume)
    {
        Handler::Csi
    } else {
        Handler::Trivial
    }
}

/// What to do with a VolumeAttachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaAction {
    /// Not ours, or nothing to do.
    Ignore,
    /// ControllerPublish (or, trivial handler, just mark attached).
    Attach,
    /// ControllerUnpublish, then drop the finalizer.
    Detach,
}

fn attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

fn has_finalizer(va: &VolumeAttachment, finalizer: &str) -> bool {
    va.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Decides for a VolumeAttachment. `forced`: the reconciler saw the driver
/// disagree with `status.attached`.
pub fn decide_va(va: &VolumeAttachment, driver: &str, handler: Handler, forced: bool) -> VaAction {
    if va.spec.attacher != driver {
        return VaAction::Ignore;
    }
    let finalizer = upstream::finalizer(driver);
    if va.metadata.deletion_timestamp.is_some() {
        return match handler {
            Handler::Csi if has_finalizer(va, &finalizer) => VaAction::Detach,
            _ => VaAction::Ignore,
        };
    }
    if !attached(va) || forced { VaAction::Attach } else { VaAction::Ignore }
}

/// One CSI access mode for all of a PV's access modes (csi-lib-utils rules).
pub fn combined_access_mode(
    modes: &[String],
    single_node_multi_writer: bool,
) -> Result<volume_capability::access_mode::Mode, String> {
    use volume_capability::access_mode::Mode;
    let has = |m: &str| modes.iter().any(|x| x == m);
    if has("ReadWriteOncePod") {
        if modes.len() > 1 {
            return Err("CSI does not support ReadWriteOncePod with other PersistentVolumeAccessModes".into());
        }
        return Ok(if single_node_multi_writer { Mode::SingleNodeSingleWriter } else { Mode::SingleNodeWriter });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has("ReadOnlyMany"), has("ReadWriteOnce")) {
        (true, true) => Err("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume".into()),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) => {
            Ok(if single_node_multi_writer { Mode::SingleNodeMultiWriter } else { Mode::SingleNodeWriter })
        }
        (false, false) => Err(format!("unsupported AccessMode combination: {modes:?}")),
    }
}

/// The node ID of `driver` in a CSINode.
pub fn node_id(csinode: Option<&CSINode>, node: &str, driver: &str) -> Result<String, String> {
    let csinode = csinode.ok_or_else(|| format!("csinode.storage.k8s.io \"{node}\" not found"))?;
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .and_then(|d| d.node_id.clone().into())
        .filter(|id: &String| !id.is_empty())
        .ok_or_else(|| format!("CSINode {node} does not contain driver {driver}"))
}

/// The node ID for a detach: the CSINode's, else the annotation saved at attach.
pub fn detach_node_id(va: &VolumeAttachment, csinode: Option<&CSINode>, driver: &str) -> Result<String, String> {
    node_id(csinode, &va.spec.node_name, driver)
        .or_else(|e| va.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_NODE_ID)).cloned().ok_or(e))
}

/// The `ControllerPublishVolume` request (without secrets, fetched by the executor).
pub fn publish_request(
    pv: &PersistentVolume,
    node_id: &str,
    driver: &DriverInfo,
    default_fstype: &str,
) -> Result<ControllerPublishVolumeRequest, String> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.as_ref().ok_or_else(|| format!("PersistentVolume {name} has no spec"))?;
    let csi = spec.csi.as_ref().ok_or_else(|| format!("PersistentVolume {name} is not a CSI volume"))?;
    let mode = combined_access_mode(
        spec.access_modes.as_deref().unwrap_or_default(),
        driver.has_controller_capability(Rpc::SingleNodeMultiWriter),
    )?;
    let access_type = if spec.volume_mode.as_deref() == Some("Block") {
        volume_capability::AccessType::Block(volume_capability::BlockVolume {})
    } else {
        let fs = csi.fs_type.clone().filter(|f| !f.is_empty()).unwrap_or_else(|| default_fstype.to_string());
        volume_capability::AccessType::Mount(volume_capability::MountVolume {
            fs_type: fs,
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            volume_mount_group: String::new(),
        })
    };
    Ok(ControllerPublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: node_id.to_string(),
        volume_capability: Some(VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(access_type),
        }),
        readonly: csi.read_only.unwrap_or(false) && driver.has_controller_capability(Rpc::PublishReadonly),
        secrets: HashMap::new(),
        volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
    })
}

/// Where a VolumeAttachment's volume is described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A PersistentVolume, by name.
    Pv(String),
    /// `spec.source.inlineVolumeSpec` (an inline volume the attach-detach
    /// controller translated for CSI migration): it has no PV, so no PV
    /// finalizer.
    Inline,
}

/// Which source describes the volume: exactly one of a PV name and an inline
/// CSI spec (upstream's rule; both or neither is an error).
pub fn volume_source(va: &VolumeAttachment) -> Result<VolumeSource, String> {
    let name = va.metadata.name.as_deref().unwrap_or_default();
    let src = &va.spec.source;
    match (&src.persistent_volume_name, &src.inline_volume_spec) {
        (Some(pv), None) if !pv.is_empty() => Ok(VolumeSource::Pv(pv.clone())),
        (None, Some(spec)) if spec.csi.is_some() => Ok(VolumeSource::Inline),
        (None, Some(_)) => Err(format!("VolumeAttachment {name}: the inline volume spec has no CSI source")),
        (Some(_), Some(_)) => {
            Err(format!("VolumeAttachment {name}: both persistentVolumeName and inlineVolumeSpec are set"))
        }
        _ => Err(format!("VolumeAttachment {name}: neither persistentVolumeName nor inlineVolumeSpec is set")),
    }
}

/// The volume of an inline source as a PersistentVolume without metadata
/// other than a name for messages (the VolumeAttachment's).
pub fn inline_volume(va: &VolumeAttachment) -> Option<PersistentVolume> {
    let spec = va.spec.source.inline_volume_spec.clone()?;
    let metadata = ObjectMeta { name: va.metadata.name.clone(), ..Default::default() };
    Some(PersistentVolume { metadata, spec: Some(spec), status: None })
}

/// The PV in the form the driver is called with ([`crate::migration::csi_form`]),
/// its translation error in upstream's words.
pub fn csi_form(pv: PersistentVolume, driver: &str) -> Result<(PersistentVolume, bool), String> {
    crate::migration::csi_form(pv, driver).map_err(|e| format!("failed to translate in tree pv to CSI: {e}"))
}

/// Whether the PV finalizer can go: no VolumeAttachment of the driver
/// references the PV, and the PV is being deleted or is an in-tree PV whose
/// `pv.kubernetes.io/migrated-to` does not name the driver (upstream: CSI
/// migration is off for it, so the attacher gives it back to
/// kube-controller-manager; a statically created in-tree PV never carries
/// the annotation, so it loses the finalizer once detached).
pub fn pv_finalizer_removable(pv: &PersistentVolume, referenced: bool, finalizer: &str, driver: &str) -> bool {
    let in_tree = pv.spec.as_ref().is_some_and(|s| s.csi.is_none() && crate::migration::Plugin::of_spec(s).is_some());
    let migrated_to = pv.metadata.annotations.as_ref().and_then(|a| a.get(provisioner::ANN_MIGRATED_TO));
    let handed_back = in_tree && migrated_to.map(String::as_str) != Some(driver);
    (pv.metadata.deletion_timestamp.is_some() || handed_back)
        && !referenced
        && pv.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Whether a change of a VolumeAttachment needs a sync. Changes this
/// module makes itself and that need no action are filtered out: only the
/// attach/detach error, the attachment metadata, or this driver's own
/// finalizer and node-id annotation changed. Re-syncing on those would retry
/// a failed attach at once, bypassing its backoff (upstream filters the
/// error fields the same way).
pub fn va_change_needs_sync(old: &CachedVa, new: &CachedVa, finalizer: &str) -> bool {
    let (om, nm) = (&old.metadata, &new.metadata);
    let others = |f: &Option<Vec<String>>| -> Vec<String> {
        f.iter().flatten().filter(|x| x.as_str() != finalizer).cloned().collect()
    };
    let other_annotations = |a: &Option<std::collections::BTreeMap<String, String>>| {
        a.iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != upstream::ANN_NODE_ID)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    let attached = |v: &CachedVa| v.status.as_ref().is_some_and(|s| s.attached);
    let spec = |v: &CachedVa| {
        (
            v.spec.attacher.clone(),
            v.spec.node_name.clone(),
            v.spec.source.persistent_volume_name.clone(),
            v.spec.source.inline_volume_spec.is_some(),
        )
    };
    om.deletion_timestamp != nm.deletion_timestamp
        || spec(old) != spec(new)
        || attached(old) != attached(new)
        || others(&om.finalizers) != others(&nm.finalizers)
        || other_annotations(&om.annotations) != other_annotations(&nm.annotations)
}

/// What one change of a VolumeAttachment of the driver queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VaWork {
    /// Attach (or mark attached) this attachment.
    pub attach: Option<String>,
    /// Detach this attachment (it is being deleted).
    pub detach: Option<String>,
    /// Sync this PV: its attacher finalizer may be removable now.
    pub pv: Option<String>,
    /// This attachment is gone: forget what is kept about it.
    pub gone: Option<String>,
}

/// The queue keys for a change of a VolumeAttachment. A change this module
/// wrote itself and that needs no action ([`va_change_needs_sync`]) queues
/// nothing. A deletion queues the attachment's PV, as upstream: the detach
/// queues it too, but may run before the cache lost the attachment, and then
/// only this deletion tells the PV's sync that its finalizer can go.
pub fn va_work(change: &Change<'_, CachedVa>, finalizer: &str) -> VaWork {
    let va = match change {
        Change::Deleted(va) => {
            return VaWork {
                pv: va.pv_name().filter(|p| !p.is_empty()).map(String::from),
                gone: va.metadata.name.clone(),
                ..VaWork::default()
            };
        }
        Change::Updated { old, new } if !va_change_needs_sync(old, new, finalizer) => return VaWork::default(),
        c => c.object(),
    };
    let key = va.metadata.name.clone().unwrap_or_default();
    if va.metadata.deletion_timestamp.is_some() {
        VaWork { detach: Some(key), ..VaWork::default() }
    } else {
        VaWork { attach: Some(key), ..VaWork::default() }
    }
}

/// What the ListVolumes reconciler does with one attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconcile {
    /// The status agrees with the driver (or the attachment is going away
    /// and already unpublished).
    InSync,
    /// `status.attached` disagrees with the driver: sync again, forced.
    Resync,
    /// Being deleted but still published: detach again.
    Detach,
}

/// The reconciler's decision for an attachment from its status and
/// whether the driver reports the volume published on its node.
pub fn reconcile(attached: bool, deleting: bool, is_published: bool) -> Reconcile {
    match (deleting, attached == is_published, is_published) {
        (true, _, true) => Reconcile::Detach,
        (true, _, false) => Reconcile::InSync,
        (false, true, _) => Reconcile::InSync,
        (false, false, _) => Reconcile::Resync,
    }
}

#[cfg(test)]
mod tests;
