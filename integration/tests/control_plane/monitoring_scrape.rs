//! The chart's dashboard and alerts use only names csi-sidecar exports:
//! every metric name and every label name of their expressions (matchers
//! and grouping clauses; labels the scrape adds aside, see
//! `promql::SCRAPE_LABELS`) is in the `/metrics` of csi-sidecar after a
//! workflow like the demo's on the real control plane with a kubelet
//! (kubemark's hollow kubelet) and the snapshot-controller: the controller
//! process running provisioner, attacher, resizer, snapshotter,
//! health-monitor and prober with leader election, the node process
//! running registrar and prober, Kubernetes' CSI mock driver; a claim
//! provisioned, attached to a pod, expanded and snapshotted, and a claim
//! the driver refuses (so error and retry series exist).

use std::{collections::BTreeMap, path::Path, time::Duration};

use csi_sidecar_integration::{
    cluster::{ControlPlane, launcher_bin},
    component_bin,
    failover::fast_leader_election,
    free_port, http,
    kube_support::{TestNamespace, create, pod, pvc, storage_class, unique_name, wait_for},
    monitoring::{all_on, expressions, render},
    process::Proc,
    promql::{self, Exported},
    sidecar_bin,
    snapshots::SnapApis,
    wait_until,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{StorageClass, VolumeAttachment},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};

const T: Duration = Duration::from_secs(90);
/// The controller modules that take a Lease.
const LEASES: usize = 5;

async fn scrape(addr: &str) -> String {
    match http::get(addr, "/metrics").await {
        Ok(r) if r.status == 200 => r.body,
        other => panic!("GET http://{addr}/metrics: {other:?}"),
    }
}

/// The value of the first sample of `name` that has all of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))).find_map(|l| {
        let all = labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")));
        all.then(|| l.rsplit(' ').next().and_then(|v| v.parse().ok())).flatten()
    })
}

fn leading(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("leader_election_master_status{") && l.ends_with(" 1")).count()
}

fn union(scrapes: &[Exported]) -> Exported {
    let mut out = Exported::default();
    for e in scrapes {
        for (name, labels) in &e.samples {
            out.samples.entry(name.clone()).or_default().extend(labels.iter().cloned());
        }
        out.types.extend(e.types.clone());
    }
    out
}

fn spawn_controller(dir: &Path, cp: &ControlPlane, csi: &Path, addr: &str, ns: &str) -> Proc {
    let mut args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        format!("--http-endpoint={addr}"),
        "-v=2".into(),
    ];
    args.extend(fast_leader_election(ns));
    for m in [
        "provisioner",
        "--retry-interval-start=200ms",
        "--retry-interval-max=2s",
        "attacher",
        "resizer",
        "snapshotter",
        "health-monitor",
        "--monitor-interval=2s",
        "prober",
    ] {
        args.push(m.into());
    }
    Proc::spawn("csi-sidecar-controller", &sidecar_bin(), &args, dir)
}

#[tokio::test]
async fn every_name_the_dashboard_and_the_alerts_use_is_exported() {
    let cp = ControlPlane::spawn_launcher(&launcher_bin(), &["--nodes", "1", "--snapshots"])
        .expect("a control plane with a node and the snapshot-controller");
    let client = cp.client().await;
    let node = cp.info().nodes.first().cloned().expect("the launcher's node");
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = format!("{}.csi.example.com", unique_name("mon"));
    let sock_dir = node.plugins_dir.join(&driver);
    std::fs::create_dir_all(&sock_dir).expect("driver dir");
    let csi = sock_dir.join("csi.sock");
    let driver_args = vec![
        format!("--endpoint=unix://{}", csi.display()),
        format!("--name={driver}"),
        format!("--node-id={}", node.name),
    ];
    let _driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    let node_addr = format!("127.0.0.1:{}", free_port());
    let node_args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={node_addr}"),
        "registrar".into(),
        format!("--kubelet-registration-path={}", csi.display()),
        format!("--plugin-registration-path={}", node.registration_dir.display()),
        "prober".into(),
    ];
    let mut node_sidecar = Proc::spawn("csi-sidecar-node", &sidecar_bin(), &node_args, dir.path());
    let ns = TestNamespace::new(&client, "monitoring").await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut controller = spawn_controller(dir.path(), &cp, &csi, &addr, ns.name());
    wait_until("every controller module to lead its Lease", T, async || {
        let text = http::get(&addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
        (leading(&text) == LEASES, leading(&text))
    })
    .await;

    // A claim provisioned and attached to a pod on the node, then expanded.
    let mut class = storage_class(&ns.scoped("sc"), &driver);
    class.allow_volume_expansion = Some(true);
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    let sc = class.metadata.name.clone().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("data", Some(&sc), "1Gi")).await;
    let claim =
        wait_for(&pvcs, "data", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let pv_name = claim.spec.and_then(|s| s.volume_name).expect("bound to a PV");
    let pods: Api<Pod> = ns.api();
    create(&pods, &pod("app", &node.name, "data")).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until("the claim's VolumeAttachment attached", T, async || {
        let list = vas.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let attached = list.iter().any(|va| {
            va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
                && va.status.as_ref().is_some_and(|s| s.attached)
        });
        (attached, list.len())
    })
    .await;
    wait_for(&pods, "app", T, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).await;
    let grow = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    pvcs.patch("data", &PatchParams::default(), &Patch::Merge(&grow)).await.expect("expand the claim");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    wait_for(&pvs, &pv_name, T, |pv| {
        pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).is_some_and(|q| q.0 == "2Gi")
    })
    .await;

    // A snapshot of it.
    let snaps = SnapApis::new(&client, ns.name());
    let snap_class = ns.scoped("snapclass");
    snaps.class(&snap_class, &driver, "Delete", serde_json::Value::Null).await;
    snaps.snapshot_of("backup", &snap_class, "data").await;
    snaps.wait_snapshot_ready("backup", T).await;

    // A claim the driver refuses (the mock: 1 TiB and more is OutOfRange),
    // retried with backoff.
    create(&pvcs, &pvc("too-big", Some(&sc), "2Ti")).await;
    let create_volume = [("method_name", "/csi.v1.Controller/CreateVolume"), ("grpc_status_code", "OutOfRange")];
    wait_until("failed and retried CreateVolume calls in the controller's metrics", T, async || {
        let text = scrape(&addr).await;
        let failed = sample(&text, "csi_sidecar_operations_seconds_count", &create_volume).unwrap_or(0.0);
        let retried = sample(&text, "workqueue_retries_total", &[("name", "claims")]).unwrap_or(0.0);
        (failed >= 2.0 && retried >= 2.0, (failed, retried))
    })
    .await;

    // What both processes export now, against what the chart's expressions use.
    let controller_text = scrape(&addr).await;
    let node_text = scrape(&node_addr).await;
    let scrapes: Vec<Exported> = [&controller_text, &node_text]
        .iter()
        .map(|t| Exported::parse(t).unwrap_or_else(|e| panic!("/metrics: {e}")))
        .collect();
    let exported = union(&scrapes);
    let exprs = expressions(&render(&all_on()));
    let mut failures = Vec::new();
    let mut missing_names: BTreeMap<String, usize> = BTreeMap::new();
    let mut used = 0;
    for e in &exprs {
        let names = promql::names(&e.expr).unwrap_or_else(|err| panic!("{}: {err}", e.at));
        used += names.metrics.len();
        for m in exported.missing(&names) {
            *missing_names.entry(m.clone()).or_default() += 1;
            failures.push(format!("{}: {m} missing\n    in: {}", e.at, e.expr));
        }
    }
    println!(
        "{} expressions ({used} metric uses) checked against {} sample names of the controller and {} of the node",
        exprs.len(),
        scrapes[0].samples.len(),
        scrapes[1].samples.len()
    );
    for (name, n) in &missing_names {
        println!("missing: {name} (in {n} expressions)");
    }
    for (who, p) in [("controller", &mut controller), ("node", &mut node_sidecar)] {
        assert!(p.try_exit().is_none(), "the {who} csi-sidecar exited:\n{}", p.logs());
    }
    assert!(
        failures.is_empty(),
        "{} uses of names csi-sidecar does not export:\n{}\n\nthe controller's /metrics:\n{controller_text}",
        failures.len(),
        failures.join("\n")
    );
    controller.terminate().await;
    node_sidecar.terminate().await;
    ns.delete().await;
}
