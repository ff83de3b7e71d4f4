//! snapshot-metadata beside the snapshotter in one process adds no watch:
//! the driver's VolumeSnapshotContents and the VolumeSnapshotClasses are
//! the snapshotter's, and the SnapshotMetadataServices one more kind,
//! each watched once (a control plane of its own, so no other test's
//! process opens watches meanwhile).

use std::{collections::BTreeMap, time::Duration};

use csi_sidecar_integration::{
    bench::open_watches,
    cluster::ControlPlane,
    fault_driver::{FaultDriver, Script, Transport},
    process::Proc,
    sidecar_bin,
    snapshot_metadata::TlsFiles,
    wait_until,
};

fn delta(after: &BTreeMap<String, i64>, before: &BTreeMap<String, i64>, r: &str) -> i64 {
    after.get(r).copied().unwrap_or(0) - before.get(r).copied().unwrap_or(0)
}

#[tokio::test]
async fn provisioner_snapshotter_and_snapshot_metadata_watch_each_kind_once() {
    let cp = ControlPlane::with_snapshots();
    let client = cp.client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let script = Script {
        name: "watches.smd.example.com".into(),
        controller: true,
        snapshots: true,
        snapshot_metadata: true,
        ..Script::default()
    };
    let _driver = FaultDriver::start(&csi, Transport::Grpc, script);
    let tls = TlsFiles::write(dir.path()).expect("TLS files");
    let [port] = csi_sidecar_integration::ports::free_ports::<1>().expect("a free port");
    let base = open_watches(&client).await.expect("apiserver /metrics");
    let args = [
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "provisioner".into(),
        "snapshotter".into(),
        "snapshot-metadata".into(),
        format!("--tls-cert={}", tls.cert.display()),
        format!("--tls-key={}", tls.key.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--port={port}"),
    ];
    let mut sidecar = Proc::spawn("combined", &sidecar_bin(), &args, dir.path());
    wait_until("the server serving", Duration::from_secs(60), async || {
        let logs = sidecar.logs();
        (logs.contains("Driver validated; serving SnapshotMetadata"), logs.len())
    })
    .await;
    let kinds = ["volumesnapshotcontents", "volumesnapshotclasses", "snapshotmetadataservices"];
    let now = wait_until("every watch open", Duration::from_secs(30), async || {
        let now = open_watches(&client).await.unwrap_or_default();
        (kinds.iter().all(|r| delta(&now, &base, r) >= 1), now)
    })
    .await;
    for r in kinds {
        assert_eq!(delta(&now, &base, r), 1, "one watch on {r}; {now:?} vs {base:?}");
    }
    sidecar.terminate().await;
}
