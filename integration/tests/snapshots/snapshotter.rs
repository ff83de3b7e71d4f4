//! snapshotter against the real kube-apiserver with the snapshot CRDs, the
//! real snapshot-controller (which creates the contents and copies their
//! status to the VolumeSnapshots) and the real CSI mock driver, in one
//! csi-sidecar process with the provisioner (which provisions the claims).

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{TestNamespace, create, pvc, storage_class, unique_name, wait_deleted, wait_for},
    process::Proc,
    sidecar_bin,
    snapshots::{SnapApis, being_created, error_message, obj, ready},
    wait_until,
};
use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};

const T: Duration = Duration::from_secs(60);

struct Setup {
    driver_name: String,
    /// `--http-endpoint` of the csi-sidecar process.
    http: String,
    driver: Proc,
    sidecar: Proc,
    ns: TestNamespace,
    sc: String,
    snaps: SnapApis,
    /// Last: the processes (and their logs, printed on failure) go first.
    _dir: tempfile::TempDir,
}

impl Setup {
    /// The mock driver, and the provisioner and the snapshotter (with
    /// `snapshotter_args`) in one csi-sidecar process.
    async fn start(prefix: &str, snapshotter_args: &[&str]) -> Setup {
        let cp = ControlPlane::with_snapshots();
        let client = cp.client().await;
        let ns = TestNamespace::new(&client, prefix).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("snap"));
        let csi: PathBuf = dir.path().join("csi.sock");
        let args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={}", ns.scoped("node")),
            // Requests in the log: the extra metadata test reads them.
            "--verbose".to_string(),
        ];
        let driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
        let sc = ns.scoped("sc");
        create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc, &driver_name)).await;
        let http = format!("127.0.0.1:{}", csi_sidecar_integration::free_port());
        let mut sidecar_args = vec![
            format!("--http-endpoint={http}"),
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "-v=5".to_string(),
            "provisioner".to_string(),
            "snapshotter".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
        ];
        sidecar_args.extend(snapshotter_args.iter().map(|s| s.to_string()));
        let sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &sidecar_args, dir.path());
        let snaps = SnapApis::new(&client, ns.name());
        Setup { _dir: dir, driver_name, http, driver, sidecar, ns, sc, snaps }
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }

    async fn bound_claim(&self, name: &str) {
        create(&self.pvcs(), &pvc(name, Some(&self.sc), "1Mi")).await;
        wait_for(&self.pvcs(), name, T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    }

    /// Calls of gRPC `method` (e.g. `CreateSnapshot`) the mock driver logged.
    fn calls(&self, method: &str) -> usize {
        let m = format!("/csi.v1.Controller/{method}");
        self.driver.logs().lines().filter(|l| l.contains(&m)).count()
    }
}

#[tokio::test]
async fn a_snapshot_of_a_bound_claim_becomes_ready_and_delete_removes_it_from_the_driver() {
    let s = Setup::start("snap-e2e", &[]).await;
    s.bound_claim("data").await;
    let class = s.ns.scoped("vsc");
    s.snaps.class(&class, &s.driver_name, "Delete", serde_json::Value::Null).await;
    let content = s.snaps.snapshot_of("snap", &class, "data").await;

    // Ready (the status) comes one write before the annotation's removal.
    let c = wait_for(&s.snaps.contents, &content, T, |c| ready(c) && !being_created(c)).await;
    let handle = c.data["status"]["snapshotHandle"].as_str().expect("snapshotHandle").to_string();
    assert!(!handle.is_empty());
    // The mock reports no size (size_bytes 0): no restoreSize, as upstream
    // (the fault driver's 1 MiB is checked in snapshotter_faults.rs). The
    // creation time is in nanoseconds.
    assert!(c.data["status"]["restoreSize"].is_null(), "{c:?}");
    let created = c.data["status"]["creationTime"].as_i64().expect("creationTime");
    assert!(created > 1_600_000_000_000_000_000, "nanoseconds since the epoch: {created}");
    let snap = s.snaps.wait_snapshot_ready("snap", T).await;
    assert_eq!(snap.data["status"]["boundVolumeSnapshotContentName"], content.as_str());
    assert_eq!(s.calls("CreateSnapshot"), 1, "one call for a snapshot the driver made ready at once");
    assert!(s.sidecar.logs().contains("Caches synced; snapshotting"), "{}", s.sidecar.logs());
    // Upstream's metric names: the content queue, the CSI call.
    let m = csi_sidecar_integration::http::get(&s.http, "/metrics").await.expect("/metrics").body;
    assert!(
        m.lines().any(|l| l.starts_with("workqueue_adds_total") && l.contains("name=\"csi-snapshotter-content\"")),
        "{m}"
    );
    assert!(
        m.lines().any(|l| l.starts_with("csi_sidecar_operations_seconds_count")
            && l.contains("method_name=\"/csi.v1.Controller/CreateSnapshot\"")
            && l.contains("grpc_status_code=\"OK\"")),
        "{m}"
    );
    // csi-sidecar's own: the driver connection, and each module's budget
    // (the default --kube-api-qps and --kube-api-burst).
    assert!(m.lines().any(|l| l == "csi_sidecar_driver_connected 1"), "{m}");
    for module in ["provisioner", "snapshotter"] {
        for (family, value) in [("qps", 5), ("burst", 10)] {
            let line = format!("csi_sidecar_api_budget_{family}{{module=\"{module}\"}} {value}");
            assert!(m.lines().any(|l| l == line), "{line} missing:\n{m}");
        }
    }
    assert!(
        m.lines()
            .any(|l| l.starts_with("csi_sidecar_api_budget_requests_total{module=\"provisioner\"} ")
                && !l.ends_with(" 0")),
        "{m}"
    );

    s.snaps.delete_snapshot("snap").await;
    wait_deleted(&s.snaps.contents, &content, T).await;
    wait_deleted(&s.snaps.snapshots, "snap", T).await;
    assert_eq!(s.calls("DeleteSnapshot"), 1, "the backend snapshot is deleted once");
    s.snaps.delete_class(&class).await;
}

#[tokio::test]
async fn retain_keeps_the_content_and_the_backend_snapshot() {
    let s = Setup::start("snap-retain", &[]).await;
    s.bound_claim("data").await;
    let class = s.ns.scoped("vsc");
    s.snaps.class(&class, &s.driver_name, "Retain", serde_json::Value::Null).await;
    let content = s.snaps.snapshot_of("snap", &class, "data").await;
    s.snaps.wait_snapshot_ready("snap", T).await;
    s.snaps.delete_snapshot("snap").await;
    wait_deleted(&s.snaps.snapshots, "snap", T).await;
    let c = s.snaps.contents.get(&content).await.expect("the content stays");
    assert!(ready(&c) && c.metadata.deletion_timestamp.is_none(), "{c:?}");
    // Deleting the retained content itself: the sidecar releases it
    // without touching the backend snapshot.
    s.snaps.contents.delete(&content, &DeleteParams::default()).await.expect("delete content");
    wait_deleted(&s.snaps.contents, &content, T).await;
    assert_eq!(s.calls("DeleteSnapshot"), 0, "Retain never deletes the backend snapshot");
    s.snaps.delete_class(&class).await;
}

#[tokio::test]
async fn a_pre_provisioned_content_becomes_ready_through_list_snapshots() {
    let s = Setup::start("snap-static", &[]).await;
    s.bound_claim("data").await;
    let class = s.ns.scoped("vsc");
    s.snaps.class(&class, &s.driver_name, "Retain", serde_json::Value::Null).await;
    let dynamic = s.snaps.snapshot_of("dynamic", &class, "data").await;
    let c = s.snaps.wait_content_ready(&dynamic, T).await;
    let handle = c.data["status"]["snapshotHandle"].as_str().expect("handle").to_string();
    let lists_before = s.calls("ListSnapshots");

    let static_content = s.ns.scoped("static");
    let v = serde_json::json!({"metadata": {"name": static_content}, "spec": {
        "deletionPolicy": "Retain", "driver": s.driver_name, "source": {"snapshotHandle": handle},
        "volumeSnapshotRef": {"name": "static", "namespace": s.ns.name()}}});
    s.snaps.contents.create(&PostParams::default(), &obj("VolumeSnapshotContent", v)).await.expect("content");
    let v = serde_json::json!({"metadata": {"name": "static"},
        "spec": {"source": {"volumeSnapshotContentName": static_content}}});
    s.snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await.expect("snapshot");

    let c = s.snaps.wait_content_ready(&static_content, T).await;
    assert_eq!(c.data["status"]["snapshotHandle"], handle.as_str());
    let snap = s.snaps.wait_snapshot_ready("static", T).await;
    assert_eq!(snap.data["status"]["boundVolumeSnapshotContentName"], static_content.as_str());
    assert!(s.calls("ListSnapshots") > lists_before, "the static content was checked with ListSnapshots");
    assert_eq!(s.calls("CreateSnapshot"), 1, "no CreateSnapshot for a pre-provisioned content");

    for name in ["static", "dynamic"] {
        s.snaps.delete_snapshot(name).await;
        wait_deleted(&s.snaps.snapshots, name, T).await;
    }
    for name in [&static_content, &dynamic] {
        s.snaps.contents.delete(name, &DeleteParams::default()).await.expect("delete content");
        wait_deleted(&s.snaps.contents, name, T).await;
    }
    assert_eq!(s.calls("DeleteSnapshot"), 0, "both retained");
    s.snaps.delete_class(&class).await;
}

#[tokio::test]
async fn an_unknown_reserved_class_parameter_is_refused_with_upstreams_error() {
    let s = Setup::start("snap-reserved", &[]).await;
    s.bound_claim("data").await;
    let class = s.ns.scoped("vsc");
    let params = serde_json::json!({"csi.storage.k8s.io/fstype": "ext4", "type": "fast"});
    s.snaps.class(&class, &s.driver_name, "Delete", params).await;
    let content = s.snaps.snapshot_of("snap", &class, "data").await;
    let want = "failed to remove CSI Parameters of prefixed keys: found unknown parameter key \
                \"csi.storage.k8s.io/fstype\" with reserved namespace csi.storage.k8s.io/";
    let c = wait_for(&s.snaps.contents, &content, T, |c| error_message(c).is_some()).await;
    assert_eq!(error_message(&c).as_deref(), Some(format!("Failed to create snapshot: {want}").as_str()));
    assert_eq!(c.data["status"]["readyToUse"], false);
    assert!(!being_created(&c), "nothing was sent to the driver, so nothing is being created: {c:?}");
    let events = s.snaps.wait_content_event(&content, "SnapshotCreationFailed", T).await;
    assert_eq!(events[0].0, format!("csi-snapshotter {}", s.driver_name));
    assert_eq!(events[0].1, format!("Failed to create snapshot: {want}"));
    // Retried: the second attempt says so under the later reason.
    let events = s.snaps.wait_content_event(&content, "SnapshotContentCheckandUpdateFailed", T).await;
    assert_eq!(events[0].1, format!("Failed to check and update snapshot content: {want}"));
    // The snapshot-controller copies the error to the VolumeSnapshot.
    wait_for(&s.snaps.snapshots, "snap", T, |v| error_message(v).is_some_and(|m| m.contains(want))).await;
    assert_eq!(s.calls("CreateSnapshot"), 0);

    // Deleting it works although it was never created.
    s.snaps.delete_snapshot("snap").await;
    wait_deleted(&s.snaps.contents, &content, T).await;
    assert_eq!(s.calls("DeleteSnapshot"), 0, "no backend snapshot to delete");
    s.snaps.delete_class(&class).await;
}

#[tokio::test]
async fn extra_create_metadata_and_the_name_prefix_reach_the_driver() {
    let s = Setup::start(
        "snap-meta",
        &["--extra-create-metadata", "--snapshot-name-prefix=snp", "--snapshot-name-uuid-length=8"],
    )
    .await;
    s.bound_claim("data").await;
    let class = s.ns.scoped("vsc");
    s.snaps.class(&class, &s.driver_name, "Delete", serde_json::json!({"type": "fast"})).await;
    let content = s.snaps.snapshot_of("snap", &class, "data").await;
    s.snaps.wait_content_ready(&content, T).await;
    let uid = content.trim_start_matches("snapcontent-").replace('-', "");
    let want_name = format!("snp-{}", &uid[..8]);
    let logs = wait_until("the CreateSnapshot request in the driver log", T, async || {
        let l = s.driver.logs();
        (l.contains(&want_name), l)
    })
    .await;
    for want in [
        "csi.storage.k8s.io/volumesnapshot/name",
        "csi.storage.k8s.io/volumesnapshot/namespace",
        "csi.storage.k8s.io/volumesnapshotcontent/name",
    ] {
        assert!(logs.contains(want), "{want} in the request");
    }
    s.snaps.delete_snapshot("snap").await;
    wait_deleted(&s.snaps.contents, &content, T).await;
    s.snaps.delete_class(&class).await;
}
