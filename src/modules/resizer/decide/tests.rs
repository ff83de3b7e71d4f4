use k8s_openapi::{
    api::core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec, VolumeResourceRequirements,
    },
    apimachinery::pkg::api::resource::Quantity,
};

use super::*;

const GI: i64 = 1 << 30;

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

fn storage(s: &str) -> Option<std::collections::BTreeMap<String, Quantity>> {
    Some([("storage".to_string(), q(s))].into())
}

/// A bound claim: request, capacity, allocated, allocation state.
fn claim(spec: &str, cap: &str, allocated: Option<&str>, st: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("c".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("pv1".into()),
            resources: Some(VolumeResourceRequirements { requests: storage(spec), ..Default::default() }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: storage(cap),
            allocated_resources: allocated.and_then(storage),
            allocated_resource_statuses: st.map(|s| [("storage".to_string(), s.to_string())].into()),
            ..Default::default()
        }),
    }
}

fn volume(size: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some("pv1".into()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: storage(size),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "h1".into(),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                namespace: Some("ns".into()),
                name: Some("c".into()),
                uid: Some("u1".into()),
                ..Default::default()
            }),
            mount_options: Some(vec!["noatime".into()]),
            ..Default::default()
        }),
        status: None,
    }
}

fn sizes_of(pvc: &PersistentVolumeClaim, pv: &str) -> Sizes {
    sizes(pvc, Some(&volume(pv))).unwrap().unwrap()
}

/// What, (request, capacity, allocated, allocation state), PV size, memory, step.
type Case = (
    &'static str,
    (&'static str, &'static str, Option<&'static str>, Option<&'static str>),
    &'static str,
    Memory,
    Step,
);

#[test]
fn target_sizes_follow_upstreams_recovery_rules() {
    use Step::*;
    let csi = Memory { controller_expansion: true, ..Default::default() };
    let final_seen = Memory { final_error: true, ..csi };
    let slow = Memory { slow: true, ..csi };
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("first resize", ("2Gi", "1Gi", None, None), "1Gi", csi, Expand { target: 2 * GI, update_status: true }),
        ("in flight, user asks more: old target kept", ("3Gi", "1Gi", Some("2Gi"), Some(upstream::CONTROLLER_RESIZE_IN_PROGRESS)), "1Gi", csi,
            Expand { target: 2 * GI, update_status: false }),
        ("in flight after a final error: the new request", ("3Gi", "1Gi", Some("2Gi"), Some(upstream::CONTROLLER_RESIZE_IN_PROGRESS)), "1Gi", final_seen,
            Expand { target: 3 * GI, update_status: true }),
        ("infeasible, user shrank back: retried at once", ("2Gi", "1Gi", Some("5Gi"), Some(upstream::CONTROLLER_RESIZE_INFEASIBLE)), "1Gi", slow,
            Expand { target: 2 * GI, update_status: true }),
        ("infeasible, unchanged, slow: held back", ("5Gi", "1Gi", Some("5Gi"), Some(upstream::CONTROLLER_RESIZE_INFEASIBLE)), "1Gi", slow, HeldBack),
        ("infeasible, unchanged, slow window over: retried", ("5Gi", "1Gi", Some("5Gi"), Some(upstream::CONTROLLER_RESIZE_INFEASIBLE)), "1Gi", csi,
            Expand { target: 5 * GI, update_status: false }),
        ("node pending, PV already big enough: kubelet's turn", ("2Gi", "1Gi", Some("2Gi"), Some(upstream::NODE_RESIZE_PENDING)), "2Gi", csi, Skip),
        ("node pending, PV smaller than allocated", ("3Gi", "1Gi", Some("2Gi"), Some(upstream::NODE_RESIZE_PENDING)), "1Gi", csi,
            Expand { target: 2 * GI, update_status: false }),
        ("node infeasible, PV small: allocated", ("3Gi", "1Gi", Some("2Gi"), Some(upstream::NODE_RESIZE_INFEASIBLE)), "1Gi", csi,
            Expand { target: 2 * GI, update_status: false }),
        ("node infeasible, PV big, controller: allocated", ("2Gi", "1Gi", Some("3Gi"), Some(upstream::NODE_RESIZE_INFEASIBLE)), "2Gi", csi,
            Expand { target: 3 * GI, update_status: false }),
        ("node infeasible, PV big, trivial: spec", ("2Gi", "1Gi", Some("3Gi"), Some(upstream::NODE_RESIZE_INFEASIBLE)), "2Gi", Memory::default(),
            Expand { target: 2 * GI, update_status: true }),
        ("PV big, no state, allocated: allocated", ("2Gi", "1Gi", Some("2Gi"), None), "2Gi", csi,
            Expand { target: 2 * GI, update_status: false }),
        ("PV big, nothing known: spec", ("2Gi", "1Gi", None, None), "2Gi", csi, Expand { target: 2 * GI, update_status: true }),
    ];
    for (what, (spec, cap, alloc, st), pv, memory, want) in cases {
        let pvc = claim(spec, cap, *alloc, *st);
        assert_eq!(plan(&pvc, &sizes_of(&pvc, pv), *memory), *want, "{what}");
    }
}

#[test]
fn fs_resize_pending_on_an_old_apiserver_stops() {
    let mut pvc = claim("2Gi", "1Gi", None, None);
    pvc.status.as_mut().unwrap().conditions =
        Some(vec![condition(upstream::COND_FS_RESIZE_PENDING, "", Timestamp::UNIX_EPOCH)]);
    assert_eq!(plan(&pvc, &sizes_of(&pvc, "2Gi"), Memory::default()), Step::Skip);
}

#[test]
fn which_claims_need_a_resize() {
    let pvc = claim("2Gi", "1Gi", None, None);
    assert!(needs_resize(&pvc, &sizes_of(&pvc, "1Gi")));
    let same = claim("1Gi", "1Gi", None, None);
    assert!(!needs_resize(&same, &sizes_of(&same, "1Gi")));
    let mut pending = claim("2Gi", "1Gi", None, None);
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    assert!(!needs_resize(&pending, &sizes_of(&pending, "1Gi")));
    let mut bad = claim("2Gi", "1Gi", None, None);
    bad.spec.as_mut().unwrap().resources.as_mut().unwrap().requests = storage("lots");
    let err = sizes(&bad, None).unwrap_err().to_string();
    assert!(err.contains("\"lots\"") && err.contains("ns/c"), "{err}");
}

#[test]
fn pv_must_be_the_drivers_volume_of_this_claim() {
    let pvc = claim("2Gi", "1Gi", None, None);
    assert!(pv_is_ours(&volume("1Gi"), &pvc, "d"));
    assert!(!pv_is_ours(&volume("1Gi"), &pvc, "other"));
    let mut other_uid = volume("1Gi");
    other_uid.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("u2".into());
    assert!(!pv_is_ours(&other_uid, &pvc, "d"));
}

/// An in-tree Cinder volume bound to [`claim`].
fn cinder_volume(size: &str) -> PersistentVolume {
    let mut pv = volume(size);
    let spec = pv.spec.as_mut().unwrap();
    spec.csi = None;
    spec.cinder = Some(k8s_openapi::api::core::v1::CinderPersistentVolumeSource {
        volume_id: "vol-7".into(),
        fs_type: Some("xfs".into()),
        ..Default::default()
    });
    pv
}

#[test]
fn a_migrated_in_tree_volume_is_the_drivers_once_named_the_claims_resizer() {
    const CINDER: &str = "cinder.csi.openstack.org";
    let mut pvc = claim("2Gi", "1Gi", None, None);
    let pv = cinder_volume("1Gi");
    // Table: (resizer annotation, driver, ours).
    let table: &[(Option<&str>, &str, bool)] = &[
        // kube-controller-manager has not handed the claim over yet.
        (None, CINDER, false),
        // Handed to another CSI driver, or still to the in-tree plugin.
        (Some("ebs.csi.aws.com"), CINDER, false),
        (Some("kubernetes.io/cinder"), CINDER, false),
        (Some(CINDER), CINDER, true),
        // The driver is not Cinder's migration target.
        (Some("d"), "d", false),
    ];
    for &(resizer, driver, want) in table {
        pvc.metadata.annotations = resizer.map(|r| [(upstream::ANN_STORAGE_RESIZER.to_string(), r.to_string())].into());
        assert_eq!(pv_is_ours(&pv, &pvc, driver), want, "resizer {resizer:?}, driver {driver}");
    }
    // The claim reference still has to match.
    let mut other_uid = pv.clone();
    other_uid.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("u2".into());
    pvc.metadata.annotations = Some([(upstream::ANN_STORAGE_RESIZER.to_string(), CINDER.to_string())].into());
    assert!(!pv_is_ours(&other_uid, &pvc, CINDER));
}

#[test]
fn a_migrated_in_tree_volume_is_expanded_by_its_translated_handle() {
    let (pv, migrated) = csi_form(&cinder_volume("1Gi"), "cinder.csi.openstack.org").unwrap();
    assert!(migrated);
    let r = expand_request(&pv, 2 * GI, false).unwrap();
    assert_eq!(r.volume_id, "vol-7");
    let Some(csi::volume_capability::AccessType::Mount(m)) = r.volume_capability.unwrap().access_type else {
        panic!("a filesystem volume")
    };
    assert_eq!(m.fs_type, "xfs");
    // A CSI volume is asked as it is, unlabelled.
    let (same, migrated) = csi_form(&volume("1Gi"), "d").unwrap();
    assert!(!migrated && same.spec.unwrap().csi.is_some());
    // An in-tree volume that cannot be translated says why.
    let mut shared = cinder_volume("1Gi");
    let spec = shared.spec.as_mut().unwrap();
    spec.cinder = None;
    spec.azure_disk = Some(k8s_openapi::api::core::v1::AzureDiskVolumeSource {
        disk_name: "d1".into(),
        disk_uri: "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1".into(),
        kind: Some("Shared".into()),
        ..Default::default()
    });
    let e = csi_form(&shared, "disk.csi.azure.com").unwrap_err();
    assert_eq!(e, "failed to translate persistent volume: kind(Shared) is not supported in csi migration");
}

#[test]
fn claims_of_other_drivers_are_not_cached() {
    let meta = |k: &str, v: &str| ObjectMeta {
        annotations: Some([(k.to_string(), v.to_string())].into()),
        ..Default::default()
    };
    assert!(claim_may_be_for_driver(&ObjectMeta::default(), "d"), "static: the PV decides");
    assert!(claim_may_be_for_driver(&meta(provisioner::ANN_STORAGE_PROVISIONER, "d"), "d"));
    assert!(!claim_may_be_for_driver(&meta(provisioner::ANN_STORAGE_PROVISIONER, "e"), "d"));
    assert!(!claim_may_be_for_driver(&meta(provisioner::ANN_BETA_STORAGE_PROVISIONER, "e"), "d"));
    assert!(claim_may_be_for_driver(&meta(upstream::ANN_STORAGE_RESIZER, "d"), "d"));
}

#[test]
fn final_and_infeasible_codes() {
    use tonic::Code::*;
    for c in [Cancelled, DeadlineExceeded, Unavailable, ResourceExhausted, Aborted] {
        assert_eq!(classify(Some(c)), Failure::Uncertain, "{c:?}");
    }
    assert_eq!(classify(None), Failure::Uncertain, "no gRPC status: not final");
    for c in [InvalidArgument, OutOfRange, NotFound] {
        assert_eq!(classify(Some(c)), Failure::Infeasible, "{c:?}");
    }
    for c in [Internal, FailedPrecondition, Unknown, PermissionDenied, Unimplemented] {
        assert_eq!(classify(Some(c)), Failure::Final, "{c:?}");
    }
}

#[test]
fn conditions_merge_like_upstream() {
    let t0 = Timestamp::UNIX_EPOCH;
    let t1 = Timestamp::from_second(100).unwrap();
    let other = PersistentVolumeClaimCondition { type_: "Other".into(), status: "True".into(), ..Default::default() };
    let old = vec![
        other.clone(),
        condition(upstream::COND_RESIZING, "", t0),
        condition(upstream::COND_NODE_RESIZE_ERROR, "x", t0),
    ];
    // Same status: the old condition (and its time) stays; others dropped without keep_old.
    let merged = merge_conditions(&old, &[condition(upstream::COND_RESIZING, "", t1)], false);
    assert_eq!(merged.len(), 2);
    assert_eq!(merged[1].last_transition_time, Some(Time(t0)));
    let kept = merge_conditions(&old, &[condition(upstream::COND_CONTROLLER_RESIZE_ERROR, "e", t1)], true);
    assert_eq!(
        kept.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
        ["Other", "Resizing", "NodeResizeError", "ControllerResizeError"]
    );
    assert_eq!(merge_conditions(&old, &[], false), vec![other]);
}

#[test]
fn status_patches() {
    let now = Timestamp::from_second(100).unwrap();
    let mut pvc = claim("2Gi", "1Gi", None, None);
    pvc.metadata.annotations =
        Some([(upstream::ANN_NODE_EXPANSION_NOT_REQUIRED.to_string(), "true".to_string())].into());
    let p = in_progress_patch(&pvc, 2 * GI, true, true, now);
    assert_eq!(p["metadata"]["resourceVersion"], "7");
    assert_eq!(p["metadata"]["annotations"][upstream::ANN_NODE_EXPANSION_NOT_REQUIRED], Value::Null);
    assert_eq!(p["status"]["allocatedResources"]["storage"], "2Gi");
    assert_eq!(p["status"]["allocatedResourceStatuses"]["storage"], upstream::CONTROLLER_RESIZE_IN_PROGRESS);
    assert_eq!(p["status"]["conditions"][0]["type"], "Resizing");
    let p = in_progress_patch(&pvc, 2 * GI, false, true, now);
    assert!(p["status"].get("allocatedResourceStatuses").is_none());
    let legacy = in_progress_patch(&pvc, 2 * GI, false, false, now);
    assert!(legacy["status"].get("allocatedResources").is_none());

    let f = failure_patch(&pvc, "rpc error: code = OutOfRange desc = too big", true, now);
    assert_eq!(f["status"]["allocatedResourceStatuses"]["storage"], upstream::CONTROLLER_RESIZE_INFEASIBLE);
    assert_eq!(f["status"]["conditions"][0]["type"], "ControllerResizeError");
    assert_eq!(
        f["status"]["conditions"][0]["message"],
        "failed to expand pvc with rpc error: code = OutOfRange desc = too big"
    );
    assert!(f.get("metadata").is_none(), "no resourceVersion lock on errors");
    assert!(failure_patch(&pvc, "x", false, now)["status"].get("allocatedResourceStatuses").is_none());

    let fs = success_patch(&pvc, 2 * GI, true, true, now);
    assert_eq!(fs["status"]["allocatedResourceStatuses"]["storage"], upstream::NODE_RESIZE_PENDING);
    assert_eq!(fs["status"]["conditions"][0]["type"], "FileSystemResizePending");
    assert_eq!(fs["status"]["conditions"][0]["message"], upstream::TEXT_FS_RESIZE_PENDING);
    assert!(fs["status"].get("capacity").is_none(), "the kubelet sets the capacity");
    assert_eq!(fs["metadata"]["annotations"][upstream::ANN_NODE_EXPANSION_NOT_REQUIRED], Value::Null);

    let mut inprog = claim("2Gi", "1Gi", Some("2Gi"), Some(upstream::CONTROLLER_RESIZE_IN_PROGRESS));
    inprog.status.as_mut().unwrap().conditions = Some(vec![condition(upstream::COND_RESIZING, "", now)]);
    let done = success_patch(&inprog, 2 * GI, false, true, now);
    assert_eq!(done["status"]["capacity"]["storage"], "2Gi");
    // By type: only the resize condition goes; whatever else the claim has
    // when the patch lands stays.
    assert_eq!(done["status"]["conditions"], json!([{"type": "Resizing", "$patch": "delete"}]));
    assert_eq!(done["status"]["allocatedResourceStatuses"]["storage"], Value::Null);
    assert_eq!(done["metadata"]["annotations"][upstream::ANN_NODE_EXPANSION_NOT_REQUIRED], "true");
}

#[test]
fn pv_patches_and_the_pre_resize_annotation() {
    let pvc = claim("2Gi", "1Gi", None, None);
    let pv = volume("1Gi");
    let p = pv_patch(&pv, &pvc, 2 * GI, true, true);
    assert_eq!(p["spec"]["capacity"]["storage"], "2Gi");
    assert_eq!(p["metadata"]["annotations"][upstream::ANN_PRE_RESIZE_CAPACITY], "1Gi");
    assert!(pv_patch(&pv, &pvc, 2 * GI, false, true).get("metadata").is_none());
    assert!(pv_patch(&pv, &pvc, 2 * GI, true, false).get("metadata").is_none(), "gate off");
    let mut annotated = volume("2Gi");
    annotated.metadata.annotations = Some([(upstream::ANN_PRE_RESIZE_CAPACITY.to_string(), "1Gi".to_string())].into());
    assert!(pv_patch(&annotated, &pvc, 2 * GI, true, true).get("metadata").is_none(), "kept as written first");
    let caught_up = claim("2Gi", "2Gi", None, None);
    assert!(pre_resize_annotation_stale(&annotated, &sizes_of(&caught_up, "2Gi")));
    assert!(!pre_resize_annotation_stale(&annotated, &sizes_of(&pvc, "2Gi")));
    assert!(!pre_resize_annotation_stale(&pv, &sizes_of(&caught_up, "1Gi")));
}

#[test]
fn a_smaller_answer_is_an_error() {
    assert_eq!(checked_capacity(2 * GI, 2 * GI), Ok(2 * GI));
    assert_eq!(checked_capacity(2 * GI, 3 * GI), Ok(3 * GI));
    assert!(checked_capacity(2 * GI, GI).unwrap_err().contains("less than the requested"));
    assert!(checked_capacity(2 * GI, 0).is_err());
}

#[test]
fn access_modes_map_like_csi_lib_utils() {
    let m = |v: &[&str], smw| access_mode(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), smw);
    assert_eq!(m(&["ReadWriteOnce"], false), Ok(Mode::SingleNodeWriter));
    assert_eq!(m(&["ReadWriteOnce"], true), Ok(Mode::SingleNodeMultiWriter));
    assert_eq!(m(&["ReadWriteOncePod"], true), Ok(Mode::SingleNodeSingleWriter));
    assert_eq!(m(&["ReadWriteOncePod"], false), Ok(Mode::SingleNodeWriter));
    assert!(m(&["ReadWriteOncePod", "ReadWriteOnce"], false).is_err());
    assert_eq!(m(&["ReadWriteMany", "ReadOnlyMany"], false), Ok(Mode::MultiNodeMultiWriter));
    assert!(m(&["ReadOnlyMany", "ReadWriteOnce"], false).is_err());
    assert_eq!(m(&["ReadOnlyMany"], false), Ok(Mode::MultiNodeReaderOnly));
    assert!(m(&[], false).is_err());
}

#[test]
fn the_expand_request() {
    let pv = volume("1Gi");
    let r = expand_request(&pv, 2 * GI, false).unwrap();
    assert_eq!(r.volume_id, "h1");
    assert_eq!(r.capacity_range, Some(csi::CapacityRange { required_bytes: 2 * GI, limit_bytes: 0 }));
    let cap = r.volume_capability.unwrap();
    let Some(csi::volume_capability::AccessType::Mount(m)) = cap.access_type else { panic!("mount expected") };
    assert_eq!((m.fs_type.as_str(), m.mount_flags), ("ext4", vec!["noatime".to_string()]));
    let mut block = volume("1Gi");
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let cap = expand_request(&block, GI, false).unwrap().volume_capability.unwrap();
    assert!(matches!(cap.access_type, Some(csi::volume_capability::AccessType::Block(_))));
    let mut empty = volume("1Gi");
    empty.spec.as_mut().unwrap().csi.as_mut().unwrap().volume_handle.clear();
    assert_eq!(expand_request(&empty, GI, false).unwrap_err(), InputError::EmptyHandle);
}

#[test]
fn updates_worth_a_sync() {
    let cached = |spec: &str, cap: &str, st: Option<&str>| -> CachedPvc {
        let mut v = json!({"metadata": {"name": "c", "namespace": "ns"},
            "spec": {"volumeName": "pv1", "resources": {"requests": {"storage": spec}}},
            "status": {"phase": "Bound", "capacity": {"storage": cap}}});
        if let Some(st) = st {
            v["status"]["allocatedResourceStatuses"] = json!({"storage": st});
        }
        serde_json::from_value(v).unwrap()
    };
    let base = cached("1Gi", "1Gi", None);
    assert!(update_needs_sync(&base, &cached("2Gi", "1Gi", None), true), "grew");
    assert!(update_needs_sync(&cached("3Gi", "1Gi", None), &cached("2Gi", "1Gi", None), true), "shrank back");
    assert!(!update_needs_sync(&cached("3Gi", "1Gi", None), &cached("2Gi", "1Gi", None), false), "legacy: only growth");
    assert!(update_needs_sync(&base, &cached("1Gi", "2Gi", None), true), "capacity grew");
    assert!(
        update_needs_sync(&base, &cached("1Gi", "1Gi", Some(upstream::NODE_RESIZE_PENDING)), true),
        "state changed"
    );
    assert!(!update_needs_sync(&base, &cached("1Gi", "1Gi", None), true), "nothing of interest");
}

fn with_vac(spec: Option<&str>, cur: Option<&str>, st: Option<(&str, &str)>) -> PersistentVolumeClaim {
    let mut c = claim("1Gi", "1Gi", None, None);
    c.spec.as_mut().unwrap().volume_attributes_class_name = spec.map(String::from);
    let status = c.status.as_mut().unwrap();
    status.current_volume_attributes_class_name = cur.map(String::from);
    status.modify_volume_status =
        st.map(|(s, t)| ModifyVolumeStatus { status: s.into(), target_volume_attributes_class_name: Some(t.into()) });
    c
}

#[test]
fn modify_steps_follow_upstream() {
    use ModifyStep::*;
    let start = |t: &str| Start { target: t.into() };
    let resume = |t: &str| Resume { target: t.into() };
    #[rustfmt::skip]
    let cases: Vec<(&str, PersistentVolumeClaim, bool, bool, ModifyStep)> = vec![
        ("nothing asked", with_vac(None, None, None), false, false, Nothing),
        ("already applied", with_vac(Some("gold"), Some("gold"), None), false, false, Nothing),
        ("new class", with_vac(Some("gold"), None, None), false, false, start("gold")),
        ("another class", with_vac(Some("gold"), Some("silver"), None), false, false, start("gold")),
        ("in progress, uncertain: old target kept", with_vac(Some("gold"), None, Some(("InProgress", "silver"))), true, false, resume("silver")),
        ("in progress after a final error: the new class", with_vac(Some("gold"), None, Some(("InProgress", "silver"))), false, false, start("gold")),
        ("infeasible, same class, slow: held back", with_vac(Some("gold"), None, Some(("Infeasible", "gold"))), false, true, HeldBack),
        ("infeasible, same class, window over: retried", with_vac(Some("gold"), None, Some(("Infeasible", "gold"))), false, false, start("gold")),
        ("infeasible, user picked another: at once", with_vac(Some("silver"), None, Some(("Infeasible", "gold"))), false, true, start("silver")),
        ("cleared while infeasible: rollback", with_vac(None, None, Some(("Infeasible", "gold"))), false, false, Rollback { had_condition: false }),
        ("cleared while in progress: old target", with_vac(None, None, Some(("InProgress", "gold"))), false, false, resume("gold")),
    ];
    for (what, pvc, uncertain, slow, want) in cases {
        assert_eq!(plan_modify(&pvc, uncertain, slow), want, "{what}");
    }
    assert_eq!(modify_infeasible_same_target(&with_vac(Some("gold"), None, Some(("Infeasible", "gold")))), Some(true));
    assert_eq!(modify_infeasible_same_target(&with_vac(Some("x"), None, Some(("Infeasible", "gold")))), Some(false));
    assert_eq!(modify_infeasible_same_target(&with_vac(Some("gold"), None, None)), None);
}

#[test]
fn a_failed_modify_is_infeasible_and_held_back_only_on_invalid_argument() {
    use tonic::Code::*;
    let held = ModifyFailed { state: "Infeasible", uncertain: false, hold_back: true };
    let retried = ModifyFailed { state: "InProgress", uncertain: false, hold_back: false };
    let uncertain = ModifyFailed { state: "InProgress", uncertain: true, hold_back: false };
    #[rustfmt::skip]
    let cases = [
        (InvalidArgument, held),
        (OutOfRange, retried),
        (NotFound, retried),
        (Internal, retried),
        (FailedPrecondition, retried),
        (DeadlineExceeded, uncertain),
        (Unavailable, uncertain),
        (Aborted, uncertain),
        (ResourceExhausted, uncertain),
        (Cancelled, uncertain),
    ];
    for (code, want) in cases {
        assert_eq!(modify_failed(code), want, "{code:?}");
    }
}

#[test]
fn modify_patches_and_request() {
    let now = Timestamp::from_second(100).unwrap();
    let pvc = with_vac(Some("gold"), None, None);
    let p = modify_in_progress_patch(&pvc, "gold", now);
    assert_eq!(
        p["status"]["modifyVolumeStatus"],
        json!({"status": "InProgress", "targetVolumeAttributesClassName": "gold"})
    );
    assert_eq!(p["status"]["conditions"][0]["message"], "Modifying volume to \"gold\" is in progress.");
    assert_eq!(
        p["metadata"]["resourceVersion"],
        pvc.metadata.resource_version.clone().unwrap(),
        "a mark before a call"
    );
    // Pending names only the state (upstream: `{status: Pending}` on a claim
    // without a modify status; a status's target is left as it was), locked
    // to the resourceVersion like every mark before a call.
    let pending = modify_pending_patch(&pvc);
    assert_eq!(pending["status"], json!({"modifyVolumeStatus": {"status": "Pending"}}));
    assert_eq!(pending["metadata"]["resourceVersion"], pvc.metadata.resource_version.clone().unwrap());
    assert!(modify_failure_patch(&pvc, "gold", &tonic::Status::internal("x"), now).get("metadata").is_none());

    let bad = tonic::Status::invalid_argument("iops too high");
    let f = modify_failure_patch(&pvc, "gold", &bad, now);
    assert_eq!(f["status"]["modifyVolumeStatus"]["status"], "Infeasible");
    let conds = f["status"]["conditions"].as_array().unwrap();
    assert_eq!(conds[0]["message"], "Modifying volume to \"gold\" failed. Waiting for retry.");
    assert_eq!(conds[1]["type"], "ModifyVolumeError");
    assert_eq!(conds[1]["reason"], "InvalidArgument");
    assert_eq!(conds[1]["message"], "iops too high");
    let f = modify_failure_patch(&pvc, "gold", &tonic::Status::deadline_exceeded("slow"), now);
    assert_eq!(f["status"]["modifyVolumeStatus"]["status"], "InProgress");
    assert_eq!(f["status"]["conditions"][0]["message"], "Modifying volume to \"gold\" is still in progress.");
    let f = modify_failure_patch(&pvc, "gold", &tonic::Status::internal("oops"), now);
    assert_eq!(f["status"]["modifyVolumeStatus"]["status"], "InProgress", "final but not InvalidArgument");

    let mut failed = pvc.clone();
    let conds: Vec<PersistentVolumeClaimCondition> =
        serde_json::from_value(modify_failure_patch(&pvc, "gold", &bad, now)["status"]["conditions"].clone()).unwrap();
    failed.status.as_mut().unwrap().conditions = Some(conds);
    let later = Timestamp::from_second(200).unwrap();
    let again = modify_failure_patch(&failed, "gold", &bad, later);
    assert_eq!(again["status"].get("conditions"), None, "same reason and message: nothing to write");
    let other = tonic::Status::invalid_argument("iops still too high");
    let again = modify_failure_patch(&failed, "gold", &other, later);
    let written = again["status"]["conditions"].as_array().unwrap();
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["message"], "iops still too high");
    assert_eq!(written[0]["lastTransitionTime"], json!(Time(now)), "same reason: time kept");
    let ok = modify_success_patch(&failed, "gold");
    assert_eq!(ok["status"]["currentVolumeAttributesClassName"], "gold");
    assert_eq!(ok["status"]["modifyVolumeStatus"], Value::Null);
    assert_eq!(
        ok["status"]["conditions"],
        json!([{"type": "ModifyingVolume", "$patch": "delete"}, {"type": "ModifyVolumeError", "$patch": "delete"}])
    );
    assert_eq!(
        modify_rollback_patch(&failed)["status"]["conditions"],
        json!([{"type": "ModifyingVolume", "$patch": "delete"}])
    );
    assert_eq!(pv_vac_patch("gold")["spec"]["volumeAttributesClassName"], "gold");

    let pv = volume("1Gi");
    let params = std::collections::BTreeMap::from([("iops".to_string(), "300".to_string())]);
    let r = modify_request(&pv, &pvc, Some(&params), false).unwrap();
    assert_eq!((r.volume_id.as_str(), r.mutable_parameters.len()), ("h1", 1));
    let r = modify_request(&pv, &pvc, Some(&params), true).unwrap();
    assert_eq!(r.mutable_parameters["csi.storage.k8s.io/pvc/name"], "c");
    assert_eq!(r.mutable_parameters["csi.storage.k8s.io/pvc/namespace"], "ns");
    assert_eq!(r.mutable_parameters["csi.storage.k8s.io/pv/name"], "pv1");

    assert_eq!(modify_secret_ref(&pv), None);
    let mut annotated = volume("1Gi");
    annotated.metadata.annotations = Some(
        [
            (provisioner::ANN_MODIFY_SECRET_NAME.to_string(), "s".to_string()),
            (provisioner::ANN_MODIFY_SECRET_NAMESPACE.to_string(), "n".to_string()),
        ]
        .into(),
    );
    assert_eq!(modify_secret_ref(&annotated), Some(("s".into(), "n".into())));
}

#[test]
fn a_missing_volume_is_worth_an_event_only_when_a_resize_was_asked() {
    let s = |pvc: &PersistentVolumeClaim| sizes(pvc, None).unwrap().unwrap();
    let asked = claim("2Gi", "1Gi", None, None);
    assert!(resize_asked_without_volume(&asked, &s(&asked)));
    let mut just_bound = claim("1Gi", "1Gi", None, None);
    just_bound.status.as_mut().unwrap().capacity = None;
    assert!(!resize_asked_without_volume(&just_bound, &s(&just_bound)), "PV on its way");
    let mut lost = claim("2Gi", "1Gi", Some("2Gi"), Some(upstream::CONTROLLER_RESIZE_IN_PROGRESS));
    let st = lost.status.as_mut().unwrap();
    st.capacity = None;
    st.phase = Some("Lost".into());
    assert!(resize_asked_without_volume(&lost, &s(&lost)));
    lost.status.as_mut().unwrap().allocated_resources = None;
    assert!(!resize_asked_without_volume(&lost, &s(&lost)), "lost without a resize");
}
