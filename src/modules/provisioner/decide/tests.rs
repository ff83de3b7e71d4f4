use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PersistentVolumeStatus, VolumeResourceRequirements};

use super::*;

const DRIVER: &str = "mock.csi.example.com";

fn settings() -> Settings {
    Settings {
        volume_name_prefix: "pvc".into(),
        volume_name_uuid_length: -1,
        default_fstype: String::new(),
        extra_create_metadata: false,
        controller_publish_readonly: false,
    }
}

fn driver(ctrl: &[Rpc]) -> DriverInfo {
    DriverInfo::with_capabilities(DRIVER, &[Svc::ControllerService], ctrl)
}

fn pvc(ann: &[(&str, &str)], modes: &[&str], size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("team-a".into()),
            uid: Some("0b5c7e7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b".into()),
            annotations: Some(ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size.into()))])),
                ..Default::default()
            }),
            storage_class_name: Some("fast".into()),
            ..Default::default()
        }),
        status: None,
    }
}

fn sc(params: &[(&str, &str)], binding: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta { name: Some("fast".into()), ..Default::default() },
        provisioner: DRIVER.into(),
        parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        volume_binding_mode: Some(binding.into()),
        reclaim_policy: Some("Delete".into()),
        mount_options: Some(vec!["noatime".into()]),
        ..Default::default()
    }
}

const OURS: (&str, &str) = (upstream::ANN_STORAGE_PROVISIONER, DRIVER);

#[test]
fn volume_names() {
    let uid = "0b5c7e7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    assert_eq!(volume_name("pvc", uid, -1).unwrap(), format!("pvc-{uid}"));
    assert_eq!(volume_name("pvc", uid, 8).unwrap(), "pvc-0b5c7e7a");
    assert_eq!(volume_name("vol", uid, 100).unwrap(), "vol-0b5c7e7a1c2d4e5f8a9b0c1d2e3f4a5b");
    assert!(volume_name("", uid, -1).is_err());
    assert!(volume_name("pvc", "", -1).is_err());
}

#[test]
fn which_claims_are_provisioned() {
    let imm = sc(&[], "Immediate");
    let wffc = sc(&[], "WaitForFirstConsumer");
    let table: Vec<(PersistentVolumeClaim, &StorageClass, bool, ClaimDecision)> = vec![
        (pvc(&[OURS], &["ReadWriteOnce"], "1Gi"), &imm, false, ClaimDecision::Provision),
        (
            pvc(&[(upstream::ANN_BETA_STORAGE_PROVISIONER, DRIVER)], &["ReadWriteOnce"], "1Gi"),
            &imm,
            false,
            ClaimDecision::Provision,
        ),
        (pvc(&[(upstream::ANN_MIGRATED_TO, DRIVER)], &["ReadWriteOnce"], "1Gi"), &imm, false, ClaimDecision::Provision),
        (
            pvc(&[(upstream::ANN_STORAGE_PROVISIONER, "other")], &["ReadWriteOnce"], "1Gi"),
            &imm,
            false,
            ClaimDecision::Ignore("not for this driver"),
        ),
        (pvc(&[], &["ReadWriteOnce"], "1Gi"), &imm, false, ClaimDecision::Ignore("not for this driver")),
        (pvc(&[OURS], &["ReadWriteOnce"], "1Gi"), &imm, true, ClaimDecision::Ignore("volume already provisioned")),
        (pvc(&[OURS], &["ReadWriteOnce"], "1Gi"), &wffc, false, ClaimDecision::WaitForScheduler),
        (
            pvc(&[OURS, (upstream::ANN_SELECTED_NODE, "node-1")], &["ReadWriteOnce"], "1Gi"),
            &wffc,
            false,
            ClaimDecision::Provision,
        ),
    ];
    for (claim, class, exists, want) in table {
        assert_eq!(decide_claim(&claim, Some(class), DRIVER, exists), want, "{:?}", claim.metadata.annotations);
    }
    let mut bound = pvc(&[OURS], &["ReadWriteOnce"], "1Gi");
    bound.spec.as_mut().unwrap().volume_name = Some("pv-x".into());
    assert_eq!(decide_claim(&bound, Some(&imm), DRIVER, false), ClaimDecision::Ignore("already bound to a volume"));
}

#[test]
fn access_modes_follow_csi_lib_utils() {
    use volume_capability::access_mode::Mode;
    let table = [
        ("ReadWriteOnce", false, Mode::SingleNodeWriter),
        ("ReadWriteOnce", true, Mode::SingleNodeMultiWriter),
        ("ReadWriteOncePod", false, Mode::SingleNodeWriter),
        ("ReadWriteOncePod", true, Mode::SingleNodeSingleWriter),
        ("ReadOnlyMany", false, Mode::MultiNodeReaderOnly),
        ("ReadWriteMany", true, Mode::MultiNodeMultiWriter),
    ];
    for (m, snmw, want) in table {
        assert_eq!(csi_access_mode(m, snmw), Ok(want), "{m} {snmw}");
    }
    assert_eq!(csi_access_mode("Sometimes", false), Err("unsupported AccessMode combination: [Sometimes]".into()));
}

#[test]
fn plan_builds_the_create_request() {
    let class = sc(
        &[
            ("type", "fast"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/provisioner-secret-name", "prov-${pvc.name}"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
            ("csi.storage.k8s.io/node-stage-secret-name", "stage"),
            ("csi.storage.k8s.io/node-stage-secret-namespace", "ops"),
        ],
        "Immediate",
    );
    let claim = pvc(&[OURS], &["ReadWriteOnce", "ReadOnlyMany"], "1Gi");
    let mut s = settings();
    s.extra_create_metadata = true;
    let p = plan(&claim, &class, &driver(&[Rpc::CreateDeleteVolume]), &s, None).unwrap();
    assert_eq!(p.pv_name, "pvc-0b5c7e7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b");
    assert_eq!(p.request.name, p.pv_name);
    assert_eq!(p.request.capacity_range.as_ref().unwrap().required_bytes, 1 << 30);
    assert_eq!(p.request.volume_capabilities.len(), 2, "one capability per access mode");
    let Some(volume_capability::AccessType::Mount(m)) = &p.request.volume_capabilities[0].access_type else { panic!() };
    assert_eq!((m.fs_type.as_str(), m.mount_flags.clone()), ("xfs", vec!["noatime".to_string()]));
    assert_eq!(p.request.parameters.get("type").map(String::as_str), Some("fast"));
    assert!(!p.request.parameters.contains_key("csi.storage.k8s.io/fstype"));
    assert_eq!(p.request.parameters.get(params::PVC_NAME).map(String::as_str), Some("data"));
    assert_eq!(p.request.parameters.get(params::PVC_NAMESPACE).map(String::as_str), Some("team-a"));
    assert_eq!(p.request.parameters.get(params::PV_NAME), Some(&p.pv_name));
    assert_eq!(p.provisioner_secret, Some(SecretRef { name: "prov-data".into(), namespace: "team-a".into() }));
    assert_eq!(
        p.pv_secrets.get("nodeStageSecretRef"),
        Some(&SecretRef { name: "stage".into(), namespace: "ops".into() })
    );
    assert!(p.request.secrets.is_empty(), "secrets are fetched by the executor");
}

#[test]
fn plan_refusals() {
    let claim = pvc(&[OURS], &["ReadWriteOnce"], "1Gi");
    let ok_driver = driver(&[Rpc::CreateDeleteVolume]);
    let err = plan(&claim, &sc(&[], "Immediate"), &driver(&[]), &settings(), None).unwrap_err();
    assert!(err.to_string().contains("does not support dynamic provisioning"), "{err}");
    let err = plan(&claim, &sc(&[("csi.storage.k8s.io/bogus", "1")], "Immediate"), &ok_driver, &settings(), None)
        .unwrap_err();
    assert!(err.to_string().contains("found unknown parameter key \"csi.storage.k8s.io/bogus\""), "{err}");
    let mut sel = claim.clone();
    sel.spec.as_mut().unwrap().selector = Some(Default::default());
    assert_eq!(
        plan(&sel, &sc(&[], "Immediate"), &ok_driver, &settings(), None).unwrap_err().to_string(),
        "claim Selector is not supported"
    );
    let mut populated = claim.clone();
    populated.spec.as_mut().unwrap().data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
        api_group: Some("example.com".into()),
        kind: "Backup".into(),
        name: "b".into(),
    });
    let src = sources::data_source(&populated, false).unwrap();
    assert_eq!(
        plan(&populated, &sc(&[], "Immediate"), &ok_driver, &settings(), src.as_ref()).unwrap_err(),
        PlanError::ExternalPopulator("Backup".into())
    );
}

fn response(id: &str, cap: i64) -> csi::CreateVolumeResponse {
    csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            volume_id: id.into(),
            capacity_bytes: cap,
            volume_context: [("ctx".to_string(), "v".to_string())].into(),
            accessible_topology: vec![csi::Topology { segments: [("zone".to_string(), "a".to_string())].into() }],
            ..Default::default()
        }),
    }
}

#[test]
fn pv_from_the_answer() {
    let class = sc(
        &[
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
        ],
        "Immediate",
    );
    let claim = pvc(&[OURS], &["ReadOnlyMany"], "1Gi");
    let mut s = settings();
    s.controller_publish_readonly = true;
    let p = plan(&claim, &class, &driver(&[Rpc::CreateDeleteVolume]), &s, None).unwrap();
    let pv = build_pv(&p, &response("vol-1", 0), &claim, &class, DRIVER, "123-4-mock", &s).unwrap();
    let spec = pv.spec.as_ref().unwrap();
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(pv.metadata.name.as_deref(), Some(p.pv_name.as_str()));
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.read_only, Some(true), "ROX only + --controller-publish-readonly");
    assert_eq!(csi.volume_attributes.as_ref().unwrap()[upstream::IDENTITY_KEY], "123-4-mock");
    assert_eq!(csi.volume_attributes.as_ref().unwrap()["ctx"], "v");
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi", "capacity 0 means the requested size");
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(spec.claim_ref.as_ref().unwrap().uid, claim.metadata.uid);
    let ann = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann[upstream::ANN_PROVISIONED_BY], DRIVER);
    assert_eq!(
        (ann[upstream::ANN_DELETION_SECRET_NAME].as_str(), ann[upstream::ANN_DELETION_SECRET_NAMESPACE].as_str()),
        ("s", "ns")
    );
    assert_eq!(pv.metadata.finalizers, Some(vec![upstream::PV_FINALIZER.to_string()]));
    let terms = &spec.node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms;
    assert_eq!(terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");

    let err = build_pv(&p, &response("vol-1", 1000), &claim, &class, DRIVER, "id", &s).unwrap_err();
    assert_eq!(err, ResponseError::TooSmall { got: 1000, want: 1 << 30 });
    assert_eq!(
        build_pv(&p, &response("", 0), &claim, &class, DRIVER, "id", &s).unwrap_err(),
        ResponseError::NoVolumeId
    );

    // Without a provisioner secret the deletion annotations are empty strings.
    let plain = plan(&claim, &sc(&[], "Immediate"), &driver(&[Rpc::CreateDeleteVolume]), &settings(), None).unwrap();
    let pv = build_pv(&plain, &response("v", 0), &claim, &sc(&[], "Immediate"), DRIVER, "id", &settings()).unwrap();
    let ann = pv.metadata.annotations.unwrap();
    assert_eq!(
        (ann[upstream::ANN_DELETION_SECRET_NAME].as_str(), ann[upstream::ANN_DELETION_SECRET_NAMESPACE].as_str()),
        ("", "")
    );
}

#[test]
fn create_errors() {
    use tonic::Code;
    let table = [
        (Code::DeadlineExceeded, false, CreateFailure::InBackground),
        (Code::Unavailable, false, CreateFailure::InBackground),
        (Code::Aborted, true, CreateFailure::InBackground),
        (Code::Cancelled, false, CreateFailure::InBackground),
        (Code::ResourceExhausted, true, CreateFailure::Reschedule),
        (Code::ResourceExhausted, false, CreateFailure::Final),
        (Code::InvalidArgument, false, CreateFailure::Final),
        (Code::Internal, true, CreateFailure::Final),
    ];
    for (code, resched, want) in table {
        assert_eq!(classify_create_error(code, resched), want, "{code:?}");
    }
}

fn pv(reclaim: &str, phase: &str, finalizer: bool, deleting: bool, by: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv".into()),
            annotations: Some(BTreeMap::from([(upstream::ANN_PROVISIONED_BY.to_string(), by.to_string())])),
            finalizers: finalizer.then(|| vec![upstream::PV_FINALIZER.to_string()]),
            deletion_timestamp: deleting
                .then(|| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some(reclaim.into()),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "v".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus { phase: Some(phase.into()), ..Default::default() }),
    }
}

/// A PV made by hand for `driver`'s volume: no provisioned-by annotation.
fn static_pv(reclaim: &str, phase: &str, finalizer: bool, driver: &str) -> PersistentVolume {
    let mut v = pv(reclaim, phase, finalizer, false, driver);
    v.metadata.annotations = None;
    if let Some(csi) = v.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.driver = driver.into();
    }
    v
}

#[test]
fn volume_decisions() {
    use VolumeDecision::*;
    let table = [
        (pv("Delete", "Bound", true, false, DRIVER), Ignore),
        (pv("Delete", "Bound", false, false, DRIVER), AddFinalizer),
        (pv("Delete", "Released", true, false, DRIVER), Delete),
        (pv("Delete", "Released", false, false, DRIVER), Delete),
        (pv("Delete", "Released", true, true, DRIVER), Delete),
        (pv("Retain", "Bound", true, false, DRIVER), RemoveFinalizer),
        (pv("Retain", "Released", false, false, DRIVER), Ignore),
        (pv("Delete", "Released", true, false, "someone-else"), Ignore),
        (pv("Delete", "Bound", false, true, DRIVER), Ignore),
        // Statically provisioned (no provisioned-by annotation), named by
        // spec.csi.driver: protected while bound, deleted once released if
        // protected (upstream's HonorPVReclaimPolicy, KEP-2644).
        (static_pv("Delete", "Bound", false, DRIVER), AddFinalizer),
        (static_pv("Delete", "Bound", true, DRIVER), Ignore),
        (static_pv("Delete", "Released", true, DRIVER), Delete),
        (static_pv("Delete", "Released", false, DRIVER), Ignore),
        (static_pv("Retain", "Bound", true, DRIVER), RemoveFinalizer),
        (static_pv("Retain", "Bound", false, DRIVER), Ignore),
        (static_pv("Delete", "Bound", false, "someone-else"), Ignore),
        (static_pv("Delete", "Released", true, "someone-else"), Ignore),
    ];
    for (v, want) in table {
        assert_eq!(
            decide_volume(&v, DRIVER),
            want,
            "{:?} {:?}",
            v.spec.as_ref().unwrap().persistent_volume_reclaim_policy,
            v.status
        );
    }
}

#[test]
fn plan_with_data_sources() {
    use k8s_openapi::api::core::v1::TypedLocalObjectReference;
    let with = |group: Option<&str>, kind: &str| {
        let mut c = pvc(&[OURS], &["ReadWriteOnce"], "1Gi");
        c.spec.as_mut().unwrap().data_source =
            Some(TypedLocalObjectReference { api_group: group.map(Into::into), kind: kind.into(), name: "src".into() });
        c
    };
    let class = sc(&[], "Immediate");
    let clone = with(None, "PersistentVolumeClaim");
    let restore = with(Some("snapshot.storage.k8s.io"), "VolumeSnapshot");
    let src = |c: &PersistentVolumeClaim| sources::data_source(c, false).unwrap();
    let basic = driver(&[Rpc::CreateDeleteVolume]);
    assert_eq!(
        plan(&clone, &class, &basic, &settings(), src(&clone).as_ref()).unwrap_err().to_string(),
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    );
    assert_eq!(
        plan(&restore, &class, &basic, &settings(), src(&restore).as_ref()).unwrap_err().to_string(),
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    );
    let able = driver(&[Rpc::CreateDeleteVolume, Rpc::CloneVolume, Rpc::CreateDeleteSnapshot]);
    let p = plan(&clone, &class, &able, &settings(), src(&clone).as_ref()).unwrap();
    assert_eq!(p.source, Some(PlanSource { kind: SourceKind::Clone, namespace: "team-a".into(), name: "src".into() }));
    // The content source is the executor's, once it checked the source.
    assert_eq!(p.request.volume_content_source, None);
    let p = plan(&restore, &class, &able, &settings(), src(&restore).as_ref()).unwrap();
    assert_eq!(p.source.map(|s| s.kind), Some(SourceKind::Snapshot));
    let wrong_group = with(Some("example.com"), "VolumeSnapshot");
    assert!(
        plan(&wrong_group, &class, &able, &settings(), src(&wrong_group).as_ref())
            .unwrap_err()
            .to_string()
            .contains("does not belong to the right APIGroup")
    );

    // A clone's answer must say what it was made from.
    let mut p = plan(&clone, &class, &able, &settings(), src(&clone).as_ref()).unwrap();
    assert_eq!(
        build_pv(&p, &response("vol-1", 0), &clone, &class, DRIVER, "id", &settings()),
        Err(ResponseError::NoContentSource)
    );
    let mut resp = response("vol-1", 0);
    resp.volume.as_mut().unwrap().content_source = Some(Default::default());
    assert!(build_pv(&p, &resp, &clone, &class, DRIVER, "id", &settings()).is_ok());
    p.source = None;
    assert!(build_pv(&p, &response("vol-1", 0), &clone, &class, DRIVER, "id", &settings()).is_ok());
}

fn in_tree_pv(provisioned_by: &str, migrated_to: Option<&str>) -> PersistentVolume {
    let mut ann = serde_json::json!({ upstream::ANN_PROVISIONED_BY: provisioned_by });
    if let Some(m) = migrated_to {
        ann[upstream::ANN_MIGRATED_TO] = serde_json::json!(m);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pvc-1", "annotations": ann, "finalizers": [upstream::PV_FINALIZER]},
        "spec": {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1"}, "persistentVolumeReclaimPolicy": "Delete"},
        "status": {"phase": "Released"}}))
    .unwrap()
}

#[test]
fn migrated_in_tree_volumes_are_deleted_by_their_target() {
    const EBS: &str = "ebs.csi.aws.com";
    let table = [
        (in_tree_pv("kubernetes.io/aws-ebs", None), EBS, VolumeDecision::Delete),
        (in_tree_pv("kubernetes.io/aws-ebs", Some(EBS)), EBS, VolumeDecision::Delete),
        (in_tree_pv("kubernetes.io/aws-ebs", None), "pd.csi.storage.gke.io", VolumeDecision::Ignore),
        (in_tree_pv("kubernetes.io/gce-pd", None), EBS, VolumeDecision::Ignore),
        (in_tree_pv("someone", Some(EBS)), EBS, VolumeDecision::Delete),
    ];
    for (pv, driver, want) in table {
        assert_eq!(decide_volume(&pv, driver), want, "{:?} {driver}", pv.metadata.annotations);
    }
    assert_eq!(volume_handle(&in_tree_pv("x", None)), Ok(("vol-1".to_string(), true)));
    let mut broken = in_tree_pv("x", None);
    broken.spec.as_mut().unwrap().aws_elastic_block_store.as_mut().unwrap().volume_id = "aws://z/bad".into();
    assert!(volume_handle(&broken).is_err());
}

#[test]
fn in_tree_classes_are_translated_for_their_target_only() {
    let sc: StorageClass = serde_json::from_value(serde_json::json!({"metadata": {"name": "gp2"},
        "provisioner": "kubernetes.io/aws-ebs", "parameters": {"type": "gp2", "fsType": "xfs"}}))
    .unwrap();
    let t = migrated_class(&sc, "ebs.csi.aws.com").unwrap().expect("translated");
    let params = t.parameters.unwrap();
    assert_eq!(params.get("csi.storage.k8s.io/fstype").map(String::as_str), Some("xfs"));
    assert!(!params.contains_key("fsType"));
    assert_eq!(migrated_class(&sc, DRIVER), Ok(None));
    let mut conflicting = sc.clone();
    conflicting.parameters = Some([("zone".to_string(), "a".to_string())].into());
    conflicting.allowed_topologies = Some(vec![Default::default()]);
    assert!(
        migrated_class(&conflicting, "ebs.csi.aws.com").unwrap_err().starts_with("failed to translate storage class")
    );
}

/// Every refusal of [`plan`], pinned with its whole `ProvisioningFailed`
/// text: upstream's (`prepareProvision`, `checkDriverCapabilities`,
/// `makeVolumeName`, csi-lib-utils `accessmodes`, `getSecretReference`,
/// `removePrefixedParameters`), reported as it is: the provisioning library
/// adds no StorageClass prefix.
#[test]
fn refusal_texts() {
    let claim = pvc(&[OURS], &["ReadWriteOnce"], "1Gi");
    let ok = driver(&[Rpc::CreateDeleteVolume]);
    let mut sel = claim.clone();
    sel.spec.as_mut().unwrap().selector = Some(Default::default());
    let mut no_uid = claim.clone();
    no_uid.metadata.uid = None;
    let mut odd_mode = claim.clone();
    odd_mode.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteSometimes".into()]);
    let no_prefix = Settings { volume_name_prefix: String::new(), ..settings() };
    let src = |kind: &str| SourceRef {
        kind: kind.into(),
        api_group: if kind == "VolumeSnapshot" { "snapshot.storage.k8s.io".into() } else { String::new() },
        name: "src".into(),
        namespace: "team-a".into(),
    };
    let immediate = |params: &[(&str, &str)]| sc(params, "Immediate");
    let no_service = DriverInfo::with_capabilities(DRIVER, &[], &[Rpc::CreateDeleteVolume]);
    let rows: Vec<(&str, Result<Plan, PlanError>, &str)> = vec![
        (
            "no CONTROLLER_SERVICE",
            plan(&claim, &immediate(&[]), &no_service, &settings(), None),
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported",
        ),
        (
            "no CREATE_DELETE_VOLUME",
            plan(&claim, &immediate(&[]), &driver(&[]), &settings(), None),
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
        ),
        (
            "restore without CREATE_DELETE_SNAPSHOT",
            plan(&claim, &immediate(&[]), &ok, &settings(), Some(&src("VolumeSnapshot"))),
            "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported",
        ),
        (
            "clone without CLONE_VOLUME",
            plan(&claim, &immediate(&[]), &ok, &settings(), Some(&src("PersistentVolumeClaim"))),
            "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
        ),
        ("selector", plan(&sel, &immediate(&[]), &ok, &settings(), None), "claim Selector is not supported"),
        (
            "empty volume name prefix",
            plan(&claim, &immediate(&[]), &ok, &no_prefix, None),
            "volume name prefix cannot be of length 0",
        ),
        ("no UID", plan(&no_uid, &immediate(&[]), &ok, &settings(), None), "corrupted PVC object, it is missing UID"),
        (
            "two fstypes",
            plan(
                &claim,
                &immediate(&[("fsType", "ext4"), ("csi.storage.k8s.io/fstype", "xfs")]),
                &ok,
                &settings(),
                None,
            ),
            "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys",
        ),
        (
            "unknown access mode",
            plan(&odd_mode, &immediate(&[]), &ok, &settings(), None),
            "unsupported AccessMode combination: [ReadWriteSometimes]",
        ),
        (
            "unknown reserved key",
            plan(&claim, &immediate(&[("csi.storage.k8s.io/bogus", "1")]), &ok, &settings(), None),
            "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/bogus\" with reserved namespace csi.storage.k8s.io/",
        ),
        (
            "half a secret reference",
            plan(&claim, &immediate(&[("csi.storage.k8s.io/provisioner-secret-name", "s")]), &ok, &settings(), None),
            "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified",
        ),
        (
            "half a default secret reference",
            plan(&claim, &immediate(&[("csi.storage.k8s.io/secret-namespace", "ns")]), &ok, &settings(), None),
            "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified",
        ),
        (
            "a secret given twice",
            plan(
                &claim,
                &immediate(&[
                    ("csiProvisionerSecretName", "a"),
                    ("csi.storage.k8s.io/provisioner-secret-name", "b"),
                    ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
                ]),
                &ok,
                &settings(),
                None,
            ),
            "failed to get name and namespace template from params: Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys",
        ),
        (
            "an empty secret name",
            plan(
                &claim,
                &immediate(&[
                    ("csi.storage.k8s.io/node-stage-secret-name", ""),
                    ("csi.storage.k8s.io/node-stage-secret-namespace", "ns"),
                ]),
                &ok,
                &settings(),
                None,
            ),
            "failed to get name and namespace template from params: NodeStage secrets specified in parameters but value of either namespace or name is empty",
        ),
        (
            "an unknown token",
            plan(
                &claim,
                &immediate(&[
                    ("csi.storage.k8s.io/node-publish-secret-name", "${pvc.uid}"),
                    ("csi.storage.k8s.io/node-publish-secret-namespace", "ns"),
                ]),
                &ok,
                &settings(),
                None,
            ),
            "error resolving value \"${pvc.uid}\": invalid tokens: [\"pvc.uid\"]",
        ),
        (
            "two unknown tokens",
            plan(
                &claim,
                &immediate(&[
                    ("csi.storage.k8s.io/node-publish-secret-name", "${pvc.uid}-${pv.uid}"),
                    ("csi.storage.k8s.io/node-publish-secret-namespace", "ns"),
                ]),
                &ok,
                &settings(),
                None,
            ),
            "error resolving value \"${pvc.uid}-${pv.uid}\": invalid tokens: [\"pv.uid\" \"pvc.uid\"]",
        ),
    ];
    for (what, got, want) in rows {
        assert_eq!(got.map(|p| p.pv_name).map_err(|e| e.to_string()), Err(want.to_string()), "{what}");
    }
}

/// The `ProvisioningFailed` texts of a failed `CreateVolume`: the provisioning
/// library's infeasible wording for `InvalidArgument`, else the gRPC error.
#[test]
fn create_error_texts() {
    use tonic::Code;
    let rows = [
        (
            Code::InvalidArgument,
            "rpc error: code = InvalidArgument desc = bad size",
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = bad size",
        ),
        (
            Code::ResourceExhausted,
            "rpc error: code = ResourceExhausted desc = full",
            "rpc error: code = ResourceExhausted desc = full",
        ),
        (
            Code::DeadlineExceeded,
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        ),
        (Code::Internal, "rpc error: code = Internal desc = boom", "rpc error: code = Internal desc = boom"),
    ];
    for (code, error, want) in rows {
        assert_eq!(create_error_text(code, error), want, "{code:?}");
    }
}

/// An unusable answer whose volume could not be deleted: upstream's two
/// spellings of "cleanup".
#[test]
fn orphaned_volume_texts() {
    let rows = [
        (
            ResponseError::TooSmall { got: 1024, want: 2048 }.to_string(),
            "created volume capacity 1024 less than requested capacity 2048. Cleanup of volume pvc-1 failed, volume is orphaned: rpc error: code = Internal desc = stuck",
        ),
        (
            ResponseError::NoContentSource.to_string(),
            "volume content source missing. cleanup of volume pvc-1 failed, volume is orphaned: rpc error: code = Internal desc = stuck",
        ),
    ];
    for (why, want) in rows {
        assert_eq!(orphaned_volume_text(&why, "pvc-1", "rpc error: code = Internal desc = stuck"), want, "{why}");
    }
}

/// DeleteVolume's secret: annotations first, else the class's templates for
/// the claim reference; a broken class refuses with upstream's
/// `VolumeFailedDelete` text.
#[test]
fn deletion_secrets() {
    let with = |ann: &[(&str, &str)], claim: bool| {
        let mut v = pv("Delete", "Released", false, false, DRIVER);
        v.metadata.annotations.get_or_insert_default().extend(ann.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let spec = v.spec.as_mut().unwrap();
        spec.storage_class_name = Some("fast".into());
        spec.claim_ref = claim.then(|| ObjectReference {
            name: Some("data".into()),
            namespace: Some("team-a".into()),
            ..Default::default()
        });
        v
    };
    let secret = |name: &str, namespace: &str| Some(SecretRef { name: name.into(), namespace: namespace.into() });
    let templated = sc(
        &[
            ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.name}-key"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
        ],
        "Immediate",
    );
    let half = sc(&[("csi.storage.k8s.io/provisioner-secret-name", "s")], "Immediate");
    let annotated = [(upstream::ANN_DELETION_SECRET_NAME, "a"), (upstream::ANN_DELETION_SECRET_NAMESPACE, "ns")];
    let blank = [(upstream::ANN_DELETION_SECRET_NAME, ""), (upstream::ANN_DELETION_SECRET_NAMESPACE, "")];
    type Want = Result<Option<SecretRef>, String>;
    let rows: Vec<(&str, PersistentVolume, Option<&StorageClass>, Want)> = vec![
        ("annotations", with(&annotated, true), Some(&half), Ok(secret("a", "ns"))),
        ("blank annotations", with(&blank, true), Some(&templated), Ok(None)),
        ("from the class", with(&[], true), Some(&templated), Ok(secret("data-key", "team-a"))),
        ("class gone", with(&[], true), None, Ok(None)),
        ("no claim reference", with(&[], false), Some(&templated), Ok(None)),
        (
            "broken class",
            with(&[], true),
            Some(&half),
            Err("failed to get secretreference for volume pv: failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified".into()),
        ),
    ];
    for (what, v, class, want) in rows {
        assert_eq!(deletion_secret_ref(&v, class), want, "{what}");
    }
}
