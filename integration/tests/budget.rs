//! The request budget, counted by the apiserver: a provisioner at the
//! default `--kube-api-qps=5 --kube-api-burst=10` provisions claims (a PV
//! and two events each) and never sends more than the bucket allows in any
//! window, while every event is still written. The sidecar runs as its own
//! user, whose requests a FlowSchema of their own counts
//! (`apiserver_flowcontrol_dispatched_requests_total`).

use std::time::{Duration, Instant};

use csi_sidecar_integration::{
    bench::{SIDECAR_USER, check_accounting, setup_identity, snapshot},
    cluster::{ControlPlane, Identity},
    component_bin,
    kube_support::{TestNamespace, pvc, storage_class, unique_name},
    process::Proc,
};
use k8s_openapi::api::{
    core::v1::{Event, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};

const QPS: f64 = 5.0;
const BURST: f64 = 10.0;
const CLAIMS: usize = 30;
/// How often the counter is read.
const SAMPLE: Duration = Duration::from_millis(200);

/// The most requests a bucket of `QPS`/`BURST` lets through in `secs`, plus
/// what two readings of the counter, each up to one sample late, can add.
fn allowed(secs: f64) -> f64 {
    BURST + QPS * (secs + 2.0 * SAMPLE.as_secs_f64())
}

/// The largest excess over [`allowed`] among all windows between two readings
/// (negative: every window within the budget), and the window's rate.
fn worst_window(samples: &[(f64, f64)]) -> (f64, f64) {
    let mut worst = (f64::NEG_INFINITY, 0.0);
    for (i, (t0, n0)) in samples.iter().enumerate() {
        for (t1, n1) in &samples[i + 1..] {
            let excess = (n1 - n0) - allowed(t1 - t0);
            if excess > worst.0 {
                worst = (excess, (n1 - n0) / (t1 - t0).max(f64::EPSILON));
            }
        }
    }
    worst
}

#[test]
fn the_window_check_catches_a_burst_above_the_bucket() {
    // 10 at once is the burst; 20 in one second is not allowed.
    assert!(worst_window(&[(0.0, 0.0), (0.1, 10.0), (1.1, 15.0)]).0 <= 0.0);
    assert!(worst_window(&[(0.0, 0.0), (1.0, 20.0)]).0 > 0.0);
    assert!(worst_window(&[(0.0, 0.0), (10.0, 50.0), (20.0, 120.0)]).0 > 0.0, "a later window too");
}

#[tokio::test]
async fn the_total_rate_never_exceeds_the_budget_and_every_event_is_written() {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    setup_identity(&admin).await.expect("the sidecar's user and FlowSchema");
    let identity = Identity::user(SIDECAR_USER, &[]);
    check_accounting(&admin, &cp.client_as(&identity).await).await.expect("APF accounting");

    let dir = tempfile::tempdir().expect("tempdir");
    let driver_name = format!("{}.csi.example.com", unique_name("budget"));
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), format!("--name={driver_name}")],
        dir.path(),
    );
    let class = unique_name("budget");
    Api::<StorageClass>::all(admin.clone())
        .create(&PostParams::default(), &storage_class(&class, &driver_name))
        .await
        .expect("StorageClass");
    let ns = TestNamespace::new(&admin, "budget").await;

    let base = snapshot(&admin, None).await.expect("metrics").sidecar_dispatched;
    let start = Instant::now();
    let sidecar = Proc::spawn(
        "sidecar",
        &csi_sidecar_integration::sidecar_bin(),
        &[
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", cp.mint(&identity).display()),
            "provisioner".into(),
        ],
        dir.path(),
    );
    let claims: Api<PersistentVolumeClaim> = ns.api();
    for i in 0..CLAIMS {
        claims.create(&PostParams::default(), &pvc(&format!("c{i}"), Some(&class), "1Mi")).await.expect("PVC");
    }

    // Read the counter until every claim has its PV and both of its events.
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let events: Api<Event> = ns.api();
    let mut samples = vec![(0.0, 0.0)];
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut pvs_done, mut events_done) = (0, 0);
    while Instant::now() < deadline {
        tokio::time::sleep(SAMPLE).await;
        let n = snapshot(&admin, None).await.expect("metrics").sidecar_dispatched - base;
        samples.push((start.elapsed().as_secs_f64(), n));
        pvs_done = pvs
            .list(&ListParams::default())
            .await
            .expect("PVs")
            .items
            .iter()
            .filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class.as_str()))
            .count();
        events_done = events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .iter()
            .filter(|e| matches!(e.reason.as_deref(), Some("Provisioning" | "ProvisioningSucceeded")))
            .map(|e| e.count.unwrap_or(1).max(1) as usize)
            .sum();
        if pvs_done == CLAIMS && events_done >= 2 * CLAIMS {
            break;
        }
    }
    assert_eq!(pvs_done, CLAIMS, "every claim has its PV; sidecar log:\n{}", sidecar.logs());
    assert_eq!(events_done, 2 * CLAIMS, "every event written (none dropped); sidecar log:\n{}", sidecar.logs());

    let total = samples.last().map_or(0.0, |s| s.1);
    assert!(total >= 3.0 * CLAIMS as f64, "a PV and two events per claim were counted: {total}");
    let (excess, rate) = worst_window(&samples);
    assert!(
        excess <= 0.0,
        "a window exceeded the budget of {QPS}/s, burst {BURST}, by {excess:.1} requests ({rate:.1}/s): {samples:?}"
    );
    // The run was bound by the budget: on average at least 70 % of it.
    let (t_end, _) = samples.last().copied().unwrap_or_default();
    assert!(total >= 0.7 * QPS * t_end, "{total} requests in {t_end:.1} s: the budget was not the limit");
}
