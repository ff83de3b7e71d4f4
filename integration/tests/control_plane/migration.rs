//! CSI migration against the real control plane (kube-controller-manager's
//! PV binder and attach-detach controller) and the real CSI mock driver
//! started under a migration target's name: a migrated claim is
//! provisioned with the translated class and gets an in-tree PV, which is
//! deleted through its translation; an in-tree PV is attached and detached
//! through its translation; an in-tree inline volume the attach-detach
//! controller translated is attached and detached; an in-tree PV that
//! kube-controller-manager hands over is expanded through its translation.
//! Each also checks the `migrated` label of `csi_sidecar_operations_seconds`.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin, free_port, http,
    kube_support::{TestNamespace, create, csi_node, node, volume_attachment, wait_deleted},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};

const T: Duration = Duration::from_secs(60);

struct Setup {
    driver: Proc,
    sidecar: Proc,
    ns: TestNamespace,
    node: String,
    metrics: String,
    /// Last: the processes (and their logs, printed on failure) go first.
    dir: tempfile::TempDir,
}

impl Setup {
    /// The mock driver named `driver_name` (a migration target) and one
    /// csi-sidecar with `modules`, serving /metrics.
    async fn start(prefix: &str, driver_name: &str, modules: &[&str]) -> Setup {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let ns = TestNamespace::new(&client, prefix).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let node_name = ns.scoped("node");
        let csi: PathBuf = dir.path().join("csi.sock");
        let args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={node_name}"),
            "--verbose".to_string(),
        ];
        let driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut sidecar_args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            format!("--http-endpoint={metrics}"),
        ];
        sidecar_args.extend(modules.iter().map(|m| m.to_string()));
        sidecar_args.extend(["--retry-interval-start=200ms", "--retry-interval-max=2s", "-v=5"].map(String::from));
        let sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &sidecar_args, dir.path());
        Setup { dir, driver, sidecar, ns, node: node_name, metrics }
    }

    /// The node (attach-detach managed) with a CSINode listing the driver
    /// and, as a kubelet with migration on writes it, the in-tree plugin as
    /// migrated.
    async fn node_for(&self, driver_name: &str, in_tree: &str) {
        let client = self.ns.client().clone();
        create(&Api::<Node>::all(client.clone()), &node(&self.node, &[])).await;
        let mut cn = csi_node(&self.node, driver_name, &self.node, &[]);
        cn.metadata.annotations =
            Some([("storage.alpha.kubernetes.io/migrated-plugins".to_string(), in_tree.to_string())].into());
        create(&Api::<CSINode>::all(client), &cn).await;
    }

    /// Waits until /metrics has a `csi_sidecar_operations_seconds` sample of
    /// `method` with `migrated="<migrated>"`.
    async fn wait_metric(&self, method: &str, migrated: &str) {
        let want = format!("migrated=\"{migrated}\"");
        let method = format!("method_name=\"/csi.v1.Controller/{method}\"");
        wait_until(&format!("a {method} sample with {want}"), T, async || {
            let body = http::get(&self.metrics, "/metrics").await.map(|r| r.body).unwrap_or_default();
            let hit = body.lines().any(|l| {
                l.starts_with("csi_sidecar_operations_seconds_count") && l.contains(&method) && l.contains(&want)
            });
            (hit, ())
        })
        .await;
    }

    fn diagnostics(&self) -> String {
        format!("--- sidecar ---\n{}\n--- driver ---\n{}", self.sidecar.logs(), self.driver.logs())
    }
}

fn json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("test object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_claim_gets_translated_class_and_in_tree_pv_and_is_deleted() {
    const DRIVER: &str = "ebs.csi.aws.com";
    let s = Setup::start("mig-prov", DRIVER, &["provisioner", "--extra-create-metadata"]).await;
    let client = s.ns.client().clone();
    let sc_name = s.ns.scoped("gp2");
    create(
        &Api::<StorageClass>::all(client.clone()),
        &json(serde_json::json!({
            "metadata": {"name": sc_name},
            "provisioner": "kubernetes.io/aws-ebs",
            "parameters": {"type": "gp2", "fsType": "xfs", "iopsPerGB": "10"},
            "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"})),
    )
    .await;
    // As the PV controller annotates a claim of a migrated plugin.
    let claim: PersistentVolumeClaim = json(serde_json::json!({
        "metadata": {"name": "data", "annotations": {
            "volume.beta.kubernetes.io/storage-provisioner": DRIVER,
            "volume.kubernetes.io/storage-provisioner": DRIVER,
            "pv.kubernetes.io/migrated-to": DRIVER}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc_name,
                 "resources": {"requests": {"storage": "1Mi"}}}}));
    create(&s.ns.api(), &claim).await;
    let pvcs: Api<PersistentVolumeClaim> = s.ns.api();
    let bound = wait_until("the migrated claim bound", T, async || {
        let c = pvcs.get_opt("data").await.ok().flatten();
        let ok = c.as_ref().and_then(|c| c.status.as_ref()?.phase.as_deref()) == Some("Bound");
        (ok, c)
    })
    .await
    .unwrap_or_else(|| panic!("claim not bound\n{}", s.diagnostics()));
    let pv_name = bound.spec.and_then(|s| s.volume_name).expect("volumeName");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await.expect("PV");
    let spec = pv.spec.clone().expect("spec");
    assert!(spec.csi.is_none(), "the PV is saved in the in-tree form: {spec:?}");
    let ebs = spec.aws_elastic_block_store.expect("awsElasticBlockStore");
    assert_eq!(ebs.fs_type.as_deref(), Some("xfs"), "the translated csi.storage.k8s.io/fstype");
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get("pv.kubernetes.io/provisioned-by").map(String::as_str), Some("kubernetes.io/aws-ebs"));
    // The CreateVolume parameters are the translated class's, with the metadata.
    let logs = s.driver.logs();
    let create_req = logs
        .lines()
        .skip_while(|l| !l.contains("/csi.v1.Controller/CreateVolume"))
        .find(|l| l.contains("request:"))
        .unwrap_or_else(|| panic!("no CreateVolume request logged\n{logs}"));
    for want in [
        "\"allowautoiopspergbincrease\":\"true\"",
        "\"iopsPerGB\":\"10\"",
        "csi.storage.k8s.io/pvc/name",
        "{\"fsType\":\"xfs\"}",
    ] {
        assert!(create_req.contains(want), "{want} missing in {create_req}");
    }
    assert!(!create_req.contains("\"fsType\":\"xfs\"}, \"parameters\""), "fstype is no parameter: {create_req}");
    s.wait_metric("CreateVolume", "true").await;

    // Deleting the claim deletes the volume (through the translation) and the PV.
    pvcs.delete("data", &DeleteParams::default()).await.expect("delete claim");
    wait_deleted(&pvs, &pv_name, T).await;
    let logs = s.driver.logs();
    assert!(logs.contains("/csi.v1.Controller/DeleteVolume -> OK"), "no DeleteVolume\n{}", s.diagnostics());
    assert!(logs.contains(&format!("\"volumeId\":\"{}\"", ebs.volume_id)), "DeleteVolume of another volume\n{logs}");
    s.wait_metric("DeleteVolume", "true").await;
    drop(s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_pv_is_attached_and_detached_through_translation() {
    const DRIVER: &str = "cinder.csi.openstack.org";
    let s = Setup::start("mig-att", DRIVER, &["attacher"]).await;
    s.node_for(DRIVER, "kubernetes.io/cinder").await;
    let client = s.ns.client().clone();
    let pv_name = s.ns.scoped("pv");
    // The mock's pre-existing volume "2"; Cinder's handle is its volumeID.
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        &json(serde_json::json!({"metadata": {"name": pv_name},
            "spec": {"cinder": {"volumeID": "2", "fsType": "ext4"}, "accessModes": ["ReadWriteOnce"],
                     "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Retain", "storageClassName": ""}})),
    )
    .await;
    let va_name = s.ns.scoped("va");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    create(&vas, &volume_attachment(&va_name, DRIVER, &s.node, &pv_name)).await;
    let va = wait_until("the in-tree PV attached", T, async || {
        let v = vas.get_opt(&va_name).await.ok().flatten();
        (v.as_ref().and_then(|v| v.status.as_ref()).is_some_and(|st| st.attached), v)
    })
    .await
    .unwrap_or_else(|| panic!("not attached\n{}", s.diagnostics()));
    assert!(va.metadata.finalizers.iter().flatten().any(|f| f.starts_with("external-attacher/")), "{va:?}");
    let logs = s.driver.logs();
    assert!(logs.contains("\"volumeId\":\"2\""), "ControllerPublishVolume of the translated handle\n{logs}");
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&pv_name).await.expect("pv");
    assert!(
        pv.metadata.finalizers.iter().flatten().any(|f| f.starts_with("external-attacher/")),
        "PV finalizer: {pv:?}"
    );
    s.wait_metric("ControllerPublishVolume", "true").await;

    vas.delete(&va_name, &DeleteParams::default()).await.expect("delete VA");
    wait_deleted(&vas, &va_name, T).await;
    assert!(s.driver.logs().contains("/csi.v1.Controller/ControllerUnpublishVolume -> OK"), "{}", s.diagnostics());
    s.wait_metric("ControllerUnpublishVolume", "true").await;
    // The attacher's PV finalizer goes once no attachment references the
    // PV: a statically created in-tree PV carries no
    // `pv.kubernetes.io/migrated-to`, so it is handed back to
    // kube-controller-manager (as upstream) without being deleted.
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    wait_until("the attacher's finalizer removed from the detached in-tree PV", T, async || {
        let pv = pvs.get_opt(&pv_name).await.ok().flatten();
        let ours = pv
            .as_ref()
            .is_some_and(|p| p.metadata.finalizers.iter().flatten().any(|f| f.starts_with("external-attacher/")));
        let live = pv.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_none());
        (live && !ours, ())
    })
    .await;
    pvs.delete(&pv_name, &DeleteParams::default()).await.expect("delete pv");
    wait_deleted(&pvs, &pv_name, T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_volume_handed_over_by_the_attach_detach_controller_is_attached() {
    const DRIVER: &str = "pxd.portworx.com";
    let s = Setup::start("mig-inline", DRIVER, &["attacher"]).await;
    s.node_for(DRIVER, "kubernetes.io/portworx-volume").await;
    let client = s.ns.client().clone();
    // A pod on the node with an in-tree inline volume: the attach-detach
    // controller translates it and creates a VolumeAttachment with the
    // inline spec (the mock's volume "3"; Portworx's handle is its volumeID).
    let pod: Pod = json(serde_json::json!({"metadata": {"name": "app"},
        "spec": {"nodeName": s.node, "containers": [{"name": "c", "image": "registry.invalid/never-pulled:0"}],
                 "volumes": [{"name": "v", "portworxVolume": {"volumeID": "3", "fsType": "ext4"}}]}}));
    create(&s.ns.api(), &pod).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va = wait_until("an attached VolumeAttachment for the inline volume", T, async || {
        let hit = vas.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default().into_iter().find(|v| {
            v.spec.node_name == s.node
                && v.spec
                    .source
                    .inline_volume_spec
                    .as_ref()
                    .and_then(|i| i.csi.as_ref())
                    .is_some_and(|c| c.volume_handle == "3")
        });
        (hit.as_ref().and_then(|v| v.status.as_ref()).is_some_and(|st| st.attached), hit)
    })
    .await
    .unwrap_or_else(|| panic!("inline volume not attached\n{}", s.diagnostics()));
    assert_eq!(va.spec.attacher, DRIVER);
    s.wait_metric("ControllerPublishVolume", "true").await;
    let va_name = va.metadata.name.clone().expect("name");
    let pods: Api<Pod> = s.ns.api();
    pods.delete("app", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("delete pod");
    wait_deleted(&vas, &va_name, T).await;
    assert!(s.driver.logs().contains("/csi.v1.Controller/ControllerUnpublishVolume -> OK"), "{}", s.diagnostics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_pv_is_expanded_through_translation_once_handed_over() {
    const DRIVER: &str = "cinder.csi.openstack.org";
    let s = Setup::start("mig-rsz", DRIVER, &["resizer"]).await;
    let client = s.ns.client().clone();
    let ns = s.ns.name().to_string();
    // An in-tree class that allows expansion, and an in-tree PV (the mock's
    // volume "1", of 1 TiB; Cinder's handle is its volumeID) pre-bound to a claim.
    let sc = s.ns.scoped("sc");
    create(
        &Api::<StorageClass>::all(client.clone()),
        &json(serde_json::json!({"metadata": {"name": sc}, "provisioner": "kubernetes.io/cinder",
            "allowVolumeExpansion": true})),
    )
    .await;
    let pv_name = s.ns.scoped("pv");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    create(
        &pvs,
        &json(serde_json::json!({"metadata": {"name": pv_name},
            "spec": {"cinder": {"volumeID": "1", "fsType": "ext4"}, "accessModes": ["ReadWriteOnce"],
                     "capacity": {"storage": "1Ti"}, "persistentVolumeReclaimPolicy": "Retain",
                     "storageClassName": sc, "claimRef": {"namespace": ns, "name": "data"}}})),
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = s.ns.api();
    create(
        &pvcs,
        &json(serde_json::json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": sc, "volumeName": pv_name, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Ti"}}}})),
    )
    .await;
    wait_until("the claim bound by the PV binder", T, async || {
        let c = pvcs.get_opt("data").await.ok().flatten();
        (c.as_ref().and_then(|c| c.status.as_ref()).and_then(|st| st.phase.as_deref()) == Some("Bound"), ())
    })
    .await;
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Ti"}}}});
    pvcs.patch("data", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("request 2Ti");
    // kube-controller-manager's expand controller names the CSI driver the
    // claim's resizer; the resizer then expands the translated volume.
    let claim = wait_until("the claim expanded to 2Ti", T, async || {
        let c = pvcs.get_opt("data").await.ok().flatten();
        let cap = c.as_ref().and_then(|c| c.status.as_ref()?.capacity.as_ref()?.get("storage")).map(|q| q.0.clone());
        (cap.as_deref() == Some("2Ti"), c)
    })
    .await
    .unwrap_or_else(|| panic!("not expanded\n{}", s.diagnostics()));
    let resizer = claim.metadata.annotations.unwrap_or_default().get("volume.kubernetes.io/storage-resizer").cloned();
    assert_eq!(resizer.as_deref(), Some(DRIVER), "handed over by kube-controller-manager");
    let pv = pvs.get(&pv_name).await.expect("pv");
    let spec = pv.spec.expect("spec");
    assert_eq!(spec.capacity.and_then(|c| c.get("storage").cloned()).map(|q| q.0).as_deref(), Some("2Ti"));
    assert!(spec.cinder.is_some() && spec.csi.is_none(), "the PV stays in-tree");
    // Each call the mock logs is followed by its request.
    let logs = s.driver.logs();
    let lines: Vec<&str> = logs.lines().collect();
    let requests: Vec<&str> = lines
        .windows(2)
        .filter(|w| w[0].contains("/csi.v1.Controller/ControllerExpandVolume -> OK"))
        .map(|w| w[1])
        .collect();
    assert_eq!(requests.len(), 1, "one ControllerExpandVolume\n{logs}");
    assert!(requests[0].contains("\"volumeId\":\"1\""), "the translated handle: {}", requests[0]);
    s.wait_metric("ControllerExpandVolume", "true").await;
}
