//! The whole CSI workflow on a real node: the real kube-scheduler and a real
//! kubelet (kubemark's hollow kubelet: the kubelet's own volume manager, CSI
//! plugin and plugin manager, with a fake container runtime and mounter),
//! the real attach-detach and PV controllers, Kubernetes' CSI mock driver,
//! and csi-sidecar twice: `registrar prober` on the node, `provisioner
//! attacher resizer` as the controller. Every step is asserted from the API and from
//! the driver's own record of the calls it served.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::{ControlPlane, NodeInfo},
    component_bin, free_port,
    kube_support::{
        NEVER_PULLED_IMAGE, TestNamespace, create, pvc, storage_class, unique_name, wait_deleted, wait_for,
    },
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

const T: Duration = Duration::from_secs(60);
/// The topology key of the mock driver (`--enable-topology`).
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";

/// The mock driver on the node and the two csi-sidecar processes.
struct World {
    node: NodeInfo,
    driver_name: String,
    driver: Proc,
    node_sidecar: Proc,
    controller: Option<Proc>,
    _dir: tempfile::TempDir,
}

impl World {
    /// The driver's socket in the node's plugins directory, the node
    /// csi-sidecar registering it with the kubelet.
    fn start(cp: &ControlPlane) -> World {
        let node = cp.info().nodes.first().cloned().expect("the launcher runs a node");
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("wf"));
        let sock_dir = node.plugins_dir.join(&driver_name);
        std::fs::create_dir_all(&sock_dir).expect("driver dir");
        let sock: PathBuf = sock_dir.join("csi.sock");
        let args = vec![
            format!("--endpoint=unix://{}", sock.display()),
            format!("--name={driver_name}"),
            format!("--node-id={}", node.name),
            "--enable-topology".to_string(),
            // NodeExpandVolume after ControllerExpandVolume.
            "--node-expand-required".to_string(),
        ];
        let driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
        let args = vec![
            format!("--csi-address={}", sock.display()),
            format!("--http-endpoint=127.0.0.1:{}", free_port()),
            "-v=4".to_string(),
            "registrar".to_string(),
            format!("--kubelet-registration-path={}", sock.display()),
            format!("--plugin-registration-path={}", node.registration_dir.display()),
            "prober".to_string(),
        ];
        let node_sidecar = Proc::spawn("csi-sidecar-node", &sidecar_bin(), &args, dir.path());
        World { node, driver_name, driver, node_sidecar, controller: None, _dir: dir }
    }

    fn sock(&self) -> PathBuf {
        self.node.plugins_dir.join(&self.driver_name).join("csi.sock")
    }

    /// The controller csi-sidecar: provisioner (with topology), attacher and resizer.
    fn start_controller(&mut self, cp: &ControlPlane) {
        let args = vec![
            format!("--csi-address={}", self.sock().display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "-v=4".to_string(),
            "provisioner".to_string(),
            "--feature-gates=Topology=true".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "attacher".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "resizer".to_string(),
            "--retry-interval-start=200ms".to_string(),
        ];
        self.controller = Some(Proc::spawn("csi-sidecar-controller", &sidecar_bin(), &args, self._dir.path()));
    }

    /// Successful calls of `method` (e.g. `Node/NodeStageVolume`) the driver logged.
    fn calls(&self, method: &str) -> usize {
        let needle = format!("/csi.v1.{method} -> OK");
        self.driver.logs().lines().filter(|l| l.contains(&needle)).count()
    }

    async fn wait_calls(&self, method: &str, n: usize) {
        wait_until(&format!("{n} successful {method} calls"), T, async || {
            let seen = self.calls(method);
            (seen >= n, seen)
        })
        .await;
    }
}

fn step(what: &str) {
    eprintln!("node_workflow: {what}");
}

#[tokio::test]
async fn a_pod_with_a_new_claim_runs_on_the_real_node_and_everything_is_undone_after_it() {
    let cp = ControlPlane::with_node();
    let client = cp.client().await;
    let mut w = World::start(cp);
    let node = w.node.name.clone();

    // 1. The kubelet's plugin manager finds the registrar's socket, its CSI
    //    plugin calls NodeGetInfo and writes the CSINode and the node ID.
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let csinode = wait_for(&csinodes, &node, T, |c| c.spec.drivers.iter().any(|d| d.name == w.driver_name)).await;
    let entry = csinode.spec.drivers.iter().find(|d| d.name == w.driver_name).expect("driver entry");
    assert_eq!(entry.node_id, node, "{csinode:?}");
    assert_eq!(entry.topology_keys.as_deref(), Some(&[TOPOLOGY_KEY.to_string()][..]), "{csinode:?}");
    assert!(w.calls("Node/NodeGetInfo") >= 1, "the kubelet asked the driver: {}", w.driver.logs());
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(&node).await.expect("node");
    let ids = n.metadata.annotations.unwrap_or_default().get("csi.volume.kubernetes.io/nodeid").cloned();
    assert!(ids.is_some_and(|ids| ids.contains(&w.driver_name)), "node ID annotation");
    assert!(n.metadata.labels.unwrap_or_default().contains_key(TOPOLOGY_KEY), "topology label");
    step("registered with the kubelet: CSINode written by the kubelet");

    // 2. A WaitForFirstConsumer class and a pod with a new claim: the real
    //    scheduler picks the node, the provisioner provisions for it.
    w.start_controller(cp);
    let ns = TestNamespace::new(&client, "wf").await;
    let sc = ns.scoped("sc");
    let mut class = storage_class(&sc, &w.driver_name);
    class.volume_binding_mode = Some("WaitForFirstConsumer".to_string());
    class.allow_volume_expansion = Some(true);
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("data", Some(&sc), "1Gi")).await;
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app"},
        "spec": {
            "containers": [{"name": "c", "image": NEVER_PULLED_IMAGE,
                            "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
            "terminationGracePeriodSeconds": 1
        }
    }))
    .expect("pod");
    create(&pods, &pod).await;
    let claim =
        wait_for(&pvcs, "data", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let selected = claim.metadata.annotations.unwrap_or_default().get("volume.kubernetes.io/selected-node").cloned();
    assert_eq!(selected.as_deref(), Some(node.as_str()), "the scheduler chose the node");
    let pv_name = claim.spec.and_then(|s| s.volume_name).expect("volumeName");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await.expect("pv");
    let terms = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    assert!(
        terms.iter().flat_map(|t| t.match_expressions.iter().flatten()).any(|e| e.key == TOPOLOGY_KEY),
        "the PV is constrained to the driver's topology: {terms:?}"
    );
    assert_eq!(w.calls("Controller/CreateVolume"), 1);
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).expect("handle");
    step(&format!("scheduled on {node}; provisioned {pv_name} ({handle}) on its topology"));

    // 3. The attach-detach controller creates the VolumeAttachment, the
    //    attacher attaches, the kubelet stages and publishes: the pod runs.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let attached = wait_until("an attached VolumeAttachment of the PV", T, async || {
        let list = vas.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let va = list.into_iter().find(|va| {
            va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()) && va.spec.node_name == node
        });
        (va.as_ref().and_then(|va| va.status.as_ref()).is_some_and(|s| s.attached), va)
    })
    .await;
    let va_name = attached.and_then(|va| va.metadata.name).expect("name");
    assert_eq!(w.calls("Controller/ControllerPublishVolume"), 1);
    step(&format!("attached by csi-sidecar: {va_name}"));
    wait_for(&pods, "app", T, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).await;
    w.wait_calls("Node/NodeStageVolume", 1).await;
    w.wait_calls("Node/NodePublishVolume", 1).await;
    step("staged and published by the kubelet: the pod is Running");

    // 4. Expansion while in use: the resizer expands the volume, the kubelet
    //    expands it on the node and records the new capacity.
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.expect("expand");
    wait_for(&pvcs, "data", T, |c| {
        c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.as_str())
            == Some("2Gi")
    })
    .await;
    assert_eq!(w.calls("Controller/ControllerExpandVolume"), 1);
    assert!(w.calls("Node/NodeExpandVolume") >= 1, "the kubelet expanded it on the node");
    step("expanded to 2Gi: ControllerExpandVolume by csi-sidecar, NodeExpandVolume by the kubelet");

    // 5. Deleting the pod unpublishes, unstages and detaches.
    pods.delete("app", &DeleteParams::default()).await.expect("delete pod");
    wait_deleted(&pods, "app", T).await;
    w.wait_calls("Node/NodeUnpublishVolume", 1).await;
    w.wait_calls("Node/NodeUnstageVolume", 1).await;
    wait_deleted(&vas, &va_name, T).await;
    w.wait_calls("Controller/ControllerUnpublishVolume", 1).await;
    step("pod deleted: unpublished, unstaged, detached");

    // 6. Deleting the claim deletes the volume.
    pvcs.delete("data", &DeleteParams::default()).await.expect("delete claim");
    wait_deleted(&pvs, &pv_name, T).await;
    w.wait_calls("Controller/DeleteVolume", 1).await;
    step("claim deleted: the PV and the backend volume are gone");

    // Exactly once each, now that everything had its chance to repeat.
    for (method, n) in [
        ("Controller/CreateVolume", 1),
        ("Controller/ControllerPublishVolume", 1),
        ("Controller/ControllerUnpublishVolume", 1),
        ("Controller/ControllerExpandVolume", 1),
        ("Controller/DeleteVolume", 1),
        ("Node/NodeStageVolume", 1),
        ("Node/NodeUnstageVolume", 1),
    ] {
        assert_eq!(w.calls(method), n, "{method}: {}", w.driver.logs());
    }
    let mut sidecar = w.node_sidecar;
    sidecar.terminate().await;
    if let Some(mut c) = w.controller.take() {
        c.terminate().await;
    }
    Api::<StorageClass>::all(client.clone()).delete(&sc, &DeleteParams::default()).await.expect("delete class");
    ns.delete().await;
}
