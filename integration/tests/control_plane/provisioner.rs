//! provisioner against the real kube-apiserver, the real PV binder and
//! protection controllers (kube-controller-manager) and the real CSI driver.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{
        TestNamespace, bound_pv, create, csi_pv, pvc, storage_class, unique_name, wait_deleted, wait_event, wait_for,
    },
    process::Proc,
    symlinked_bin, wait_until,
};
use k8s_openapi::{
    ByteString,
    api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret},
    api::storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

const T: Duration = Duration::from_secs(30);
const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// A real CSI driver with a unique name and a provisioner serving it.
struct Setup {
    dir: tempfile::TempDir,
    driver_name: String,
    driver: Proc,
    provisioner: Proc,
}

impl Setup {
    fn start(cp: &ControlPlane, extra: &[&str]) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("mock"));
        let csi: PathBuf = dir.path().join("csi.sock");
        let driver = Proc::spawn(
            "csi-mock-driver",
            &component_bin("csi-mock-driver"),
            &[
                format!("--endpoint=unix://{}", csi.display()),
                format!("--name={driver_name}"),
                "--node-id=node-1".into(),
            ],
            dir.path(),
        );
        let mut args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "-v=5".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let provisioner =
            Proc::spawn("csi-provisioner", &symlinked_bin(dir.path(), "csi-provisioner"), &args, dir.path());
        Setup { dir, driver_name, driver, provisioner }
    }

    /// The driver's CSI calls of `method` that succeeded.
    fn calls_ok(&self, method: &str) -> usize {
        self.driver.logs().lines().filter(|l| l.contains(&format!("/{method} -> OK"))).count()
    }
}

#[tokio::test]
async fn provisions_binds_and_deletes_through_the_real_controllers() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "prov").await;
    let s = Setup::start(cp, &[]);
    let sc_name = ns.scoped("sc");
    let mut sc = storage_class(&sc_name, &s.driver_name);
    sc.parameters = Some(
        [("type".to_string(), "fast".to_string()), ("csi.storage.k8s.io/fstype".to_string(), "ext4".to_string())]
            .into(),
    );
    sc.mount_options = Some(vec!["noatime".into()]);
    create(&Api::<StorageClass>::all(ns.client().clone()), &sc).await;
    let claim = create(&ns.api(), &pvc("data", Some(&sc_name), "2Mi")).await;

    let pv = bound_pv(T, &ns, "data").await;
    let uid = claim.metadata.uid.clone().expect("uid");
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{uid}").as_str()));
    let spec = pv.spec.clone().expect("spec");
    let csi = spec.csi.clone().expect("csi source");
    assert_eq!(csi.driver, s.driver_name);
    assert!(!csi.volume_handle.is_empty());
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    let identity = &csi.volume_attributes.as_ref().expect("attributes")["storage.kubernetes.io/csiProvisionerIdentity"];
    assert!(identity.ends_with(&format!("-{}", s.driver_name)), "{identity}");
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.storage_class_name.as_deref(), Some(sc_name.as_str()));
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(spec.capacity.as_ref().expect("capacity")["storage"].0, "2Mi");
    assert_eq!(spec.claim_ref.as_ref().and_then(|c| c.uid.clone()), Some(uid));
    let ann = pv.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann["pv.kubernetes.io/provisioned-by"], s.driver_name);
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-name"], "");
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"], "");
    assert!(pv.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER), "{:?}", pv.metadata.finalizers);
    wait_event(T, &ns, "data", "Provisioning", "External provisioner is provisioning volume for claim").await;
    wait_event(
        T,
        &ns,
        "data",
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume pvc-{}", claim.metadata.uid.clone().unwrap_or_default()),
    )
    .await;
    assert_eq!(s.calls_ok("CreateVolume"), 1, "exactly one CreateVolume");

    // Delete the PVC: the binder releases the PV, the provisioner deletes the
    // backend volume and the PV, and the finalizers let it go.
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    pvcs.delete("data", &DeleteParams::default()).await.expect("delete PVC");
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    wait_deleted(&pvs, pv.metadata.name.as_deref().unwrap_or_default(), T).await;
    wait_until("DeleteVolume", T, async || (s.calls_ok("DeleteVolume") >= 1, s.driver.logs())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.calls_ok("DeleteVolume"), 1, "exactly one DeleteVolume:\n{}", s.driver.logs());
    drop(s.dir);
    ns.delete().await;
}

#[tokio::test]
async fn retain_keeps_the_backend_volume() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "retain").await;
    let s = Setup::start(cp, &[]);
    let sc_name = ns.scoped("sc");
    let mut sc = storage_class(&sc_name, &s.driver_name);
    sc.reclaim_policy = Some("Retain".into());
    create(&Api::<StorageClass>::all(ns.client().clone()), &sc).await;
    create(&ns.api(), &pvc("keep", Some(&sc_name), "1Mi")).await;
    let pv = bound_pv(T, &ns, "keep").await;
    assert!(
        !pv.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER),
        "Retain PVs carry no provisioner finalizer"
    );
    Api::<PersistentVolumeClaim>::namespaced(ns.client().clone(), ns.name())
        .delete("keep", &DeleteParams::default())
        .await
        .expect("delete");
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    let name = pv.metadata.name.clone().unwrap_or_default();
    wait_for(&pvs, &name, T, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pvs.get_opt(&name).await.expect("get").is_some(), "a Retain PV stays");
    assert_eq!(s.calls_ok("DeleteVolume"), 0, "no DeleteVolume for Retain:\n{}", s.driver.logs());
    ns.delete().await;
}

/// A statically provisioned PV of the driver with reclaim policy Delete
/// (upstream's HonorPVReclaimPolicy, KEP-2644; Kubernetes' e2e "CSI Mock
/// honor pv reclaim policy" static specs): protected by the finalizer while
/// bound, and its backend volume deleted with the claim.
#[tokio::test]
async fn a_static_delete_volume_is_protected_and_deleted_with_its_claim() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "static").await;
    let s = Setup::start(cp, &[]);
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    let name = ns.scoped("static-pv");
    // The mock driver starts with volume "1".
    let mut pv = csi_pv(&name, &s.driver_name, "1", "1Mi");
    if let Some(spec) = pv.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = Some("Delete".into());
    }
    create(&pvs, &pv).await;
    let mut claim = pvc("static", None, "1Mi");
    if let Some(spec) = claim.spec.as_mut() {
        spec.volume_name = Some(name.clone());
    }
    create(&ns.api(), &claim).await;
    wait_for(&pvs, &name, T, |p| p.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)).await;

    Api::<PersistentVolumeClaim>::namespaced(ns.client().clone(), ns.name())
        .delete("static", &DeleteParams::default())
        .await
        .expect("delete");
    wait_deleted(&pvs, &name, T).await;
    assert_eq!(s.calls_ok("DeleteVolume"), 1, "the backend volume deleted once:\n{}", s.driver.logs());
    ns.delete().await;
}

#[tokio::test]
async fn secrets_templates_and_naming_flags() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "secrets").await;
    let s = Setup::start(cp, &["--volume-name-prefix=vol", "--volume-name-uuid-length=8", "--extra-create-metadata"]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some("creds-db".into()), ..Default::default() },
        data: Some([("password".to_string(), ByteString(b"hunter2".to_vec()))].into()),
        ..Default::default()
    };
    create(&ns.api(), &secret).await;
    let sc_name = ns.scoped("sc");
    let mut sc = storage_class(&sc_name, &s.driver_name);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "creds-${pvc.name}"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
            ("csi.storage.k8s.io/node-publish-secret-name", "np-${pvc.name}"),
            ("csi.storage.k8s.io/node-publish-secret-namespace", "${pvc.namespace}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    create(&Api::<StorageClass>::all(ns.client().clone()), &sc).await;
    let claim = create(&ns.api(), &pvc("db", Some(&sc_name), "1Mi")).await;
    let pv = bound_pv(T, &ns, "db").await;
    let compact: String = claim.metadata.uid.unwrap_or_default().chars().filter(|c| *c != '-').take(8).collect();
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("vol-{compact}").as_str()));
    let ann = pv.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-name"], "creds-db");
    assert_eq!(ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"], ns.name());
    let np = pv.spec.and_then(|s| s.csi).and_then(|c| c.node_publish_secret_ref).expect("nodePublishSecretRef");
    assert_eq!((np.name.as_deref(), np.namespace.as_deref()), (Some("np-db"), Some(ns.name())));
    assert!(!s.provisioner.logs().contains("hunter2"), "secrets must never be logged");
    ns.delete().await;
}

#[tokio::test]
async fn bad_storage_classes_and_missing_secrets_are_events_not_volumes() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "badsc").await;
    let s = Setup::start(cp, &[]);
    let scs: Api<StorageClass> = Api::all(ns.client().clone());
    let bad = ns.scoped("bad");
    let mut sc = storage_class(&bad, &s.driver_name);
    sc.parameters = Some([("csi.storage.k8s.io/frobnicate".to_string(), "1".to_string())].into());
    create(&scs, &sc).await;
    create(&ns.api(), &pvc("bad-param", Some(&bad), "1Mi")).await;
    let e = wait_event(
        T,
        &ns,
        "bad-param",
        "ProvisioningFailed",
        "found unknown parameter key \"csi.storage.k8s.io/frobnicate\"",
    )
    .await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    // Upstream's provisioning library reports what `Provision` returned as
    // it is, without a `failed to provision volume with StorageClass` prefix.
    assert_eq!(
        e.message.as_deref(),
        Some(
            "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/frobnicate\" with reserved namespace csi.storage.k8s.io/"
        )
    );

    let nosecret = ns.scoped("nosecret");
    let mut sc = storage_class(&nosecret, &s.driver_name);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "absent"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    create(&scs, &sc).await;
    create(&ns.api(), &pvc("no-secret", Some(&nosecret), "1Mi")).await;
    wait_event(
        T,
        &ns,
        "no-secret",
        "ProvisioningFailed",
        &format!("error getting secret absent in namespace {}", ns.name()),
    )
    .await;

    let badtpl = ns.scoped("badtpl");
    let mut sc = storage_class(&badtpl, &s.driver_name);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.name}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    create(&scs, &sc).await;
    create(&ns.api(), &pvc("bad-template", Some(&badtpl), "1Mi")).await;
    wait_event(T, &ns, "bad-template", "ProvisioningFailed", "invalid tokens").await;

    // A secret value that is not UTF-8: refused by name, never altered.
    let binary = ns.scoped("binsecret");
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some("bin".into()), ..Default::default() },
        data: Some([("password".to_string(), k8s_openapi::ByteString(vec![b'p', 0xff, b'w']))].into()),
        ..Default::default()
    };
    create(&ns.api(), &secret).await;
    let mut sc = storage_class(&binary, &s.driver_name);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "bin"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    create(&scs, &sc).await;
    create(&ns.api(), &pvc("binary-secret", Some(&binary), "1Mi")).await;
    wait_event(
        T,
        &ns,
        "binary-secret",
        "ProvisioningFailed",
        &format!("secret bin in namespace {}: the value of key \"password\" is not valid UTF-8", ns.name()),
    )
    .await;

    assert_eq!(s.calls_ok("CreateVolume"), 0, "no CreateVolume for unusable classes:\n{}", s.driver.logs());
    let pvs: Api<PersistentVolume> = Api::all(ns.client().clone());
    let ours = pvs
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|c| c.driver == s.driver_name))
        .count();
    assert_eq!(ours, 0);
    ns.delete().await;
}

/// A topology-aware driver: without a CSINode carrying its keys there is no
/// topology ("no available topology found", retried); with one, the PV gets
/// the driver's accessible topology as nodeAffinity.
#[tokio::test]
async fn topology_from_csinodes_and_node_labels() {
    use csi_sidecar_integration::kube_support::{csi_node, node};
    use k8s_openapi::api::{core::v1::Node, storage::v1::CSINode};
    const KEY: &str = "io.kubernetes.storage.mock/node";
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "topo").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let driver_name = format!("{}.csi.example.com", unique_name("topo"));
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), format!("--name={driver_name}"), "--enable-topology".into()],
        dir.path(),
    );
    let args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "--retry-interval-start=200ms".to_string(),
        "--retry-interval-max=1s".to_string(),
    ];
    let _p = Proc::spawn("csi-provisioner", &symlinked_bin(dir.path(), "csi-provisioner"), &args, dir.path());
    let sc_name = ns.scoped("sc");
    create(&Api::<StorageClass>::all(ns.client().clone()), &storage_class(&sc_name, &driver_name)).await;
    create(&ns.api(), &pvc("zoned", Some(&sc_name), "1Mi")).await;
    wait_event(T, &ns, "zoned", "ProvisioningFailed", "no available topology found").await;

    let node_name = ns.scoped("node");
    create(&Api::<Node>::all(ns.client().clone()), &node(&node_name, &[(KEY, "some-mock-node")])).await;
    create(&Api::<CSINode>::all(ns.client().clone()), &csi_node(&node_name, &driver_name, "n", &[KEY])).await;
    let pv = bound_pv(T, &ns, "zoned").await;
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    let expr = terms
        .first()
        .and_then(|t| t.match_expressions.as_ref())
        .and_then(|e| e.first())
        .cloned()
        .expect("nodeAffinity");
    assert_eq!((expr.key.as_str(), expr.operator.as_str()), (KEY, "In"));
    assert_eq!(expr.values, Some(vec!["some-mock-node".to_string()]));
    ns.delete().await;
}
