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
    compat::{attacher as up, provisioner as prov},
    csi::{
        DriverInfo,
        proto::csi::v1::{
            ControllerPublishVolumeRequest, VolumeCapability, controller_service_capability::rpc::Type as Rpc,
            plugin_capability::service::Type as Svc, volume_capability,
        },
    },
    kube::cached::CachedVa,
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
    let finalizer = up::finalizer(driver);
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
        .or_else(|e| va.metadata.annotations.as_ref().and_then(|a| a.get(up::ANN_NODE_ID)).cloned().ok_or(e))
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
    let migrated_to = pv.metadata.annotations.as_ref().and_then(|a| a.get(prov::ANN_MIGRATED_TO));
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
            .filter(|(k, _)| k.as_str() != up::ANN_NODE_ID)
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
mod tests {
    use k8s_openapi::{
        api::{
            core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec},
            storage::v1::{
                CSINodeDriver, CSINodeSpec, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
            },
        },
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
        jiff::Timestamp,
    };

    use super::*;

    const D: &str = "hostpath.csi.k8s.io";

    fn driver(caps: &[Rpc]) -> DriverInfo {
        DriverInfo::with_capabilities(D, &[Svc::ControllerService], caps)
    }

    fn va(attacher: &str, attached: bool, deleting: bool, finalizer: bool) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some("csi-123".into()),
                deletion_timestamp: deleting.then(|| Time(Timestamp::now())),
                finalizers: finalizer.then(|| vec![up::finalizer(attacher)]),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: attacher.into(),
                node_name: "node-1".into(),
                source: VolumeAttachmentSource { persistent_volume_name: Some("pv-1".into()), ..Default::default() },
            },
            status: Some(VolumeAttachmentStatus { attached, ..Default::default() }),
        }
    }

    #[test]
    fn names() {
        assert_eq!(up::finalizer(D), "external-attacher/hostpath-csi-k8s-io");
        assert_eq!(
            crate::kube::leader::sanitize_lease_name(&up::lease_lock_name(D)),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
    }

    #[test]
    fn volume_source_table() {
        let csi_spec = || PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: D.into(), volume_handle: "h".into(), ..Default::default() }),
            ..Default::default()
        };
        let with = |pv: Option<&str>, inline: Option<PersistentVolumeSpec>| {
            let mut v = va(D, false, false, false);
            v.spec.source =
                VolumeAttachmentSource { persistent_volume_name: pv.map(Into::into), inline_volume_spec: inline };
            v
        };
        assert_eq!(volume_source(&with(Some("pv-1"), None)), Ok(VolumeSource::Pv("pv-1".into())));
        assert_eq!(volume_source(&with(None, Some(csi_spec()))), Ok(VolumeSource::Inline));
        let err = |v: &VolumeAttachment| volume_source(v).unwrap_err();
        assert!(err(&with(None, None)).contains("neither"), "{}", err(&with(None, None)));
        assert!(err(&with(Some(""), None)).contains("neither"));
        assert!(err(&with(Some("pv-1"), Some(csi_spec()))).contains("both"));
        let in_tree = PersistentVolumeSpec::default();
        assert!(err(&with(None, Some(in_tree))).contains("no CSI source"));
        // Errors name the object.
        assert!(err(&with(None, None)).contains("csi-123"));

        let inline = inline_volume(&with(None, Some(csi_spec()))).unwrap();
        assert_eq!(inline.metadata.name.as_deref(), Some("csi-123"));
        let req = publish_request(&inline, "node-id", &driver(&[Rpc::PublishUnpublishVolume]), "ext4");
        // No access modes on the inline spec: an error naming the combination, not a panic.
        assert!(req.is_err());
    }

    #[test]
    fn handler_choice() {
        assert_eq!(handler(&driver(&[Rpc::PublishUnpublishVolume])), Handler::Csi);
        assert_eq!(handler(&driver(&[Rpc::CreateDeleteVolume])), Handler::Trivial);
        let mut no_ctrl = driver(&[Rpc::PublishUnpublishVolume]);
        no_ctrl.plugin_capabilities.clear();
        assert_eq!(handler(&no_ctrl), Handler::Trivial);
    }

    #[test]
    fn va_decisions() {
        use Handler::*;
        use VaAction::*;
        let table = [
            (va("other", false, false, false), Csi, false, Ignore),
            (va(D, false, false, false), Csi, false, Attach),
            (va(D, true, false, true), Csi, false, Ignore),
            (va(D, true, false, true), Csi, true, Attach),
            (va(D, true, true, true), Csi, false, Detach),
            (va(D, true, true, false), Csi, false, Ignore),
            (va(D, false, false, false), Trivial, false, Attach),
            (va(D, true, true, false), Trivial, false, Ignore),
        ];
        for (v, h, forced, want) in table {
            assert_eq!(decide_va(&v, D, h, forced), want, "{:?} {h:?} forced={forced}", v.status);
        }
    }

    #[test]
    fn access_mode_combinations() {
        use volume_capability::access_mode::Mode;
        let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(combined_access_mode(&m(&["ReadWriteOnce"]), false), Ok(Mode::SingleNodeWriter));
        assert_eq!(combined_access_mode(&m(&["ReadWriteOnce"]), true), Ok(Mode::SingleNodeMultiWriter));
        assert_eq!(combined_access_mode(&m(&["ReadOnlyMany"]), false), Ok(Mode::MultiNodeReaderOnly));
        assert_eq!(combined_access_mode(&m(&["ReadWriteMany", "ReadOnlyMany"]), false), Ok(Mode::MultiNodeMultiWriter));
        assert!(combined_access_mode(&m(&["ReadWriteOnce", "ReadOnlyMany"]), false).is_err());
        assert!(combined_access_mode(&m(&["ReadWriteOncePod", "ReadOnlyMany"]), false).is_err());
        assert_eq!(combined_access_mode(&m(&["ReadWriteOncePod"]), true), Ok(Mode::SingleNodeSingleWriter));
        assert!(combined_access_mode(&m(&[]), false).is_err());
    }

    fn csinode(drivers: &[(&str, &str)]) -> CSINode {
        CSINode {
            metadata: ObjectMeta { name: Some("node-1".into()), ..Default::default() },
            spec: CSINodeSpec {
                drivers: drivers
                    .iter()
                    .map(|(n, id)| CSINodeDriver { name: n.to_string(), node_id: id.to_string(), ..Default::default() })
                    .collect(),
            },
        }
    }

    #[test]
    fn node_ids() {
        assert_eq!(node_id(Some(&csinode(&[(D, "n1")])), "node-1", D), Ok("n1".into()));
        assert!(
            node_id(Some(&csinode(&[("other", "x")])), "node-1", D).unwrap_err().contains("does not contain driver")
        );
        assert!(node_id(None, "node-1", D).unwrap_err().contains("not found"));
        let mut v = va(D, true, true, true);
        v.metadata.annotations = Some([(up::ANN_NODE_ID.to_string(), "saved".to_string())].into());
        assert_eq!(detach_node_id(&v, None, D), Ok("saved".into()), "annotation fallback on detach");
        assert_eq!(detach_node_id(&v, Some(&csinode(&[(D, "live")])), D), Ok("live".into()));
    }

    fn pv(modes: &[&str], readonly: bool, block: bool) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta { name: Some("pv-1".into()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                mount_options: Some(vec!["ro".into()]),
                volume_mode: block.then(|| "Block".into()),
                csi: Some(CSIPersistentVolumeSource {
                    driver: D.into(),
                    volume_handle: "vol-1".into(),
                    read_only: Some(readonly),
                    volume_attributes: Some([("k".to_string(), "v".to_string())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn publish_requests() {
        let r = publish_request(
            &pv(&["ReadWriteOnce"], true, false),
            "n1",
            &driver(&[Rpc::PublishUnpublishVolume]),
            "ext4",
        )
        .unwrap();
        assert_eq!((r.volume_id.as_str(), r.node_id.as_str()), ("vol-1", "n1"));
        assert!(!r.readonly, "readonly only with PUBLISH_READONLY");
        assert_eq!(r.volume_context["k"], "v");
        let Some(volume_capability::AccessType::Mount(m)) = r.volume_capability.unwrap().access_type else { panic!() };
        assert_eq!(m.fs_type, "ext4", "--default-fstype when the PV has none");
        assert_eq!(m.mount_flags, vec!["ro".to_string()]);
        let r = publish_request(
            &pv(&["ReadOnlyMany"], true, true),
            "n1",
            &driver(&[Rpc::PublishUnpublishVolume, Rpc::PublishReadonly]),
            "",
        )
        .unwrap();
        assert!(r.readonly);
        assert!(matches!(r.volume_capability.unwrap().access_type, Some(volume_capability::AccessType::Block(_))));
        assert!(
            publish_request(&pv(&["ReadWriteOnce", "ReadOnlyMany"], false, false), "n1", &driver(&[]), "").is_err()
        );
    }

    #[test]
    fn own_writes_do_not_resync_an_attachment() {
        use k8s_openapi::{
            api::storage::v1::{VolumeAttachmentStatus, VolumeError},
            apimachinery::pkg::apis::meta::v1::Time,
        };
        let fin = "external-attacher/driver";
        let base = || {
            let mut va = CachedVa::default();
            va.metadata.name = Some("va".into());
            va.spec.node_name = "node".into();
            va.spec.source.persistent_volume_name = Some("pv".into());
            va
        };
        type Edit = fn(&mut CachedVa);
        let table: &[(&str, Edit, bool)] = &[
            ("nothing but the resourceVersion", |v| v.metadata.resource_version = Some("2".into()), false),
            (
                "attachError written",
                |v| {
                    v.status = Some(VolumeAttachmentStatus {
                        attach_error: Some(VolumeError { message: Some("boom".into()), ..Default::default() }),
                        ..Default::default()
                    })
                },
                false,
            ),
            ("our finalizer added", |v| v.metadata.finalizers = Some(vec!["external-attacher/driver".into()]), false),
            (
                "our node-id annotation added",
                |v| v.metadata.annotations = Some([(up::ANN_NODE_ID.to_string(), "n1".to_string())].into()),
                false,
            ),
            ("another finalizer added", |v| v.metadata.finalizers = Some(vec!["example.com/x".into()]), true),
            (
                "deletion requested",
                |v| v.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                true,
            ),
            (
                "attached flipped",
                |v| v.status = Some(VolumeAttachmentStatus { attached: true, ..Default::default() }),
                true,
            ),
            ("node changed", |v| v.spec.node_name = "other".into(), true),
        ];
        for (what, edit, want) in table {
            let old = base();
            let mut new = base();
            edit(&mut new);
            assert_eq!(va_change_needs_sync(&old, &new, fin), *want, "{what}");
        }
    }

    #[test]
    fn reconciler_decisions() {
        use Reconcile::*;
        // (attached, deleting, published) → action
        for (attached, deleting, published, want) in [
            (true, false, true, InSync),
            (false, false, false, InSync),
            (true, false, false, Resync),
            (false, false, true, Resync),
            (true, true, true, Detach),
            (false, true, true, Detach),
            (true, true, false, InSync),
            (false, true, false, InSync),
        ] {
            assert_eq!(reconcile(attached, deleting, published), want, "{attached} {deleting} {published}");
        }
    }

    #[test]
    fn in_tree_pvs_are_translated_for_their_target() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"},
            "spec": {"gcePersistentDisk": {"pdName": "disk-1"}, "accessModes": ["ReadWriteOnce"]}}))
        .unwrap();
        let (t, migrated) = csi_form(pv.clone(), "pd.csi.storage.gke.io").unwrap();
        assert!(migrated);
        assert_eq!(t.spec.unwrap().csi.unwrap().volume_handle, "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1");
        // Another driver: left alone (the publish request refuses it).
        let (same, migrated) = csi_form(pv, "ebs.csi.aws.com").unwrap();
        assert!(!migrated && same.spec.unwrap().csi.is_none());
        let bad: PersistentVolume = serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-2"},
            "spec": {"azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Shared"}}}))
        .unwrap();
        assert_eq!(
            csi_form(bad, "disk.csi.azure.com").unwrap_err(),
            "failed to translate in tree pv to CSI: kind(Shared) is not supported in csi migration"
        );
    }

    #[test]
    fn the_pv_finalizer_goes_when_deleted_or_handed_back_and_unreferenced() {
        const CINDER: &str = "cinder.csi.openstack.org";
        let fin = up::finalizer(CINDER);
        let pv = |csi: bool, deleting: bool, migrated_to: Option<&str>| -> PersistentVolume {
            let source = if csi {
                serde_json::json!({"csi": {"driver": CINDER, "volumeHandle": "v"}})
            } else {
                serde_json::json!({"cinder": {"volumeID": "v"}})
            };
            let mut pv: PersistentVolume =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "pv"}, "spec": source})).unwrap();
            pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into(), fin.clone()]);
            pv.metadata.deletion_timestamp = deleting.then_some(Time(Timestamp::UNIX_EPOCH));
            pv.metadata.annotations = migrated_to.map(|d| [(prov::ANN_MIGRATED_TO.to_string(), d.to_string())].into());
            pv
        };
        // (case, pv, referenced by a VolumeAttachment, removable)
        let table = [
            ("CSI PV being deleted", pv(true, true, None), false, true),
            ("CSI PV being deleted, still attached", pv(true, true, None), true, false),
            ("CSI PV in use", pv(true, false, None), false, false),
            ("in-tree PV migrated to the driver", pv(false, false, Some(CINDER)), false, false),
            ("in-tree PV migrated to the driver, deleted", pv(false, true, Some(CINDER)), false, true),
            ("in-tree PV without migrated-to (static, or migration off)", pv(false, false, None), false, true),
            ("in-tree PV migrated to another driver", pv(false, false, Some("other.example.com")), false, true),
            ("in-tree PV handed back but still attached", pv(false, false, None), true, false),
        ];
        for (case, pv, referenced, want) in table {
            assert_eq!(pv_finalizer_removable(&pv, referenced, &fin, CINDER), want, "{case}");
        }
        let mut without = pv(true, true, None);
        without.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
        assert!(!pv_finalizer_removable(&without, false, &fin, CINDER), "no finalizer of ours");
    }
}
