//! The README's demo: a real control plane with a real node (kube-scheduler
//! and a kubelet: kubemark's hollow kubelet, with a fake container runtime
//! and mounter), the real CSI driver, and csi-sidecar twice, as a driver
//! deploys it: `provisioner attacher resizer snapshotter` in the controller process,
//! `registrar prober` in the node process. A pod with a new claim is
//! scheduled, provisioned, attached, staged, published and runs; the claim
//! is expanded while in use, snapshotted and restored into a new claim;
//! everything is undone again; `csi-sidecar explain` answers for a bound
//! claim and for one stuck on a missing secret. Everything on 127.0.0.1.
//!
//! `demo` runs the scenario and keeps serving until Ctrl-C; `demo --once`
//! runs it and exits non-zero if a step failed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    cluster::{ControlPlane, try_launcher_bin},
    component_bin, free_port, http,
    kube_support::{NEVER_PULLED_IMAGE, TestNamespace, create, pvc, storage_class},
    process::Proc,
    sidecar_bin,
    snapshots::{SnapApis, ready},
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

/// csi-sidecar demo.
#[derive(FromArgs)]
struct Args {
    /// run the scenario once and exit
    #[argh(switch)]
    once: bool,
    /// install the chart with helm on a real node (containerd and the kubelet; needs root) instead
    #[argh(switch)]
    real_node: bool,
}

#[path = "demo/explain.rs"]
mod explain;
#[path = "demo/real_node.rs"]
mod real_node;

const DRIVER: &str = "demo.csi.example.com";

fn step(s: &str) {
    println!("\n\x1b[1m==> {s}\x1b[0m");
}

async fn until<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Successful calls of `method` the mock driver logged.
fn calls(driver: &Proc, method: &str) -> usize {
    let needle = format!("/csi.v1.{method} -> OK");
    driver.logs().lines().filter(|l| l.contains(&needle)).count()
}

async fn called(driver: &Proc, method: &str) -> anyhow::Result<()> {
    until(&format!("{method} on the driver"), Duration::from_secs(60), async || {
        (calls(driver, method) > 0).then_some(())
    })
    .await?;
    println!("driver: {method} OK");
    Ok(())
}

async fn health(addr: &str, path: &str, want: u16) -> anyhow::Result<()> {
    let r = until(&format!("GET {path} -> {want}"), Duration::from_secs(30), async || {
        http::get(addr, path).await.ok().filter(|r| r.status == want)
    })
    .await?;
    println!("GET {path} -> {} {}", r.status, r.body);
    Ok(())
}

async fn bound(api: &Api<PersistentVolumeClaim>, name: &str) -> anyhow::Result<String> {
    until(&format!("PVC {name} Bound"), Duration::from_secs(60), async || {
        let c = api.get(name).await.ok()?;
        (c.status?.phase.as_deref() == Some("Bound")).then(|| c.spec?.volume_name).flatten()
    })
    .await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = argh::from_env();
    if args.real_node {
        return real_node::run(args.once).await;
    }
    let dir = tempfile::tempdir()?;

    step(
        "starting a real control plane and a real node on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (1.36.3), a kubelet (kubemark's hollow kubelet), the snapshot-controller (v8.7.0) and its CRDs",
    );
    let cp = ControlPlane::spawn_launcher(&try_launcher_bin()?, &["--nodes", "1", "--snapshots"])
        .context("control plane")?;
    let node = cp.info().nodes.first().cloned().context("the launcher's node")?;
    println!(
        "ready in {} ms; node {} Ready; kubeconfig {}",
        cp.info().startup_ms.kcm,
        node.name,
        cp.kubeconfig().display()
    );
    let client = cp.client().await;
    let sock_dir = node.plugins_dir.join(DRIVER);
    std::fs::create_dir_all(&sock_dir)?;
    let csi = sock_dir.join("csi.sock");

    step("starting the node's csi-sidecar (registrar + prober, one process, one port) before the driver");
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
    println!("no driver yet: csi-sidecar waits for it (upstream sidecars exit after 30 s)");
    health(&node_addr, "/healthz/prober", 500).await?;

    step(&format!("starting the real CSI driver (Kubernetes' CSI mock driver, with topology) as {DRIVER}"));
    let driver_args = vec![
        format!("--endpoint=unix://{}", csi.display()),
        format!("--name={DRIVER}"),
        format!("--node-id={}", node.name),
        "--enable-topology".into(),
        "--node-expand-required".into(),
    ];
    let mut driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    health(&node_addr, "/healthz", 200).await?;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let keys = until("the kubelet to register the driver", Duration::from_secs(30), async || {
        let c = csinodes.get_opt(&node.name).await.ok().flatten()?;
        c.spec.drivers.into_iter().find(|d| d.name == DRIVER).map(|d| d.topology_keys.unwrap_or_default())
    })
    .await?;
    println!("kubelet: registered {DRIVER}; CSINode {} lists it with topology keys {keys:?}", node.name);
    health(&node_addr, "/healthz/registrar", 200).await?;

    step(
        "starting the controller's csi-sidecar (provisioner + attacher + resizer + snapshotter, one process, one cache, one port, /debug/objects on)",
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let controller_args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={addr}"),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "--enable-debug-endpoints".into(),
        "provisioner".into(),
        "--feature-gates=Topology=true".into(),
        "attacher".into(),
        "resizer".into(),
        "snapshotter".into(),
    ];
    let mut sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &controller_args, dir.path());
    health(&addr, "/healthz", 200).await?;

    step("a WaitForFirstConsumer StorageClass, a PVC and a pod using it");
    let ns = TestNamespace::new(&client, "demo").await;
    let sc_name = ns.scoped("demo");
    let mut class = storage_class(&sc_name, DRIVER);
    class.allow_volume_expansion = Some(true);
    class.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("data", Some(&sc_name), "1Gi")).await;
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app"},
        "spec": {
            "containers": [{"name": "app", "image": NEVER_PULLED_IMAGE,
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "terminationGracePeriodSeconds": 1
        }
    }))?;
    create(&pods, &pod).await;
    let pv_name = bound(&pvcs, "data").await?;
    let claim = pvcs.get("data").await?;
    let selected = claim.metadata.annotations.unwrap_or_default().get("volume.kubernetes.io/selected-node").cloned();
    println!("kube-scheduler: pod {}/app on {}", ns.name(), selected.unwrap_or_default());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await?;
    let spec = pv.spec.unwrap_or_default();
    let handle = spec.csi.map(|c| c.volume_handle).unwrap_or_default();
    let affinity = spec
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|t| t.match_expressions.unwrap_or_default())
        .map(|e| format!("{} in {:?}", e.key, e.values.unwrap_or_default()))
        .collect::<Vec<_>>();
    println!("csi-sidecar provisioner: {pv_name} (CSI volume {handle}) on the node's topology {affinity:?}; PVC Bound");

    step("attach, stage, publish: the pod runs");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va = until("an attached VolumeAttachment", Duration::from_secs(60), async || {
        let list = vas.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|va| {
            va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
                && va.status.as_ref().is_some_and(|s| s.attached)
        })
    })
    .await?;
    let va_name = va.metadata.name.unwrap_or_default();
    println!("attach-detach controller: VolumeAttachment {va_name}; csi-sidecar attacher: attached");
    called(&driver, "Controller/ControllerPublishVolume").await?;
    until("the pod Running", Duration::from_secs(60), async || {
        let p = pods.get("app").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await?;
    called(&driver, "Node/NodeStageVolume").await?;
    called(&driver, "Node/NodePublishVolume").await?;
    println!("kubelet: pod {}/app Running", ns.name());

    step("expanding the PVC to 2Gi while the pod uses it: ControllerExpandVolume, then the kubelet's NodeExpandVolume");
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    until("the PVC to show 2Gi", Duration::from_secs(60), async || {
        let c = pvcs.get("data").await.ok()?;
        (c.status?.capacity?.get("storage")?.0 == "2Gi").then_some(())
    })
    .await?;
    called(&driver, "Controller/ControllerExpandVolume").await?;
    called(&driver, "Node/NodeExpandVolume").await?;
    let pv = pvs.get(&pv_name).await?;
    let cap = pv.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").map(|q| q.0.clone())).unwrap_or_default();
    println!("PVC {}/data expanded: capacity 2Gi, PV {pv_name} {cap}", ns.name());

    step("a VolumeSnapshot of the claim in use: bound by the real snapshot-controller, CreateSnapshot by csi-sidecar");
    let snaps = SnapApis::new(&client, ns.name());
    let snap_class = ns.scoped("snapclass");
    snaps.class(&snap_class, DRIVER, "Delete", serde_json::Value::Null).await;
    let content = snaps.snapshot_of("backup", &snap_class, "data").await;
    until("the VolumeSnapshot readyToUse", Duration::from_secs(60), async || {
        let s = snaps.snapshots.get("backup").await.ok()?;
        ready(&s).then_some(())
    })
    .await?;
    called(&driver, "Controller/CreateSnapshot").await?;
    let c = snaps.contents.get(&content).await?;
    println!(
        "VolumeSnapshot {}/backup ready: content {content}, snapshot handle {}",
        ns.name(),
        c.data["status"]["snapshotHandle"].as_str().unwrap_or_default()
    );

    step("restoring the snapshot into a new PVC: CreateVolume from the snapshot");
    let mut immediate = storage_class(&ns.scoped("immediate"), DRIVER);
    immediate.volume_binding_mode = Some("Immediate".into());
    create(&Api::<StorageClass>::all(client.clone()), &immediate).await;
    let mut restored = pvc("restored", immediate.metadata.name.as_deref(), "2Gi");
    if let Some(spec) = restored.spec.as_mut() {
        spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: "backup".into(),
        });
    }
    create(&pvcs, &restored).await;
    let restored_pv = bound(&pvcs, "restored").await?;
    println!("PVC {}/restored Bound to {restored_pv}, made from VolumeSnapshot backup", ns.name());

    step("deleting the pod: unpublish, unstage, detach");
    pods.delete("app", &DeleteParams::default()).await?;
    until("the pod gone", Duration::from_secs(60), async || pods.get_opt("app").await.ok()?.is_none().then_some(()))
        .await?;
    called(&driver, "Node/NodeUnpublishVolume").await?;
    called(&driver, "Node/NodeUnstageVolume").await?;
    until("the VolumeAttachment gone", Duration::from_secs(60), async || {
        vas.get_opt(&va_name).await.ok()?.is_none().then_some(())
    })
    .await?;
    called(&driver, "Controller/ControllerUnpublishVolume").await?;
    println!("VolumeAttachment {va_name} deleted");

    step("deleting the snapshot and the PVCs: DeleteSnapshot, DeleteVolume, PVs removed");
    snaps.delete_snapshot("backup").await;
    until("the content to be deleted", Duration::from_secs(60), async || {
        snaps.contents.get_opt(&content).await.ok()?.is_none().then_some(())
    })
    .await?;
    called(&driver, "Controller/DeleteSnapshot").await?;
    println!("VolumeSnapshot backup and content {content} deleted");
    for (claim, pv) in [("data", &pv_name), ("restored", &restored_pv)] {
        pvcs.delete(claim, &DeleteParams::default()).await?;
        until("the PV to be deleted", Duration::from_secs(60), async || {
            pvs.get_opt(pv).await.ok().flatten().is_none().then_some(())
        })
        .await?;
        println!("PV {pv} deleted");
    }
    called(&driver, "Controller/DeleteVolume").await?;

    step("killing the driver: the prober reports it, both csi-sidecars stay up");
    driver.kill();
    health(&node_addr, "/healthz/prober", 500).await?;
    step("restarting the driver: reconnected, healthy, provisioning again");
    driver = Proc::spawn("csi-mock-driver-2", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    health(&node_addr, "/healthz", 200).await?;
    create(&pvcs, &pvc("data-2", immediate.metadata.name.as_deref(), "1Gi")).await;
    let pv2 = bound(&pvcs, "data-2").await?;
    println!("PVC {}/data-2 Bound to {pv2}", ns.name());

    step("metrics (upstream names, labels and buckets)");
    let metrics = http::get(&addr, "/metrics").await.map_err(anyhow::Error::msg)?.body;
    for l in metrics.lines().filter(|l| l.starts_with("csi_sidecar_operations_seconds_count") && l.contains(DRIVER)) {
        println!("{l}");
    }
    // The processes' memory is not printed: the demo runs debug builds, whose
    // footprint says nothing about csi-sidecar's (docs/benchmarks.md has the
    // release figures).

    step(
        "csi-sidecar explain: a claim that is done, and one stuck on a secret its StorageClass names but nobody created",
    );
    let stuck_class = ns.scoped("missing-secret");
    let created = explain::stuck_claim(&client, ns.name(), &stuck_class, DRIVER, "stuck").await;
    let target = explain::Target { kubeconfig: cp.kubeconfig(), endpoint: &addr };
    explain::check(&target, ns.name(), "data-2", "stuck", created).await?;
    for (who, p) in [("controller", &mut sidecar), ("node", &mut node_sidecar)] {
        if p.try_exit().is_some() {
            bail!("the {who} csi-sidecar exited:\n{}", p.logs());
        }
    }
    step("demo OK");
    if !args.once {
        println!(
            "serving on http://{addr}/metrics (controller) and http://{node_addr}/healthz (node); KUBECONFIG={}; Ctrl-C stops everything",
            cp.kubeconfig().display()
        );
        println!(
            "{} explain pvc {}/stuck --endpoint {addr} --kubeconfig {} says why that claim waits",
            sidecar_bin().display(),
            ns.name(),
            cp.kubeconfig().display()
        );
        tokio::signal::ctrl_c().await?;
    }
    println!(
        "csi-sidecar stopped: {} (controller), {} (node)",
        sidecar.terminate().await,
        node_sidecar.terminate().await
    );
    drop(driver);
    Ok(())
}
