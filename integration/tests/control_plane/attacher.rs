//! attacher against the real attach-detach controller (kube-controller-manager)
//! and the real CSI driver, in ONE csi-sidecar process with the provisioner.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{
        TestNamespace, create, csi_node, node, pod, pvc, server_keeps_error_code, storage_class, unique_name,
        wait_deleted, wait_for,
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

struct Setup {
    _dir: tempfile::TempDir,
    driver_name: String,
    node: String,
    driver: Proc,
    sidecar: Proc,
    ns: TestNamespace,
    sc: String,
}

impl Setup {
    /// `driver_args`: extra csi-mock-driver flags (e.g. `--disable-attach`).
    async fn start(prefix: &str, driver_args: &[&str], csinode_id: Option<&str>) -> Setup {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let ns = TestNamespace::new(&client, prefix).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("att"));
        let node_name = ns.scoped("node");
        let csi: PathBuf = dir.path().join("csi.sock");
        let mut args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={node_name}"),
        ];
        args.extend(driver_args.iter().map(|s| s.to_string()));
        let driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
        create(&Api::<Node>::all(client.clone()), &node(&node_name, &[])).await;
        if let Some(id) = csinode_id {
            create(&Api::<CSINode>::all(client.clone()), &csi_node(&node_name, &driver_name, id, &[])).await;
        }
        let sc = ns.scoped("sc");
        create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc, &driver_name)).await;
        let sidecar_args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "provisioner".to_string(),
            "attacher".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "--reconcile-sync=2s".to_string(),
            "-v=5".to_string(),
        ];
        let sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &sidecar_args, dir.path());
        Setup { _dir: dir, driver_name, node: node_name, driver, sidecar, ns, sc }
    }

    async fn bound_claim(&self, name: &str) -> String {
        create(&self.ns.api(), &pvc(name, Some(&self.sc), "1Mi")).await;
        let pvcs: Api<PersistentVolumeClaim> = self.ns.api();
        let c = wait_for(&pvcs, name, T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
        c.spec.and_then(|s| s.volume_name).expect("volumeName")
    }

    async fn va_for(&self, pv: &str) -> VolumeAttachment {
        let vas: Api<VolumeAttachment> = Api::all(self.ns.client().clone());
        wait_until(&format!("a VolumeAttachment for {pv}"), T, async || {
            let hit = vas
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv));
            (hit.is_some(), hit)
        })
        .await
        .expect("VolumeAttachment")
    }

    /// A bound claim "data" used by a Pod "app" on the node: the
    /// attach-detach controller's VolumeAttachment for it. Returns the PV's
    /// and the VolumeAttachment's names.
    async fn pod_attachment(&self) -> (String, String) {
        let pv = self.bound_claim("data").await;
        create(&self.ns.api(), &pod("app", &self.node, "data")).await;
        let va = self.va_for(&pv).await;
        (pv, va.metadata.name.expect("name"))
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.ns.client().clone())
    }

    async fn force_delete_pod(&self, name: &str) {
        let pods: Api<Pod> = self.ns.api();
        pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .expect("delete pod");
    }
}

fn sanitized(d: &str) -> String {
    d.replace('.', "-")
}

#[tokio::test]
async fn attach_and_detach_through_the_attach_detach_controller() {
    let s = Setup::start("attach", &[], None).await;
    let node_name = s.node.clone();
    create(&Api::<CSINode>::all(s.ns.client().clone()), &csi_node(&node_name, &s.driver_name, &node_name, &[])).await;
    let (pv, name) = s.pod_attachment().await;
    let vas = s.vas();
    let va = wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|st| st.attached)).await;
    let finalizer = format!("external-attacher/{}", sanitized(&s.driver_name));
    assert!(va.metadata.finalizers.iter().flatten().any(|f| *f == finalizer), "{:?}", va.metadata.finalizers);
    assert_eq!(
        va.metadata.annotations.as_ref().and_then(|a| a.get("csi.alpha.kubernetes.io/node-id")),
        Some(&node_name)
    );
    assert!(va.status.as_ref().and_then(|st| st.attach_error.as_ref()).is_none());
    let pvs: Api<PersistentVolume> = Api::all(s.ns.client().clone());
    let pv_obj = pvs.get(&pv).await.expect("pv");
    // Appended after the provisioner's and the protection controller's, as
    // upstream's attacher does.
    assert_eq!(
        pv_obj.metadata.finalizers.unwrap_or_default(),
        ["external-provisioner.volume.kubernetes.io/finalizer", "kubernetes.io/pv-protection", finalizer.as_str()],
        "the PV's finalizers"
    );
    assert!(s.driver.logs().contains("ControllerPublishVolume -> OK"), "{}", s.driver.logs());

    // Pod gone → the attach-detach controller deletes the VolumeAttachment →
    // detached, finalizer released, object gone.
    s.force_delete_pod("app").await;
    wait_deleted(&vas, &name, T).await;
    assert!(s.driver.logs().contains("ControllerUnpublishVolume -> OK"), "{}", s.driver.logs());

    // PVC deleted → PV deleted by the provisioner; the attacher's PV finalizer
    // is released because no VolumeAttachment references it.
    Api::<PersistentVolumeClaim>::namespaced(s.ns.client().clone(), s.ns.name())
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete pvc");
    wait_deleted(&pvs, &pv, T).await;
    assert!(!s.sidecar.logs().contains("panicked"));
}

#[tokio::test]
async fn publish_failure_is_recorded_with_its_code_and_retried() {
    // The CSINode names a node ID the driver does not know: publish fails.
    let s = Setup::start("attfail", &[], Some("no-such-node")).await;
    let (_, name) = s.pod_attachment().await;
    let vas = s.vas();
    let failed =
        wait_for(&vas, &name, T, |v| v.status.as_ref().and_then(|st| st.attach_error.as_ref()).is_some()).await;
    let err = failed.status.and_then(|st| st.attach_error).expect("attachError");
    assert!(err.message.as_deref().unwrap_or("").starts_with("rpc error: code = NotFound"), "{err:?}");
    // `errorCode` is kept only where the apiserver serves the field (1.35+;
    // 1.34 drops it: gated by MutableCSINodeAllocatableCount, alpha there).
    // The attacher writes it either way, as upstream does.
    if server_keeps_error_code(&vas, &s.driver_name).await {
        assert_eq!(err.error_code, Some(5), "gRPC NotFound");
    } else {
        assert_eq!(err.error_code, None, "a server that drops errorCode kept it");
    }
    // Fix the CSINode (its drivers are immutable: recreate it): the retry,
    // with backoff, attaches.
    let csinodes: Api<CSINode> = Api::all(s.ns.client().clone());
    csinodes.delete(&s.node, &DeleteParams::default()).await.expect("delete csinode");
    wait_deleted(&csinodes, &s.node, T).await;
    create(&csinodes, &csi_node(&s.node, &s.driver_name, &s.node, &[])).await;
    let ok = wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|st| st.attached)).await;
    assert!(ok.status.and_then(|st| st.attach_error).is_none(), "attachError cleared");
}

#[tokio::test]
async fn without_publish_capability_the_trivial_handler_marks_attached() {
    let s = Setup::start("trivial", &["--disable-attach"], None).await;
    let (_, name) = s.pod_attachment().await;
    let vas = s.vas();
    let va = wait_for(&vas, &name, T, |v| v.status.as_ref().is_some_and(|st| st.attached)).await;
    assert!(va.metadata.finalizers.unwrap_or_default().is_empty(), "the trivial handler adds no finalizer");
    assert!(!s.driver.logs().contains("ControllerPublishVolume"), "no publish call");
}
