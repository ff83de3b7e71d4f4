//! Tables of the attacher decisions.

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
            finalizers: finalizer.then(|| vec![upstream::finalizer(attacher)]),
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
    assert_eq!(upstream::finalizer(D), "external-attacher/hostpath-csi-k8s-io");
    assert_eq!(
        crate::k8s::leader::sanitize_lease_name(&upstream::lease_lock_name(D)),
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
    assert!(node_id(Some(&csinode(&[("other", "x")])), "node-1", D).unwrap_err().contains("does not contain driver"));
    assert!(node_id(None, "node-1", D).unwrap_err().contains("not found"));
    let mut v = va(D, true, true, true);
    v.metadata.annotations = Some([(upstream::ANN_NODE_ID.to_string(), "saved".to_string())].into());
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
    let r =
        publish_request(&pv(&["ReadWriteOnce"], true, false), "n1", &driver(&[Rpc::PublishUnpublishVolume]), "ext4")
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
    assert!(publish_request(&pv(&["ReadWriteOnce", "ReadOnlyMany"], false, false), "n1", &driver(&[]), "").is_err());
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
            |v| v.metadata.annotations = Some([(upstream::ANN_NODE_ID.to_string(), "n1".to_string())].into()),
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
    let fin = upstream::finalizer(CINDER);
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
        pv.metadata.annotations =
            migrated_to.map(|d| [(provisioner::ANN_MIGRATED_TO.to_string(), d.to_string())].into());
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

#[test]
fn what_a_change_of_an_attachment_queues() {
    let fin = "external-attacher/driver";
    let va = |deleting: bool, pv: Option<&str>| {
        let mut va = CachedVa::default();
        va.metadata.name = Some("va".into());
        va.metadata.deletion_timestamp = deleting.then_some(Time(Timestamp::UNIX_EPOCH));
        va.spec.source.persistent_volume_name = pv.map(String::from);
        va
    };
    let (live, deleting, inline) = (va(false, Some("pv")), va(true, Some("pv")), va(true, None));
    let mut ours = live.clone();
    ours.metadata.resource_version = Some("2".into());
    let some = |s: &str| Some(s.to_string());
    let attach = VaWork { attach: some("va"), ..VaWork::default() };
    let detach = VaWork { detach: some("va"), ..VaWork::default() };
    let table = [
        ("added", Change::Added(&live), attach.clone()),
        ("resync", Change::Resync(&live), attach.clone()),
        ("deletion requested", Change::Updated { old: &live, new: &deleting }, detach.clone()),
        ("added while being deleted", Change::Added(&deleting), detach),
        ("our own write", Change::Updated { old: &live, new: &ours }, VaWork::default()),
        (
            "deleted: its PV may lose the finalizer",
            Change::Deleted(&deleting),
            VaWork { pv: some("pv"), gone: some("va"), ..VaWork::default() },
        ),
        (
            "deleted inline attachment: no PV",
            Change::Deleted(&inline),
            VaWork { gone: some("va"), ..VaWork::default() },
        ),
    ];
    for (case, change, want) in table {
        assert_eq!(va_work(&change, fin), want, "{case}");
    }
}
