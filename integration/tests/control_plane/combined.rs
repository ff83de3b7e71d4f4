//! Controller modules in ONE process: each resource is watched once (read
//! from the apiserver's own metrics), per-module Leases with upstream
//! names let csi-sidecar share a rollout with upstream sidecars, and a lost
//! Lease stops only its module.

mod widgets;

use std::{collections::BTreeMap, path::Path, time::Duration};

use csi_sidecar_integration::{
    bench::open_watches,
    cluster::{ControlPlane, launcher_bin},
    component_bin,
    failover::{fast_leader_election, leads, wait_one_leader},
    fault_driver::{FaultDriver, FaultEnv, HealthForms, Script, Transport},
    free_port,
    http::get,
    kube_support::{TestNamespace, create, csi_node, pvc, storage_class, unique_name, volume_attachment, wait_for},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::PersistentVolumeClaim,
        storage::v1::{CSINode, StorageClass, VolumeAttachment},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};

const RESOURCES: &[&str] =
    &["persistentvolumes", "persistentvolumeclaims", "storageclasses", "volumeattachments", "csinodes"];

/// Open WATCH requests per resource, from the apiserver's own metrics.
async fn watches(client: &Client) -> BTreeMap<String, i64> {
    open_watches(client).await.expect("apiserver /metrics")
}

fn delta(after: &BTreeMap<String, i64>, before: &BTreeMap<String, i64>, r: &str) -> i64 {
    after.get(r).copied().unwrap_or(0) - before.get(r).copied().unwrap_or(0)
}

/// One watch more on each of [`RESOURCES`].
fn each_resource() -> Vec<(&'static str, i64)> {
    RESOURCES.iter().map(|r| (*r, 1)).collect()
}

/// Open watches, once at least `want` more than `base` are open on each of
/// the given resources.
async fn opened(
    client: &Client,
    what: &str,
    base: &BTreeMap<String, i64>,
    want: &[(&str, i64)],
) -> BTreeMap<String, i64> {
    wait_until(what, Duration::from_secs(60), async || {
        let now = watches(client).await;
        (want.iter().all(|(r, n)| delta(&now, base, r) >= *n), now)
    })
    .await
}

fn spawn(dir: &Path, name: &str, cp: &ControlPlane, csi: &Path, modules: &[&str]) -> Proc {
    let mut args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "-v=2".into(),
    ];
    args.extend(modules.iter().map(|s| s.to_string()));
    Proc::spawn(name, &sidecar_bin(), &args, dir)
}

async fn synced(p: &Proc, modules: usize) {
    wait_until("caches synced", Duration::from_secs(60), async || {
        let n = p.logs().matches("Caches synced").count();
        (n >= modules, n)
    })
    .await;
}

#[tokio::test]
async fn one_process_watches_each_resource_once() {
    let cp = ControlPlane::start();
    let client = cp.client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), "--name=watch.csi.example.com".into()],
        dir.path(),
    );
    // The base: the control plane's own watches (kube-controller-manager's
    // informers), once each resource has one.
    let base = opened(&client, "the control plane's watches", &BTreeMap::new(), &each_resource()).await;

    let mut combined = spawn(dir.path(), "combined", &cp, &csi, &["provisioner", "attacher"]);
    synced(&combined, 2).await;
    // Every informer of both modules has synced, so every watch they start
    // with was requested; once each resource shows one more, duplicates
    // would show too.
    let with_combined = opened(&client, "the combined process's watches", &base, &each_resource()).await;
    for r in RESOURCES {
        assert_eq!(
            delta(&with_combined, &base, r),
            1,
            "combined process: one watch on {r}; {with_combined:?} vs {base:?}"
        );
    }
    combined.terminate().await;
    wait_until("the combined process's watches to close", Duration::from_secs(30), async || {
        let now = watches(&client).await;
        (RESOURCES.iter().all(|r| delta(&now, &base, r) == 0), now)
    })
    .await;

    let prov = spawn(dir.path(), "provisioner", &cp, &csi, &["provisioner"]);
    let att = spawn(dir.path(), "attacher", &cp, &csi, &["attacher"]);
    synced(&prov, 1).await;
    synced(&att, 1).await;
    let separate = opened(
        &client,
        "the separate processes' watches",
        &base,
        &[
            ("persistentvolumes", 2),
            ("volumeattachments", 2),
            ("persistentvolumeclaims", 1),
            ("storageclasses", 1),
            ("csinodes", 1),
        ],
    )
    .await;
    let total = |m: &BTreeMap<String, i64>| RESOURCES.iter().map(|r| delta(m, &base, r)).sum::<i64>();
    assert_eq!(delta(&separate, &base, "persistentvolumes"), 2, "two processes watch PVs twice");
    assert_eq!(delta(&separate, &base, "volumeattachments"), 2);
    println!("WATCH connections: combined {} / separate {}", total(&with_combined), total(&separate));
    assert!(total(&with_combined) < total(&separate));
}

/// An upstream-named attacher Lease held by someone else (an upstream
/// external-attacher during a rollout) keeps csi-sidecar's attacher standby
/// while its provisioner leads with its own Lease.
#[tokio::test]
async fn a_foreign_attacher_lease_keeps_only_the_attacher_standby() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "mixed").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let driver_name = format!("{}.csi.example.com", unique_name("mix"));
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), format!("--name={driver_name}")],
        dir.path(),
    );
    let leases: Api<Lease> = ns.api();
    let attacher_lease = format!("external-attacher-leader-{}", driver_name.replace('.', "-"));
    let foreign = |renew: Timestamp| Lease {
        metadata: ObjectMeta { name: Some(attacher_lease.clone()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some("upstream-external-attacher-pod".into()),
            lease_duration_seconds: Some(4),
            acquire_time: Some(MicroTime(renew)),
            renew_time: Some(MicroTime(renew)),
            ..Default::default()
        }),
    };
    create(&leases, &foreign(Timestamp::now())).await;
    let renewer = {
        let (leases, name) = (leases.clone(), attacher_lease.clone());
        tokio::spawn(async move {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let p = serde_json::json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
                let _ = leases.patch(&name, &PatchParams::default(), &Patch::Merge(&p)).await;
            }
        })
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        format!("--http-endpoint={addr}"),
    ];
    args.extend(fast_leader_election(ns.name()));
    args.extend(["provisioner", "attacher"].map(String::from));
    let p = Proc::spawn("csi-sidecar", &sidecar_bin(), &args, dir.path());

    // The provisioner leads with its own Lease (the driver name) and provisions.
    let sc = ns.scoped("sc");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc, &driver_name)).await;
    create(&ns.api(), &pvc("data", Some(&sc), "1Mi")).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let bound = wait_for(&pvcs, "data", Duration::from_secs(60), |c| {
        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    })
    .await;
    let prov_lease = leases.get(&driver_name.replace('.', "-")).await.expect("provisioner Lease with upstream's name");
    assert!(prov_lease.spec.and_then(|s| s.holder_identity).is_some_and(|h| h != "upstream-external-attacher-pod"));

    // The attacher waits: a VolumeAttachment stays unattached while the
    // foreign holder renews.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = ns.scoped("va");
    let pv = bound.spec.and_then(|s| s.volume_name).expect("volumeName");
    let va = volume_attachment(&va_name, &driver_name, "nowhere", &pv);
    create(&vas, &va).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = vas.get(&va_name).await.expect("va");
    assert!(
        still.status.as_ref().and_then(|s| s.attach_error.as_ref()).is_none(),
        "standby attacher must not act: {:?}",
        still.status
    );
    let held = leases.get(&attacher_lease).await.expect("lease");
    assert_eq!(held.spec.and_then(|s| s.holder_identity).as_deref(), Some("upstream-external-attacher-pod"));
    let h = get(&addr, "/healthz/leader-election").await.expect("healthz");
    assert_eq!((h.status, h.body.as_str()), (200, "ok"));

    // The foreign holder stops renewing: csi-sidecar's attacher takes over
    // and acts (this VA names a node without a CSINode: an attach error).
    renewer.await.expect("renewer");
    wait_for(&vas, &va_name, Duration::from_secs(30), |v| {
        v.status.as_ref().and_then(|s| s.attach_error.as_ref()).is_some()
    })
    .await;
    assert!(p.logs().contains(&attacher_lease), "{}", p.logs());
}

/// `--leader-election-shared-lease`: one Lease leads both modules of the
/// process (each also holds its upstream-named Lease, the migration
/// guard); the standby replica runs neither module; when the leader stops,
/// the other replica takes both over.
#[tokio::test]
async fn one_shared_lease_leads_every_module_of_the_process() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "shared").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let driver_name = format!("{}.csi.example.com", unique_name("shl"));
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), format!("--name={driver_name}")],
        dir.path(),
    );
    let replica = |name: &str| {
        let mut args =
            vec![format!("--csi-address={}", csi.display()), format!("--kubeconfig={}", cp.kubeconfig().display())];
        args.extend(fast_leader_election(ns.name()));
        args.extend(["--leader-election-shared-lease=my-driver-sidecars", "provisioner", "attacher"].map(String::from));
        Proc::spawn(name, &sidecar_bin(), &args, dir.path())
    };
    let mut a = replica("replica-a");
    let mut b = replica("replica-b");
    wait_one_leader(&a, &b).await;
    // Still one, a couple of retry periods later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!(leads(&a) && leads(&b)), "exactly one replica leads");

    // The process's Lease, and (the migration guard) each module's own
    // upstream-named one, taken by the leader only: an upstream sidecar of
    // a previous deployment holding one would keep that module standby.
    let leases: Api<Lease> = ns.api();
    let dashed = driver_name.replace('.', "-");
    let mut want = vec!["my-driver-sidecars".to_string(), dashed.clone(), format!("external-attacher-leader-{dashed}")];
    want.sort();
    let held = wait_until("the modules' own Leases", Duration::from_secs(30), async || {
        let mut held: Vec<String> = leases
            .list(&Default::default())
            .await
            .expect("leases")
            .items
            .into_iter()
            .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_some_and(|h| !h.is_empty()))
            .filter_map(|l| l.metadata.name)
            .collect();
        held.sort();
        (held == want, held)
    })
    .await;
    assert_eq!(held, want);

    let sc = ns.scoped("sc");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc, &driver_name)).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let bound_claim = async |name: &str| {
        create(&pvcs, &pvc(name, Some(&sc), "1Mi")).await;
        wait_for(&pvcs, name, Duration::from_secs(60), |c| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await
    };
    let first = bound_claim("first").await;
    // The attacher runs under the same Lease: a VolumeAttachment for a node
    // without a CSINode gets its attach error.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = ns.scoped("va");
    let pv = first.spec.and_then(|s| s.volume_name).expect("volumeName");
    let va = volume_attachment(&va_name, &driver_name, "nowhere", &pv);
    create(&vas, &va).await;
    wait_for(&vas, &va_name, Duration::from_secs(30), |v| {
        v.status.as_ref().and_then(|s| s.attach_error.as_ref()).is_some()
    })
    .await;

    // The leader stops (SIGTERM releases the Lease): the other replica runs both.
    let (leader, standby) = if leads(&a) { (&mut a, &b) } else { (&mut b, &a) };
    assert!(!standby.logs().contains("Caches synced"), "the standby runs no module:\n{}", standby.logs());
    leader.terminate().await;
    wait_until("the standby to lead", Duration::from_secs(30), async || (leads(standby), ())).await;
    bound_claim("second").await;
    let logs = standby.logs();
    assert_eq!(logs.matches("Caches synced").count(), 2, "both modules run in the new leader:\n{logs}");
}

/// With the resizer beside the provisioner and the attacher: still one
/// watch per kind (claims and PVs shared by the three modules), plus the
/// resizer's pods (an offline-only driver) and VolumeAttributesClasses (the
/// driver can modify), once each.
#[tokio::test]
async fn the_resizer_shares_the_watches_of_provisioner_and_attacher() {
    let cp = ControlPlane::start();
    let client = cp.client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[
            format!("--endpoint=unix://{}", csi.display()),
            "--name=watch3.csi.example.com".into(),
            "--disable-online-expansion".into(),
        ],
        dir.path(),
    );
    let base = watches(&client).await;
    let mut combined = spawn(dir.path(), "combined", &cp, &csi, &["provisioner", "attacher", "resizer"]);
    synced(&combined, 3).await;
    let extra = ["pods", "volumeattributesclasses"];
    let now = wait_until("every watch open", Duration::from_secs(30), async || {
        let now = watches(&client).await;
        (RESOURCES.iter().chain(extra.iter()).all(|r| delta(&now, &base, r) >= 1), now)
    })
    .await;
    for r in RESOURCES.iter().chain(extra.iter()) {
        assert_eq!(delta(&now, &base, r), 1, "one watch on {r}; {now:?} vs {base:?}");
    }
    assert!(combined.logs().contains("watch_pods=true"), "{}", combined.logs());
    combined.terminate().await;
}

/// With the snapshotter beside the other controller modules: still one
/// watch per kind, plus one on VolumeSnapshotContents and one on
/// VolumeSnapshotClasses (the provisioner reads the same content view).
#[tokio::test]
async fn provisioner_attacher_resizer_and_snapshotter_watch_each_kind_once() {
    // A control plane of its own, as the other watch-counting tests: the
    // counts are the apiserver's, so another test's sidecar on a shared one
    // (a_panicking_sync_stays_in_its_sync) closing its watches between the
    // base and the check hides this process's.
    let cp = ControlPlane::spawn_launcher(&launcher_bin(), &["--snapshots"]).expect("a control plane with snapshots");
    let client = cp.client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csi = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", csi.display()), "--name=watch4.csi.example.com".into()],
        dir.path(),
    );
    let base = watches(&client).await;
    let mut combined = spawn(dir.path(), "combined", &cp, &csi, &["provisioner", "attacher", "resizer", "snapshotter"]);
    synced(&combined, 4).await;
    // The snapshotter's contents and classes; the provisioner's snapshots
    // (its restore finalizer sweep) and its reads of contents share them.
    // With group snapshots (gate on by default, CRDs installed): one watch
    // on each group kind the snapshotter reads.
    let extra = [
        "volumesnapshotcontents",
        "volumesnapshotclasses",
        "volumesnapshots",
        "volumegroupsnapshotcontents",
        "volumegroupsnapshotclasses",
    ];
    let now = wait_until("every watch open", Duration::from_secs(30), async || {
        let now = watches(&client).await;
        (RESOURCES.iter().chain(extra.iter()).all(|r| delta(&now, &base, r) >= 1), now)
    })
    .await;
    for r in RESOURCES.iter().chain(extra.iter()) {
        assert_eq!(delta(&now, &base, r), 1, "one watch on {r}; {now:?} vs {base:?}");
    }
    combined.terminate().await;
}

/// The attacher's Lease taken by another holder while 50 claims provision
/// in the same process: only the attacher stops (its work drains and it
/// starts again in standby). Every claim gets exactly one CreateVolume, the
/// provisioner's Lease keeps its holder and the process its PID; once the
/// other holder stops renewing, the attacher leads again and attaches the
/// VolumeAttachment queued meanwhile, with one ControllerPublishVolume.
#[tokio::test]
async fn a_lost_attacher_lease_stops_only_the_attacher() {
    const CLAIMS: usize = 50;
    let env = FaultEnv::new("lostl").await;
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, Script { publish: true, ..env.script() });
    let node = format!("{}-node", env.ns.name());
    create(&Api::<CSINode>::all(env.ns.client().clone()), &csi_node(&node, &env.driver_name, "node-id", &[])).await;
    let mut args = fast_leader_election(env.ns.name());
    args.extend(["--kube-api-qps=50", "--kube-api-burst=100", "-v=2", "provisioner", "attacher"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = env.sidecar("csi-sidecar", &sidecar_bin(), &args);
    let pid = p.pid();
    let sc = env.storage_class("sc", |_| {}).await;
    let first_pv = env.bound_claim("first", &sc, Duration::from_secs(60)).await;

    let leases: Api<Lease> = env.ns.api();
    let dashed = env.driver_name.replace('.', "-");
    let (prov_lease, att_lease) = (dashed.clone(), format!("external-attacher-leader-{dashed}"));
    let spec_of = async |name: &str| leases.get(name).await.ok().and_then(|l| l.spec).unwrap_or_default();
    let ours = spec_of(&prov_lease).await;
    let identity = ours.holder_identity.clone().expect("the provisioner leads");
    // Each module campaigns with an identity of its own.
    let attacher = wait_until("the attacher leads", Duration::from_secs(30), async || {
        let holder = spec_of(&att_lease).await.holder_identity;
        (holder.is_some(), holder.unwrap_or_default())
    })
    .await;

    // Another holder takes the attacher's Lease and renews it.
    let renewing = tokio_util::sync::CancellationToken::new();
    let take = |at: Timestamp| {
        serde_json::json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 4,
            "acquireTime": MicroTime(at), "renewTime": MicroTime(at)}})
    };
    leases.patch(&att_lease, &PatchParams::default(), &Patch::Merge(&take(Timestamp::now()))).await.expect("take");
    let renewer = {
        let (leases, name, stop) = (leases.clone(), att_lease.clone(), renewing.clone());
        tokio::spawn(async move {
            while stop.run_until_cancelled(tokio::time::sleep(Duration::from_millis(500))).await.is_some() {
                let p = serde_json::json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
                let _ = leases.patch(&name, &PatchParams::default(), &Patch::Merge(&p)).await;
            }
        })
    };
    wait_until("the attacher to notice", Duration::from_secs(30), async || {
        (p.logs().contains("Module lost its Lease"), ())
    })
    .await;

    // While it is standby: a VolumeAttachment waits, 50 claims provision.
    let vas: Api<VolumeAttachment> = Api::all(env.ns.client().clone());
    let va_name = env.ns.scoped("va");
    create(&vas, &volume_attachment(&va_name, &env.driver_name, &node, &first_pv)).await;
    let names: Vec<String> = (0..CLAIMS).map(|i| format!("c{i:02}")).collect();
    env.create_claims(&names, &sc).await;
    env.wait_bound(&names, Duration::from_secs(120)).await;
    assert_eq!(driver.creates(), CLAIMS as u64 + 1, "exactly one CreateVolume per claim");
    assert!(driver.publish_calls().is_empty(), "the standby attacher published nothing");
    let va = vas.get(&va_name).await.expect("va");
    assert!(!va.status.is_some_and(|s| s.attached), "not attached while another holds the Lease");
    assert_eq!(spec_of(&att_lease).await.holder_identity.as_deref(), Some("intruder"));
    let theirs = spec_of(&prov_lease).await;
    assert_eq!(
        (theirs.holder_identity.as_deref(), theirs.lease_transitions),
        (Some(identity.as_str()), ours.lease_transitions),
        "the provisioner kept its Lease"
    );
    assert!(p.try_exit().is_none(), "the process runs on:\n{}", p.logs());

    // The other holder stops renewing: the attacher leads again and
    // attaches what was queued.
    renewing.cancel();
    renewer.await.expect("renewer");
    wait_for(&vas, &va_name, Duration::from_secs(60), |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    assert_eq!(driver.publish_calls().len(), 1, "one ControllerPublishVolume");
    // Its new instance campaigned as a new candidate of this process.
    let holder = spec_of(&att_lease).await.holder_identity.unwrap_or_default();
    assert!(!holder.is_empty() && holder != "intruder", "{holder} (before: {attacher})");
    assert!(p.logs().contains(&format!("identity={holder}")), "{holder} is ours:\n{}", p.logs());
    assert_eq!(spec_of(&prov_lease).await.lease_transitions, ours.lease_transitions, "no provisioner failover");
    assert!(p.try_exit().is_none(), "the process runs on:\n{}", p.logs());
    assert_eq!(p.pid(), pid);
}

/// The value of the sample `series` (name and labels) in `/metrics` text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A panic in one claim's sync (the debug build's fault point, absent from
/// release builds) in a combined provisioner, attacher, resizer, snapshotter
/// and health-monitor process: that claim is retried with backoff and
/// counted, 50 other claims provision meanwhile, no module restarts and no
/// Lease changes hands.
#[tokio::test]
async fn a_panicking_sync_stays_in_its_sync() {
    const CLAIMS: usize = 50;
    let env = FaultEnv::on(ControlPlane::with_snapshots(), "panic").await;
    let health = HealthForms { legacy_list: true, ..HealthForms::NONE };
    let script = Script { publish: true, snapshots: true, expand: true, health, ..env.script() };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = fast_leader_election(env.ns.name());
    args.push(format!("--http-endpoint={addr}"));
    args.extend(["--kube-api-qps=50", "--kube-api-burst=100", "-v=2"].map(String::from));
    args.extend(["provisioner", "attacher", "resizer", "snapshotter", "health-monitor"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let point = format!("provisioner:{}/boom", env.ns.name());
    let mut p = env.sidecar_env("csi-sidecar", &sidecar_bin(), &args, &[("CSI_SIDECAR_TEST_PANIC", &point)]);
    let leases: Api<Lease> = env.ns.api();
    let holders = async || -> BTreeMap<String, (String, Option<i32>)> {
        let list = leases.list(&Default::default()).await.expect("leases").items;
        let held = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
        list.iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, (held(l)?, l.spec.as_ref()?.lease_transitions))))
            .collect()
    };
    let before = wait_until("every module leads", Duration::from_secs(60), async || {
        let held = holders().await;
        (held.len() == 5, held)
    })
    .await;

    let sc = env.storage_class("sc", |_| {}).await;
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("boom", Some(&sc), "1Mi")).await;
    let names: Vec<String> = (0..CLAIMS).map(|i| format!("c{i:02}")).collect();
    env.create_claims(&names, &sc).await;
    env.wait_bound(&names, Duration::from_secs(120)).await;
    let series = "csi_sidecar_panics_total{module=\"provisioner\"}";
    wait_until("the panicking claim retried", Duration::from_secs(30), async || {
        let m = get(&addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
        (sample(&m, series).is_some_and(|n| n >= 2.0), sample(&m, series))
    })
    .await;
    assert_eq!(driver.creates(), CLAIMS as u64, "the panicking claim never reached the driver");
    let boom = pvcs.get("boom").await.expect("boom");
    assert_eq!(boom.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    let m = get(&addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
    assert!(!m.contains("csi_sidecar_module_restarts_total"), "no module restarted:\n{m}");
    assert_eq!(holders().await, before, "no Lease changed hands");
    assert!(p.try_exit().is_none(), "the process runs on:\n{}", p.logs());
    assert!(p.logs().contains("the test panic point of"), "{}", p.logs());
}
