use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec, PersistentVolumeStatus, TypedLocalObjectReference, TypedObjectReference,
        VolumeResourceRequirements,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
};

use super::*;
use crate::k8s::{
    reference_grant::{GrantFrom, GrantTo, ReferenceGrantSpec},
    snapshot_api::{
        SnapshotRef, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotSpec, VolumeSnapshotStatus,
    },
};

const DRIVER: &str = "mock.csi.example.com";
const SNAP_GROUP: &str = "snapshot.storage.k8s.io";

fn meta(ns: &str, name: &str, uid: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), uid: Some(uid.into()), ..Default::default() }
}

fn claim(size: &str, mode: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta("team-a", "clone", "uid-clone"),
        spec: Some(PersistentVolumeClaimSpec {
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size.into()))])),
                ..Default::default()
            }),
            storage_class_name: Some("fast".into()),
            volume_mode: mode.map(Into::into),
            ..Default::default()
        }),
        status: None,
    }
}

fn with_source(mut c: PersistentVolumeClaim, group: Option<&str>, kind: &str, name: &str) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().data_source =
        Some(TypedLocalObjectReference { api_group: group.map(Into::into), kind: kind.into(), name: name.into() });
    c
}

fn with_ref(
    mut c: PersistentVolumeClaim,
    group: Option<&str>,
    kind: &str,
    name: &str,
    ns: Option<&str>,
) -> PersistentVolumeClaim {
    c.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
        api_group: group.map(Into::into),
        kind: kind.into(),
        name: name.into(),
        namespace: ns.map(Into::into),
    });
    c
}

fn source_claim(size: &str) -> PersistentVolumeClaim {
    let mut c = claim(size, Some("Filesystem"));
    c.metadata = meta("team-a", "src", "uid-src");
    c.spec.as_mut().unwrap().volume_name = Some("pv-src".into());
    c.status = Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), ..Default::default() });
    c
}

fn source_pv(mode: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some("pv-src".into()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "vol-src".into(),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                name: Some("src".into()),
                namespace: Some("team-a".into()),
                uid: Some("uid-src".into()),
                ..Default::default()
            }),
            volume_mode: mode.map(Into::into),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus { phase: Some("Bound".into()), ..Default::default() }),
    }
}

#[test]
fn data_source_normalisation() {
    let c = claim("1Gi", None);
    assert_eq!(data_source(&c, false), Ok(None));
    let ds = with_source(c.clone(), None, "PersistentVolumeClaim", "src");
    assert_eq!(
        data_source(&ds, false).unwrap(),
        Some(SourceRef {
            kind: "PersistentVolumeClaim".into(),
            api_group: "".into(),
            name: "src".into(),
            namespace: "team-a".into()
        })
    );
    // dataSourceRef in the claim's namespace needs no gate.
    let same = with_ref(c.clone(), Some(SNAP_GROUP), "VolumeSnapshot", "snap", None);
    assert_eq!(data_source(&same, false).unwrap().unwrap().namespace, "team-a");
    let empty_ns = with_ref(c.clone(), Some(SNAP_GROUP), "VolumeSnapshot", "snap", Some(""));
    assert_eq!(data_source(&empty_ns, false).unwrap().unwrap().namespace, "team-a");
    // Another namespace: refused without the gate, upstream's text.
    let other = with_ref(c.clone(), Some(SNAP_GROUP), "VolumeSnapshot", "snap", Some("team-b"));
    let err = data_source(&other, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    );
    assert_eq!(data_source(&other, true).unwrap().unwrap().namespace, "team-b");
    // dataSource wins over dataSourceRef (the apiserver keeps them equal).
    let both =
        with_ref(with_source(c, None, "PersistentVolumeClaim", "a"), None, "PersistentVolumeClaim", "b", Some("x"));
    assert_eq!(data_source(&both, false).unwrap().unwrap().name, "a");
}

fn grant(ns: &str, from_ns: &str, to_group: &str, to_kind: &str, to_name: Option<&str>) -> ReferenceGrant {
    ReferenceGrant {
        metadata: ObjectMeta { name: Some("g".into()), namespace: Some(ns.into()), ..Default::default() },
        spec: ReferenceGrantSpec {
            from: vec![GrantFrom { group: "".into(), kind: "PersistentVolumeClaim".into(), namespace: from_ns.into() }],
            to: vec![GrantTo { group: to_group.into(), kind: to_kind.into(), name: to_name.map(Into::into) }],
        },
    }
}

#[test]
fn reference_grants() {
    let c = with_ref(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", "snap", Some("team-b"));
    let src = data_source(&c, true).unwrap().unwrap();
    let ok = |gs: &[ReferenceGrant]| check_granted(&c, &src, gs);
    let denied = "accessing team-b/snap of VolumeSnapshot dataSource from team-a/clone isn't allowed";
    assert_eq!(ok(&[]).unwrap_err().to_string(), denied);
    assert_eq!(ok(&[grant("team-b", "team-a", SNAP_GROUP, "VolumeSnapshot", None)]), Ok(()));
    assert_eq!(ok(&[grant("team-b", "team-a", SNAP_GROUP, "VolumeSnapshot", Some(""))]), Ok(()));
    assert_eq!(ok(&[grant("team-b", "team-a", SNAP_GROUP, "VolumeSnapshot", Some("snap"))]), Ok(()));
    for g in [
        grant("team-b", "team-a", SNAP_GROUP, "VolumeSnapshot", Some("other")),
        grant("team-b", "team-c", SNAP_GROUP, "VolumeSnapshot", None),
        grant("team-b", "team-a", "", "VolumeSnapshot", None),
        grant("team-b", "team-a", SNAP_GROUP, "PersistentVolumeClaim", None),
        // A grant must live in the source's namespace.
        grant("team-a", "team-a", SNAP_GROUP, "VolumeSnapshot", None),
    ] {
        assert_eq!(ok(std::slice::from_ref(&g)).unwrap_err().to_string(), denied, "{g:?}");
    }
    let mut wrong_from = grant("team-b", "team-a", SNAP_GROUP, "VolumeSnapshot", None);
    wrong_from.spec.from[0].kind = "Pod".into();
    assert!(ok(&[wrong_from]).is_err());
}

#[test]
fn classification() {
    let c = claim("1Gi", None);
    let src = |kind: &str, group: &str, name: &str| SourceRef {
        kind: kind.into(),
        api_group: group.into(),
        name: name.into(),
        namespace: "team-a".into(),
    };
    assert_eq!(classify(&c, &src("PersistentVolumeClaim", "", "s")), Ok(SourceKind::Clone));
    assert_eq!(classify(&c, &src("VolumeSnapshot", SNAP_GROUP, "s")), Ok(SourceKind::Snapshot));
    assert_eq!(
        classify(&c, &src("VolumeSnapshot", "example.com", "s")).unwrap_err().to_string(),
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com"
    );
    assert_eq!(
        classify(&c, &src("PersistentVolumeClaim", "", "")).unwrap_err().to_string(),
        "the PVC source not found for PVC clone"
    );
    assert_eq!(classify(&c, &src("Backup", "example.com", "b")), Err(SourceError::Populator("Backup".into())));
}

#[test]
fn unreadable_clone_sources() {
    let rows = [
        (true, "", "error getting PVC src (namespace \"ns\") from api server: persistentvolumeclaim \"src\" not found"),
        (
            false,
            "Internal error occurred: etcd timeout",
            "error getting PVC src (namespace \"ns\") from api server: Internal error occurred: etcd timeout",
        ),
    ];
    for (not_found, api_error, want) in rows {
        assert_eq!(source_claim_error("src", "ns", not_found, api_error), want);
    }
}

#[test]
fn clone_checks() {
    let vol = |r: Result<VolumeContentSource, String>| match r.map(|c| c.r#type) {
        Ok(Some(volume_content_source::Type::Volume(v))) => Ok(v.volume_id),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    };
    let c = claim("2Gi", Some("Filesystem"));
    let src = source_claim("2Gi");
    let pv = source_pv(Some("Filesystem"));
    assert_eq!(vol(clone_source(&c, DRIVER, &src, Some(&pv))), Ok("vol-src".into()));
    // Larger than the source is fine; no volumeMode on either side means Filesystem.
    assert!(clone_source(&claim("3Gi", None), DRIVER, &src, Some(&source_pv(None))).is_ok());

    let not_bound_or_invalid = Err("claim in dataSource not bound or invalid".to_string());
    let mut pending = src.clone();
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    let mut deleting = src.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    let mut no_class = src.clone();
    no_class.spec.as_mut().unwrap().storage_class_name = None;
    let mut claim_no_class = c.clone();
    claim_no_class.spec.as_mut().unwrap().storage_class_name = None;
    let mut unbound = src.clone();
    unbound.spec.as_mut().unwrap().volume_name = None;
    let mut other_driver = pv.clone();
    other_driver.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other".into();
    let mut not_csi = pv.clone();
    not_csi.spec.as_mut().unwrap().csi = None;
    let mut no_claim_ref = pv.clone();
    no_claim_ref.spec.as_mut().unwrap().claim_ref = None;
    let mut other_claim = pv.clone();
    other_claim.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("uid-other".into());
    let mut released = pv.clone();
    released.status.as_mut().unwrap().phase = Some("Released".into());
    let block = source_pv(Some("Block"));
    type Case<'a> =
        (&'a str, PersistentVolumeClaim, PersistentVolumeClaim, Option<&'a PersistentVolume>, Result<String, String>);
    let cases: Vec<Case> = vec![
        ("source pending", c.clone(), pending, Some(&pv), Err("the PVC DataSource src must have a status of Bound.  Got {Phase:Pending}".into())),
        ("source deleting", c.clone(), deleting, Some(&pv), Err("the PVC DataSource src is currently being deleted".into())),
        ("source without class", c.clone(), no_class, Some(&pv), Err("the source PVC (src) storageclass cannot be empty".into())),
        ("clone without class", claim_no_class, src.clone(), Some(&pv), Err("the requested PVC (clone) storageclass cannot be empty".into())),
        (
            "smaller than the source",
            claim("1Gi", Some("Filesystem")),
            src.clone(),
            Some(&pv),
            Err("error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1073741824 but source is 2147483648".into()),
        ),
        ("source without volume", c.clone(), unbound, Some(&pv), Err("volume name is empty in source PVC src".into())),
        ("PV unreadable", c.clone(), src.clone(), None, not_bound_or_invalid.clone()),
        ("PV of another driver", c.clone(), src.clone(), Some(&other_driver), not_bound_or_invalid.clone()),
        ("PV not CSI", c.clone(), src.clone(), Some(&not_csi), not_bound_or_invalid.clone()),
        ("PV without claimRef", c.clone(), src.clone(), Some(&no_claim_ref), not_bound_or_invalid.clone()),
        ("PV bound elsewhere", c.clone(), src.clone(), Some(&other_claim), not_bound_or_invalid.clone()),
        ("PV released", c.clone(), src.clone(), Some(&released), not_bound_or_invalid.clone()),
        (
            "Block source, Filesystem clone",
            c.clone(),
            src.clone(),
            Some(&block),
            Err("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem".into()),
        ),
        (
            "Filesystem source, Block clone",
            claim("2Gi", Some("Block")),
            src.clone(),
            Some(&pv),
            Err("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block".into()),
        ),
        ("Block to Block", claim("2Gi", Some("Block")), src.clone(), Some(&block), Ok("vol-src".into())),
    ];
    for (what, claim, source, pv, want) in cases {
        assert_eq!(vol(clone_source(&claim, DRIVER, &source, pv)), want, "{what}");
    }
}

fn snapshot(ready: Option<bool>, restore: Option<&str>) -> VolumeSnapshot {
    VolumeSnapshot {
        metadata: meta("team-a", "snap", "uid-snap"),
        spec: VolumeSnapshotSpec::default(),
        status: Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: Some("content".into()),
            ready_to_use: ready,
            restore_size: restore.map(|r| Quantity(r.into())),
            ..Default::default()
        }),
    }
}

fn content(mode: Option<&str>, allow: Option<&str>) -> VolumeSnapshotContent {
    VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some("content".into()),
            annotations: allow
                .map(|v| BTreeMap::from([(upstream::ANN_ALLOW_VOLUME_MODE_CHANGE.to_string(), v.to_string())])),
            ..Default::default()
        },
        spec: VolumeSnapshotContentSpec {
            volume_snapshot_ref: SnapshotRef {
                name: Some("snap".into()),
                namespace: Some("team-a".into()),
                uid: Some("uid-snap".into()),
                ..Default::default()
            },
            driver: DRIVER.into(),
            source_volume_mode: mode.map(Into::into),
            ..Default::default()
        },
        status: Some(VolumeSnapshotContentStatus { snapshot_handle: Some("snap-handle".into()), ..Default::default() }),
    }
}

#[test]
fn snapshot_checks() {
    let id = |r: Result<VolumeContentSource, String>| match r.map(|c| c.r#type) {
        Ok(Some(volume_content_source::Type::Snapshot(s))) => Ok(s.snapshot_id),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    };
    let c = claim("1Gi", Some("Filesystem"));
    let ready = snapshot(Some(true), Some("1Gi"));
    let fs = content(Some("Filesystem"), None);
    assert_eq!(id(snapshot_source(&c, DRIVER, &ready, Some(&fs), true)), Ok("snap-handle".into()));
    // Larger than restoreSize is the driver's business; no restoreSize, no check.
    assert!(snapshot_source(&claim("5Gi", Some("Filesystem")), DRIVER, &ready, Some(&fs), true).is_ok());
    assert!(snapshot_source(&c, DRIVER, &snapshot(Some(true), None), Some(&fs), true).is_ok());

    let not_bound = Err("snapshot snap not bound".to_string());
    let mut unbound = ready.clone();
    unbound.status.as_mut().unwrap().bound_volume_snapshot_content_name = None;
    let mut no_status = ready.clone();
    no_status.status = None;
    let mut other_snapshot = fs.clone();
    other_snapshot.spec.volume_snapshot_ref.uid = Some("uid-other".into());
    let mut other_driver = fs.clone();
    other_driver.spec.driver = "other".into();
    let mut no_handle = fs.clone();
    no_handle.status = None;
    let mut no_request = c.clone();
    no_request.spec.as_mut().unwrap().resources = None;
    let block = content(Some("Block"), None);
    let conversion =
        "requested volume team-a/clone modifies the mode of the source volume but does not have permission to do so.";
    let ann = upstream::ANN_ALLOW_VOLUME_MODE_CHANGE;
    type Case<'a> =
        (&'a str, PersistentVolumeClaim, VolumeSnapshot, Option<VolumeSnapshotContent>, bool, Result<String, String>);
    let cases: Vec<Case> = vec![
        ("no bound content", c.clone(), unbound, Some(fs.clone()), true, not_bound.clone()),
        ("no status", c.clone(), no_status, Some(fs.clone()), true, not_bound.clone()),
        ("content unreadable", c.clone(), ready.clone(), None, true, not_bound.clone()),
        ("content of another snapshot", c.clone(), ready.clone(), Some(other_snapshot), true, not_bound.clone()),
        ("content of another driver", c.clone(), ready.clone(), Some(other_driver), true, not_bound.clone()),
        (
            "not ready",
            c.clone(),
            snapshot(Some(false), Some("1Gi")),
            Some(fs.clone()),
            true,
            Err("snapshot snap is not Ready".into()),
        ),
        (
            "readiness unknown",
            c.clone(),
            snapshot(None, Some("1Gi")),
            Some(fs.clone()),
            true,
            Err("snapshot snap is not Ready".into()),
        ),
        (
            "no handle",
            c.clone(),
            ready.clone(),
            Some(no_handle),
            true,
            Err("snapshot handle snap is not available".into()),
        ),
        (
            "smaller than restoreSize",
            claim("512Mi", Some("Filesystem")),
            ready.clone(),
            Some(fs.clone()),
            true,
            Err("requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap".into()),
        ),
        (
            "no request",
            no_request,
            ready.clone(),
            Some(fs.clone()),
            true,
            Err("error getting capacity for PVC clone when creating snapshot snap".into()),
        ),
        (
            "mode change without annotation",
            c.clone(),
            ready.clone(),
            Some(block.clone()),
            true,
            Err(format!("{conversion} {ann} annotation is not present on snapshotcontent content")),
        ),
        (
            "mode change, annotation false",
            c.clone(),
            ready.clone(),
            Some(content(Some("Block"), Some("false"))),
            true,
            Err(format!("{conversion} {ann} is set to false on snapshotcontent content")),
        ),
        (
            "mode change, annotation garbage",
            c.clone(),
            ready.clone(),
            Some(content(Some("Block"), Some("maybe"))),
            true,
            Err(format!(
                "{conversion} failed to convert {ann} annotation value to boolean with error: strconv.ParseBool: parsing \"maybe\": invalid syntax"
            )),
        ),
        (
            "mode change allowed",
            c.clone(),
            ready.clone(),
            Some(content(Some("Block"), Some("true"))),
            true,
            Ok("snap-handle".into()),
        ),
        (
            "mode change, conversion not prevented",
            c.clone(),
            ready.clone(),
            Some(block.clone()),
            false,
            Ok("snap-handle".into()),
        ),
        ("source mode unknown", c.clone(), ready.clone(), Some(content(None, None)), true, Ok("snap-handle".into())),
    ];
    for (what, claim, snap, content, prevent, want) in cases {
        assert_eq!(id(snapshot_source(&claim, DRIVER, &snap, content.as_ref(), prevent)), want, "{what}");
    }
}

#[test]
fn deleting_snapshots() {
    let mut s = snapshot(Some(true), None);
    assert_eq!(snapshot_usable(&s), Ok(()));
    s.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert_eq!(snapshot_usable(&s), Err("snapshot snap is being deleted".into()));
    // A restore that started before the deletion goes on.
    s.metadata.finalizers = Some(vec![upstream::SNAPSHOT_SOURCE_FINALIZER.into()]);
    assert_eq!(snapshot_usable(&s), Ok(()));
}

fn cached(c: &PersistentVolumeClaim, phase: Option<&str>) -> CachedPvc {
    let mut v = serde_json::to_value(c).unwrap();
    if let Some(p) = phase {
        v["status"] = serde_json::json!({"phase": p});
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn referenced_sources() {
    let c = claim("1Gi", None);
    assert_eq!(referenced_source(&cached(&c, None)), None);
    let clone = with_source(c.clone(), None, "PersistentVolumeClaim", "src");
    assert_eq!(referenced_source(&cached(&clone, None)), Some((SourceKind::Clone, "team-a".into(), "src".into())));
    let restore = with_ref(c.clone(), Some(SNAP_GROUP), "VolumeSnapshot", "snap", Some("team-b"));
    assert_eq!(
        referenced_source(&cached(&restore, None)),
        Some((SourceKind::Snapshot, "team-b".into(), "snap".into()))
    );
    let nogroup = with_source(c.clone(), None, "VolumeSnapshot", "snap");
    assert_eq!(referenced_source(&cached(&nogroup, None)).map(|r| r.0), Some(SourceKind::Snapshot));
    let populator = with_source(c, Some("example.com"), "Backup", "b");
    assert_eq!(referenced_source(&cached(&populator, None)), None);
}

#[test]
fn cloning_protection() {
    let mut src = source_claim("1Gi");
    src.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into(), upstream::CLONE_FINALIZER.into()]);
    let live = cached(&src, Some("Bound"));
    let mut deleting_full = src.clone();
    deleting_full.metadata.deletion_timestamp = Some(Time(Default::default()));
    let deleting = cached(&deleting_full, Some("Bound"));
    let mut unprotected_full = deleting_full.clone();
    unprotected_full.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
    let unprotected = cached(&unprotected_full, Some("Bound"));

    let clone = with_source(claim("1Gi", None), None, "PersistentVolumeClaim", "src");
    let pending = cached(&clone, Some("Pending"));
    let no_phase = cached(&clone, None);
    let bound = cached(&clone, Some("Bound"));
    let mut elsewhere_full = clone.clone();
    elsewhere_full.metadata.namespace = Some("team-b".into());
    let elsewhere = cached(&elsewhere_full, Some("Pending"));
    let other_source = cached(&with_source(claim("1Gi", None), None, "PersistentVolumeClaim", "x"), Some("Pending"));
    let wait = CloneProtection::Wait("PVC 'clone' is in 'Pending' state, cloning in progress".into());
    let none: [&CachedPvc; 0] = [];

    assert_eq!(clone_protection(&live, [&pending], &[]), CloneProtection::Nothing, "not being deleted: kept");
    assert_eq!(clone_protection(&unprotected, none, &[]), CloneProtection::Nothing, "no finalizer");
    assert_eq!(clone_protection(&deleting, [&pending], &[]), wait);
    assert_eq!(clone_protection(&deleting, [&no_phase], &[]), wait);
    assert_eq!(clone_protection(&deleting, none, &[]), CloneProtection::Release);
    assert_eq!(clone_protection(&deleting, [&bound, &elsewhere, &other_source], &[]), CloneProtection::Release);
    // A create whose claim is gone but whose outcome is unknown still reads the source.
    assert!(matches!(clone_protection(&deleting, none, &["team-a/src".into()]), CloneProtection::Wait(_)));
    assert_eq!(clone_protection(&deleting, none, &["team-a/other".into()]), CloneProtection::Release);
}

#[test]
fn snapshot_sweep() {
    let protected = |ns: &str, name: &str| VolumeSnapshot {
        metadata: ObjectMeta {
            finalizers: Some(vec![upstream::SNAPSHOT_SOURCE_FINALIZER.into()]),
            ..meta(ns, name, name)
        },
        ..Default::default()
    };
    let (a, b, c, d) =
        (protected("team-a", "a"), protected("team-a", "b"), protected("team-b", "c"), protected("team-a", "d"));
    let mut unprotected = protected("team-a", "e");
    unprotected.metadata.finalizers = Some(vec!["other".into()]);
    let restore_a = cached(&with_source(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", "a"), Some("Pending"));
    let restored_b = cached(&with_source(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", "b"), Some("Bound"));
    let cross_c = cached(&with_ref(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", "c", Some("team-b")), None);
    let orphans =
        orphaned_snapshots([&a, &b, &c, &d, &unprotected], [&restore_a, &restored_b, &cross_c], &["team-a/d".into()]);
    assert_eq!(orphans, vec!["team-a/b".to_string()]);
}

#[test]
fn a_snapshot_after_a_restore() {
    let restore = |name: &str, uid: &str, snap: &str, phase: Option<&str>| {
        let mut c = with_source(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", snap);
        c.metadata = meta("team-a", name, uid);
        cached(&c, phase)
    };
    let done = restore("done", "u-done", "snap", Some("Pending"));
    let waiting = restore("waiting", "u-waiting", "snap", Some("Pending"));
    let no_phase = restore("new", "u-new", "snap", None);
    let bound = restore("bound", "u-bound", "snap", Some("Bound"));
    let other = restore("other", "u-other", "other", Some("Pending"));
    let saved = restore("saved", "u-saved", "snap", Some("Pending"));
    let elsewhere = cached(
        &with_ref(claim("1Gi", None), Some(SNAP_GROUP), "VolumeSnapshot", "snap", Some("team-b")),
        Some("Pending"),
    );
    // The claim just restored and claims whose PV exists already.
    let provisioned = |c: &CachedPvc| matches!(c.metadata.uid.as_deref(), Some("u-done" | "u-saved"));
    let needed = |pending: &[&CachedPvc], in_flight: &[String]| {
        snapshot_still_needed("team-a/snap", pending.iter().copied(), in_flight, provisioned)
    };
    assert_eq!(needed(&[&done], &[]), None, "only the claim restored");
    assert_eq!(needed(&[&done, &bound, &other, &saved, &elsewhere], &[]), None, "none waits for it");
    assert_eq!(
        needed(&[&done, &waiting], &[]),
        Some("PVC 'team-a/waiting' waits for a volume restored from it".into())
    );
    assert!(needed(&[&no_phase], &[]).is_some(), "no phase yet: waiting");
    assert_eq!(
        needed(&[&done], &["team-a/other".into(), "team-a/snap".into()]),
        Some("a CreateVolume restoring from it is unfinished".into())
    );
    assert_eq!(needed(&[], &["team-b/snap".into()]), None);
}

#[test]
fn claims_waiting_for_a_source() {
    let clone = with_source(claim("1Gi", None), None, "PersistentVolumeClaim", "src");
    assert!(waits_for_source(&cached(&clone, Some("Pending"))));
    assert!(waits_for_source(&cached(&clone, None)), "no phase yet");
    assert!(!waits_for_source(&cached(&clone, Some("Bound"))));
    assert!(!waits_for_source(&cached(&claim("1Gi", None), Some("Pending"))), "no source");
    let populator = with_source(claim("1Gi", None), Some("example.com"), "Backup", "b");
    assert!(!waits_for_source(&cached(&populator, Some("Pending"))));
}
