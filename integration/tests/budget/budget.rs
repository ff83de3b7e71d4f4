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

/// The most requests a bucket of `qps`/`burst` lets through in `secs`, plus
/// what two readings of the counter, each up to one sample late, can add.
fn allowed((qps, burst): (f64, f64), secs: f64) -> f64 {
    burst + qps * (secs + 2.0 * SAMPLE.as_secs_f64())
}

/// The largest excess over [`allowed`] by `bucket` (qps, burst) among all
/// windows between two readings (negative: every window within the
/// budget), and the window's rate.
fn worst_window(samples: &[(f64, f64)], bucket: (f64, f64)) -> (f64, f64) {
    let mut worst = (f64::NEG_INFINITY, 0.0);
    for (i, (t0, n0)) in samples.iter().enumerate() {
        for (t1, n1) in &samples[i + 1..] {
            let excess = (n1 - n0) - allowed(bucket, t1 - t0);
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
    let bucket = (QPS, BURST);
    assert!(worst_window(&[(0.0, 0.0), (0.1, 10.0), (1.1, 15.0)], bucket).0 <= 0.0);
    assert!(worst_window(&[(0.0, 0.0), (1.0, 20.0)], bucket).0 > 0.0);
    assert!(worst_window(&[(0.0, 0.0), (10.0, 50.0), (20.0, 120.0)], bucket).0 > 0.0, "a later window too");
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
    let (excess, rate) = worst_window(&samples, (QPS, BURST));
    assert!(
        excess <= 0.0,
        "a window exceeded the budget of {QPS}/s, burst {BURST}, by {excess:.1} requests ({rate:.1}/s): {samples:?}"
    );
    // The run was bound by the budget: on average at least 70 % of it.
    let (t_end, _) = samples.last().copied().unwrap_or_default();
    assert!(total >= 0.7 * QPS * t_end, "{total} requests in {t_end:.1} s: the budget was not the limit");
}

/// The combined process: `provisioner attacher resizer` at the default
/// budgets (5/10 each, 15/30 pooled) on a control plane of its own whose
/// apiserver logs the sidecar user's requests with their `User-Agent`, so
/// every module's requests are counted apart by the apiserver (APF counts
/// the total).
///
/// Phase A: 60 claims, the provisioner busy alone: it borrows the idle
/// modules' share (well above its own bucket), never above the pool.
/// Phase B: 60 new claims, 30 attachments and 30 expansions at once: while
/// every module has critical work (each module's events wait behind its own),
/// each gets its own rate (within 10 %); nobody exceeds the pool.
#[tokio::test]
async fn a_combined_process_lends_idle_shares_and_keeps_each_busy_modules_own() {
    use csi_sidecar_integration::{
        audit::{AuditLog, worst_excess},
        cluster::launcher_bin,
        fault_driver::{FaultDriver, Script, Transport},
        kube_support::{create, csi_node, csi_pv, volume_attachment},
        wait_until,
    };
    use futures::StreamExt;
    use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
    use kube::api::{Patch, PatchParams};

    const PHASE_A: usize = 60;
    const PHASE_B: usize = 30;
    /// New claims in phase B: a PV each is the provisioner's only critical
    /// request, so twice as many keep it busy as long as the others.
    const PHASE_B_CLAIMS: usize = 2 * PHASE_B;
    const POOL_QPS: f64 = 3.0 * QPS;
    const POOL_BURST: f64 = 3.0 * BURST;
    const T: Duration = Duration::from_secs(240);

    let dir = tempfile::tempdir().expect("tempdir");
    let audit = AuditLog::for_user(dir.path(), SIDECAR_USER).expect("audit policy");
    let args: Vec<&str> = audit.launcher_args.iter().map(String::as_str).collect();
    let cp = ControlPlane::spawn_launcher(&launcher_bin(), &args).expect("control plane with an audit log");
    let admin = cp.client().await;
    setup_identity(&admin).await.expect("the sidecar's user and FlowSchema");
    let identity = Identity::user(SIDECAR_USER, &[]);
    check_accounting(&admin, &cp.client_as(&identity).await).await.expect("APF accounting");

    let driver_name = format!("{}.fault.example.com", unique_name("pool"));
    let socket = dir.path().join("csi.sock");
    let script =
        Script { name: driver_name.clone(), controller: true, publish: true, expand: true, ..Script::default() };
    let _driver = FaultDriver::start(&socket, Transport::Grpc, script);
    let class = unique_name("pool");
    let mut sc = storage_class(&class, &driver_name);
    sc.allow_volume_expansion = Some(true);
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await.expect("StorageClass");
    let node = unique_name("pool-node");
    create(&Api::<CSINode>::all(admin.clone()), &csi_node(&node, &driver_name, &node, &[])).await;
    let ns = TestNamespace::new(&admin, "pool").await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let events: Api<Event> = ns.api();

    let sidecar = Proc::spawn(
        "sidecar",
        &csi_sidecar_integration::sidecar_bin(),
        &[
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", cp.mint(&identity).display()),
            "provisioner".into(),
            "attacher".into(),
            "resizer".into(),
        ],
        dir.path(),
    );
    let provisioned = async |n: usize| {
        let list = claims.list(&ListParams::default()).await.expect("claims");
        let bound =
            list.items.iter().filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).count();
        let done = events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
            .map(|e| e.count.unwrap_or(1).max(1) as usize)
            .sum::<usize>();
        (bound >= n && done >= n, (bound, done))
    };
    // Caches synced before the clock starts: the provisioner's first claim.
    create(&claims, &pvc("warm-up", Some(&class), "1Mi")).await;
    wait_until("the warm-up claim", T, async || provisioned(1).await).await;

    // Phase A: the provisioner alone.
    let a_start = now_secs();
    let mut apf_a = vec![(0.0, dispatched(&admin).await)];
    for i in 0..PHASE_A {
        create(&claims, &pvc(&format!("a{i}"), Some(&class), "1Mi")).await;
    }
    wait_until("phase A: every claim provisioned", T, async || {
        apf_a.push((now_secs() - a_start, dispatched(&admin).await));
        provisioned(PHASE_A + 1).await
    })
    .await;
    let a_end = now_secs();

    // Phase B: every module at once.
    let b_start = now_secs();
    let mut apf_b = vec![(0.0, dispatched(&admin).await)];
    for i in 0..PHASE_B {
        create(&pvs, &csi_pv(&format!("{}-pv{i}", ns.name()), &driver_name, &format!("h{i}"), "1Mi")).await;
    }
    let grow = Patch::Merge(serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}}));
    // Every module's work exists at once, written concurrently: a busy
    // machine slows the test's own writes, and a module waiting for its
    // input is not using its budget.
    let inputs = (0..PHASE_B).map(|i| {
        let (vas, claims, grow, ns, driver_name, node, class) =
            (&vas, &claims, &grow, &ns, &driver_name, &node, &class);
        async move {
            let pv = format!("{}-pv{i}", ns.name());
            create(vas, &volume_attachment(&pv, driver_name, node, &pv)).await;
            claims.patch(&format!("a{i}"), &PatchParams::default(), grow).await.expect("expand");
            create(claims, &pvc(&format!("b{i}"), Some(class), "1Mi")).await;
            create(claims, &pvc(&format!("b{}", i + PHASE_B), Some(class), "1Mi")).await;
        }
    });
    futures::stream::iter(inputs).buffer_unordered(8).collect::<Vec<()>>().await;
    let inputs_written = now_secs();
    wait_until("phase B: provisioned, attached and expanded", T, async || {
        apf_b.push((now_secs() - b_start, dispatched(&admin).await));
        let (provisioned, counts) = provisioned(PHASE_A + PHASE_B_CLAIMS + 1).await;
        let list = vas.list(&ListParams::default()).await.expect("VAs").items;
        let attached = list.iter().filter(|v| v.status.as_ref().is_some_and(|s| s.attached)).count();
        let list = claims.list(&ListParams::default()).await.expect("claims").items;
        let expanded = list
            .iter()
            .filter(|c| {
                c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.as_str())
                    == Some("2Mi")
            })
            .count();
        (provisioned && attached >= PHASE_B && expanded >= PHASE_B, (counts, attached, expanded))
    })
    .await;

    let requests = audit.requests().expect("the audit log");
    let of = |program: &str, from: f64, to: f64| -> Vec<f64> {
        requests.iter().filter(|r| r.program == program && r.at >= from && r.at <= to).map(|r| r.at).collect()
    };
    // The work a user waits for (a module's events wait behind its own).
    let critical = |program: &str, from: f64, to: f64| -> Vec<f64> {
        let of = requests.iter().filter(|r| r.program == program && !r.event);
        of.filter(|r| r.at >= from && r.at <= to).map(|r| r.at).collect()
    };
    let modules = ["csi-provisioner", "csi-attacher", "csi-resizer"];
    let log = || sidecar.logs();

    // The pool is never exceeded, per module or in total (APF).
    for m in modules {
        let excess = worst_excess(&of(m, a_start, now_secs()), POOL_QPS, POOL_BURST, 0.05);
        assert!(excess <= 0.0, "{m} exceeded the pooled budget by {excess:.1}; log:\n{}", log());
    }
    for (phase, samples) in [("A", &apf_a), ("B", &apf_b)] {
        let (excess, _) = worst_window(samples, (POOL_QPS, POOL_BURST));
        assert!(excess <= 0.0, "phase {phase}: the process exceeded the pool by {excess:.1} (APF): {samples:?}");
    }

    // Phase A: the provisioner alone borrowed far beyond its own bucket.
    let alone = of("csi-provisioner", a_start, a_end);
    assert!(alone.len() >= 3 * PHASE_A, "a PV and two events per claim: {}", alone.len());
    let own_excess = worst_excess(&alone, QPS, BURST, 0.0);
    assert!(own_excess >= 2.0 * BURST, "the provisioner alone borrowed only {own_excess:.1} tokens; log:\n{}", log());
    for m in ["csi-attacher", "csi-resizer"] {
        assert!(of(m, a_start, a_end).len() <= 2, "{m} was idle in phase A");
    }

    // Phase B: while all three have critical work, each gets its own rate.
    let ends: Vec<f64> =
        modules.iter().map(|m| critical(m, b_start, now_secs()).into_iter().fold(b_start, f64::max)).collect();
    // From when every input exists (each module has a backlog) until the
    // first module runs out of work.
    let from = (b_start + 2.0).max(inputs_written);
    let to = ends.iter().copied().fold(f64::INFINITY, f64::min) - 1.0;
    assert!(to - from >= 5.0, "all three were busy for {:.1} s only (ends {ends:?}); log:\n{}", to - from, log());
    eprintln!(
        "phase A: the provisioner alone sent {} requests in {:.1} s, {own_excess:.0} beyond its own bucket",
        alone.len(),
        a_end - a_start
    );
    for m in modules {
        let rate = critical(m, from, to).len() as f64 / (to - from);
        eprintln!("phase B: {m} {rate:.2} critical requests/s over the {:.1} s all three were busy", to - from);
        assert!(
            (rate - QPS).abs() <= 0.1 * QPS,
            "{m}: {rate:.2} requests/s while every module was busy, its own budget is {QPS}/s; log:\n{}",
            log()
        );
    }
}

/// The sidecar user's requests so far, as APF counted them.
async fn dispatched(admin: &kube::Client) -> f64 {
    snapshot(admin, None).await.expect("metrics").sidecar_dispatched
}

fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
