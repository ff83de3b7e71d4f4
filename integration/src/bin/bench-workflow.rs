//! Benchmark of the whole workflow on a real node: the launcher's control
//! plane with kube-scheduler and one hollow kubelet, the CSI mock driver on
//! the node, csi-sidecar `registrar prober` on the node and `provisioner
//! attacher` as the controller. Each round creates a claim of a
//! WaitForFirstConsumer class and a pod using it (what `kubectl apply` of the
//! two does: two creates) and measures until the pod is Running (scheduled,
//! provisioned, attached, staged, published); then deletes the pod and the
//! claim and measures until the PV is gone (unpublished, unstaged, detached,
//! deleted). Rounds run one after the other; medians and maxima are printed,
//! and the peak RSS of both csi-sidecar processes.
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-workflow --rounds 20
//! ```

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::median,
    cluster::{ControlPlane, try_launcher_bin},
    component_bin, free_port,
    kube_support::{NEVER_PULLED_IMAGE, pvc, storage_class},
    process::{Proc, status_kib},
    sidecar_bin,
};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};

const DRIVER: &str = "bench-workflow.csi.example.com";
const NS: &str = "bench-workflow";
const TIMEOUT: Duration = Duration::from_secs(120);

/// csi-sidecar workflow benchmark.
#[derive(FromArgs)]
struct Args {
    /// rounds (default 20)
    #[argh(option, default = "20")]
    rounds: usize,
}

async fn wait<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if start.elapsed() > TIMEOUT {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = argh::from_env();
    let cp = ControlPlane::spawn_launcher(&try_launcher_bin()?, &["--nodes", "1"])?;
    let node = cp.info().nodes.first().cloned().ok_or_else(|| anyhow!("no node"))?;
    let client = cp.client().await;
    let dir = tempfile::tempdir()?;
    let sock_dir = node.plugins_dir.join(DRIVER);
    std::fs::create_dir_all(&sock_dir)?;
    let sock = sock_dir.join("csi.sock");
    let driver_args = vec![
        format!("--endpoint=unix://{}", sock.display()),
        format!("--name={DRIVER}"),
        format!("--node-id={}", node.name),
        "--enable-topology".to_string(),
    ];
    let _driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    let node_args = vec![
        format!("--csi-address={}", sock.display()),
        format!("--http-endpoint=127.0.0.1:{}", free_port()),
        "registrar".to_string(),
        format!("--kubelet-registration-path={}", sock.display()),
        format!("--plugin-registration-path={}", node.registration_dir.display()),
        "prober".to_string(),
    ];
    let node_sidecar = Proc::spawn("csi-sidecar-node", &sidecar_bin(), &node_args, dir.path());
    let controller_args = vec![
        format!("--csi-address={}", sock.display()),
        format!("--kubeconfig={}", cp.kubeconfig().display()),
        "provisioner".to_string(),
        "--feature-gates=Topology=true".to_string(),
        "attacher".to_string(),
    ];
    let controller = Proc::spawn("csi-sidecar-controller", &sidecar_bin(), &controller_args, dir.path());

    let csinodes: Api<CSINode> = Api::all(client.clone());
    wait("the driver registered with the kubelet", async || {
        let c = csinodes.get_opt(&node.name).await.ok().flatten()?;
        c.spec.drivers.iter().any(|d| d.name == DRIVER).then_some(())
    })
    .await?;
    let ns = Namespace { metadata: ObjectMeta { name: Some(NS.into()), ..Default::default() }, ..Default::default() };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    let mut class = storage_class("bench-workflow", DRIVER);
    class.volume_binding_mode = Some("WaitForFirstConsumer".to_string());
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());

    let (mut up, mut down) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let name = format!("r{round}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "c", "image": NEVER_PULLED_IMAGE,
                                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}],
                "terminationGracePeriodSeconds": 0
            }
        }))?;
        let t0 = Instant::now();
        pvcs.create(&PostParams::default(), &pvc(&name, Some("bench-workflow"), "1Gi")).await?;
        pods.create(&PostParams::default(), &pod).await?;
        wait("the pod Running", async || {
            let p = pods.get_opt(&name).await.ok().flatten()?;
            (p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(())
        })
        .await?;
        let t_up = t0.elapsed().as_secs_f64();
        let pv = pvcs.get(&name).await?.spec.and_then(|s| s.volume_name).ok_or_else(|| anyhow!("no PV"))?;

        let t1 = Instant::now();
        pods.delete(&name, &DeleteParams::default()).await?;
        pvcs.delete(&name, &DeleteParams::default()).await?;
        wait("the PV gone", async || pvs.get_opt(&pv).await.ok().and_then(|p| p.is_none().then_some(()))).await?;
        let t_down = t1.elapsed().as_secs_f64();
        wait("the pod gone", async || pods.get_opt(&name).await.ok().and_then(|p| p.is_none().then_some(()))).await?;
        println!("round {round:>2}: apply -> Running {t_up:.2} s, delete -> PV gone {t_down:.2} s");
        up.push(t_up);
        down.push(t_down);
    }
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (up_max, down_max) = (max(&up), max(&down));
    println!(
        "{} rounds: apply -> Running median {:.2} s (max {up_max:.2}); pod deletion -> PV gone median {:.2} s (max {down_max:.2})",
        args.rounds,
        median(&up),
        median(&down)
    );
    println!(
        "peak RSS: controller csi-sidecar {:.1} MiB, node csi-sidecar {:.1} MiB",
        status_kib(controller.pid(), "VmHWM:") as f64 / 1024.0,
        status_kib(node_sidecar.pid(), "VmHWM:") as f64 / 1024.0
    );
    Ok(())
}
