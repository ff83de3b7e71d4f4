//! The README's demo: a real control plane, the real CSI driver, the
//! kubelet's plugin manager and ONE csi-sidecar process running the
//! provisioner, resizer, registrar and prober modules; everything on 127.0.0.1.
//!
//! `demo` runs the scenario and keeps serving until Ctrl-C; `demo --once`
//! runs it and exits non-zero if a step failed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin, free_port, http,
    kube_support::{TestNamespace, create, pvc, storage_class},
    process::Proc,
    sidecar_bin,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{Api, api::DeleteParams};

/// csi-sidecar demo.
#[derive(FromArgs)]
struct Args {
    /// run the scenario once and exit
    #[argh(switch)]
    once: bool,
}

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
    let dir = tempfile::tempdir()?;
    let csi = dir.path().join("csi.sock");
    let registry = dir.path().join("plugins_registry");
    std::fs::create_dir(&registry)?;

    step("starting a real control plane: etcd, kube-apiserver, kube-controller-manager (1.36.3) on 127.0.0.1");
    let cp = ControlPlane::try_start().context("control plane")?;
    println!("ready in {} ms; kubeconfig {}", cp.info().startup_ms.kcm, cp.kubeconfig().display());
    let client = cp.client().await;

    step(
        "starting the kubelet's plugin manager and csi-sidecar (provisioner + resizer + registrar + prober, one process, one port)",
    );
    let kubelet = Proc::spawn(
        "kubelet-plugin-harness",
        &component_bin("kubelet-plugin-harness"),
        &[format!("--dir={}", registry.display())],
        dir.path(),
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let sidecar_args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={addr}"),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "provisioner".into(),
        "resizer".into(),
        "registrar".into(),
        format!("--kubelet-registration-path=/var/lib/kubelet/plugins/{DRIVER}/csi.sock"),
        format!("--plugin-registration-path={}", registry.display()),
        "prober".into(),
    ];
    let mut sidecar = Proc::spawn("csi-sidecar", &sidecar_bin(), &sidecar_args, dir.path());
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!("no driver yet: csi-sidecar waits for it (upstream sidecars exit after 30 s)");
    health(&addr, "/healthz/prober", 500).await?;

    step(&format!("starting the real CSI driver (Kubernetes' CSI mock driver) as {DRIVER}"));
    let driver_args =
        vec![format!("--endpoint=unix://{}", csi.display()), format!("--name={DRIVER}"), "--node-id=node-1".into()];
    let mut driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    health(&addr, "/healthz", 200).await?;
    let register = until("the kubelet to register the driver", Duration::from_secs(30), async || {
        kubelet.logs().lines().find(|l| l.contains("\"event\":\"register\"") && l.contains(DRIVER)).map(String::from)
    })
    .await?;
    println!("kubelet: {register}");
    health(&addr, "/healthz/registrar", 200).await?;

    step("a StorageClass and a PVC: provisioned by csi-sidecar, bound by the real PV binder");
    let ns = TestNamespace::new(&client, "demo").await;
    let sc_name = ns.scoped("demo");
    let mut class = storage_class(&sc_name, DRIVER);
    class.allow_volume_expansion = Some(true);
    create(&Api::<StorageClass>::all(client.clone()), &class).await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    create(&pvcs, &pvc("data", Some(&sc_name), "1Gi")).await;
    let pv_name = bound(&pvcs, "data").await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await?;
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap_or_default();
    println!("PVC {}/data Bound to {pv_name} (CSI volume {handle})", ns.name());

    step("expanding the PVC to 2Gi: ControllerExpandVolume, PV and PVC capacity");
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    until("the PVC to show 2Gi", Duration::from_secs(60), async || {
        let c = pvcs.get("data").await.ok()?;
        (c.status?.capacity?.get("storage")?.0 == "2Gi").then_some(())
    })
    .await?;
    let pv = pvs.get(&pv_name).await?;
    let cap = pv.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").map(|q| q.0.clone())).unwrap_or_default();
    println!("PVC {}/data expanded: capacity 2Gi, PV {pv_name} {cap}", ns.name());

    step("deleting the PVC: DeleteVolume, PV removed");
    pvcs.delete("data", &DeleteParams::default()).await?;
    until("the PV to be deleted", Duration::from_secs(60), async || {
        pvs.get_opt(&pv_name).await.ok().flatten().is_none().then_some(())
    })
    .await?;
    println!("PV {pv_name} deleted");

    step("killing the driver: the prober reports it, csi-sidecar stays up");
    driver.kill();
    health(&addr, "/healthz/prober", 500).await?;
    step("restarting the driver: reconnected, healthy, provisioning again");
    driver = Proc::spawn("csi-mock-driver-2", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    health(&addr, "/healthz", 200).await?;
    create(&pvcs, &pvc("data-2", Some(&sc_name), "1Gi")).await;
    let pv2 = bound(&pvcs, "data-2").await?;
    println!("PVC {}/data-2 Bound to {pv2}", ns.name());

    step("metrics (upstream names, labels and buckets)");
    let metrics = http::get(&addr, "/metrics").await.map_err(anyhow::Error::msg)?.body;
    for l in metrics.lines().filter(|l| l.starts_with("csi_sidecar_operations_seconds_count") && l.contains(DRIVER)) {
        println!("{l}");
    }
    if let Some(rss) = metrics.lines().find(|l| l.starts_with("process_resident_memory_bytes ")) {
        println!("{rss}");
    }
    if sidecar.try_exit().is_some() {
        bail!("csi-sidecar exited:\n{}", sidecar.logs());
    }
    step("demo OK");
    if !args.once {
        println!(
            "serving on http://{addr}/healthz and /metrics; KUBECONFIG={}; Ctrl-C stops everything",
            cp.kubeconfig().display()
        );
        tokio::signal::ctrl_c().await?;
    }
    let status = sidecar.terminate().await;
    println!("csi-sidecar stopped: {status}");
    drop(driver);
    Ok(())
}
