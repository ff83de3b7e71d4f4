//! provisioner and VolumeAttributesClass against the real kube-apiserver (it
//! serves `storage.k8s.io/v1` VolumeAttributesClass), the real PV binder and
//! the CSI mock driver, which logs every CreateVolume request it served
//! (`--verbose`): the class's parameters reach the driver as
//! `mutable_parameters`; a missing class or a class of another driver is an
//! event and no CreateVolume.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{TestNamespace, bound_pv, create, events_for, pvc, storage_class, unique_name, wait_event},
    process::Proc,
    symlinked_bin,
};
use k8s_openapi::{
    api::{
        core::v1::PersistentVolumeClaim,
        storage::v1::{StorageClass, VolumeAttributesClass},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::Api;

const T: Duration = Duration::from_secs(30);

struct Setup {
    _dir: tempfile::TempDir,
    driver_name: String,
    driver: Proc,
    _provisioner: Proc,
}

impl Setup {
    fn start(cp: &ControlPlane) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("vac"));
        let csi: PathBuf = dir.path().join("csi.sock");
        let driver = Proc::spawn(
            "csi-mock-driver",
            &component_bin("csi-mock-driver"),
            &[format!("--endpoint=unix://{}", csi.display()), format!("--name={driver_name}"), "--verbose".into()],
            dir.path(),
        );
        let args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "-v=5".to_string(),
        ];
        let provisioner =
            Proc::spawn("csi-provisioner", &symlinked_bin(dir.path(), "csi-provisioner"), &args, dir.path());
        Setup { _dir: dir, driver_name, driver, _provisioner: provisioner }
    }

    /// The JSON requests of the CreateVolume calls the driver served for `name`.
    fn create_requests(&self, name: &str) -> Vec<serde_json::Value> {
        let logs = self.driver.logs();
        let mut out = Vec::new();
        let mut in_create = false;
        for line in logs.lines() {
            if line.contains("/csi.v1.Controller/") {
                in_create = line.contains("/csi.v1.Controller/CreateVolume");
                continue;
            }
            if in_create && let Some(json) = line.split_once("request: ").map(|(_, j)| j) {
                let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
                if v["name"] == name {
                    out.push(v);
                }
            }
        }
        out
    }
}

fn vac(name: &str, driver: &str, params: &[(&str, &str)]) -> VolumeAttributesClass {
    VolumeAttributesClass {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        driver_name: driver.to_string(),
        parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
    }
}

fn claim_with_class(name: &str, sc: &str, class: &str) -> PersistentVolumeClaim {
    let mut c = pvc(name, Some(sc), "1Mi");
    if let Some(s) = c.spec.as_mut() {
        s.volume_attributes_class_name = Some(class.to_string());
    }
    c
}

#[tokio::test]
async fn the_class_parameters_reach_create_volume_and_bad_classes_are_events_without_a_call() {
    let cp = ControlPlane::shared();
    let ns = TestNamespace::new(&cp.client().await, "vac").await;
    let s = Setup::start(cp);
    let sc_name = ns.scoped("sc");
    create(&Api::<StorageClass>::all(ns.client().clone()), &storage_class(&sc_name, &s.driver_name)).await;
    let vacs: Api<VolumeAttributesClass> = Api::all(ns.client().clone());
    let gold = ns.scoped("gold");
    create(&vacs, &vac(&gold, &s.driver_name, &[("iops", "3000"), ("throughput", "125")])).await;
    let foreign = ns.scoped("foreign");
    create(&vacs, &vac(&foreign, "other.csi.example.com", &[("iops", "1")])).await;

    // The class's parameters are CreateVolume's mutable_parameters; the PV names the class.
    let claim = create(&ns.api(), &claim_with_class("fast", &sc_name, &gold)).await;
    let pv = bound_pv(T, &ns, "fast").await;
    assert_eq!(pv.spec.as_ref().and_then(|s| s.volume_attributes_class_name.as_deref()), Some(gold.as_str()));
    let pv_name = format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default());
    let reqs = s.create_requests(&pv_name);
    assert!(!reqs.is_empty(), "no CreateVolume request logged for {pv_name}:\n{}", s.driver.logs());
    for r in &reqs {
        assert_eq!(
            r["mutableParameters"],
            serde_json::json!({"iops": "3000", "throughput": "125"}),
            "CreateVolume without the class's parameters: {r}"
        );
        assert!(r["parameters"].get("iops").is_none(), "class parameters are not StorageClass parameters: {r}");
    }

    // A class that does not exist: upstream's text (the apiserver's NotFound), no CreateVolume.
    let missing = ns.scoped("missing");
    let lost = create(&ns.api(), &claim_with_class("lost", &sc_name, &missing)).await;
    let text = format!("volumeattributesclasses.storage.k8s.io \"{missing}\" not found");
    wait_event(T, &ns, "lost", "ProvisioningFailed", &text).await;

    // A class of another driver: upstream's text, no CreateVolume.
    let other = create(&ns.api(), &claim_with_class("other", &sc_name, &foreign)).await;
    let text = format!(
        "VAC {foreign} referenced in PVC is for driver other.csi.example.com which does not match driver name {}",
        s.driver_name
    );
    wait_event(T, &ns, "other", "ProvisioningFailed", &text).await;

    for c in [&lost, &other] {
        let name = format!("pvc-{}", c.metadata.uid.clone().unwrap_or_default());
        assert!(s.create_requests(&name).is_empty(), "CreateVolume for {name} despite a bad class");
        let events = events_for(&ns, c.metadata.name.as_deref().unwrap_or_default()).await;
        assert!(
            !events.iter().any(|e| e.reason.as_deref() == Some("ProvisioningSucceeded")),
            "provisioned despite a bad class: {events:?}"
        );
    }
    ns.delete().await;
}
