//! Benchmark of `provisioner --node-deployment`: the memory of one node's
//! instance in a cluster full of other nodes' volumes, against the real
//! control plane and the CSI mock driver (topology on, this node's value).
//!
//! The bench creates N PVs of the driver through the API, each with the node
//! affinity of one of `--other-nodes` other nodes (reclaim `Retain`, so no
//! instance has anything to do with them), then reads the idle RSS (5 s after
//! the caches synced) of:
//!
//! 1. a node instance before the PVs exist (the baseline),
//! 2. a node instance with the N PVs in the cluster,
//! 3. the same provisioner without `--node-deployment` with the N PVs: it
//!    caches every PV of the driver, as upstream's node-deployment
//!    provisioner does (it watches and keeps all PVs).
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-node-deployment --pvs 10000
//! ```

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::mib,
    cluster::ControlPlane,
    kube_support::csi_pv,
    process::{Proc, status_kib},
    sidecar_bin,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, VolumeNodeAffinity,
};
use kube::api::{Api, PostParams};

const DRIVER: &str = "bench-node.csi.example.com";
const KEY: &str = "io.kubernetes.storage.mock/node";
const THIS_NODE: &str = "bench-this-node";

/// csi-sidecar node-deployment benchmark.
#[derive(FromArgs)]
struct Args {
    /// PVs of other nodes (default 10000)
    #[argh(option, default = "10000")]
    pvs: usize,
    /// how many other nodes they are spread over (default 100)
    #[argh(option, default = "100")]
    other_nodes: usize,
}

struct Idle {
    synced_secs: f64,
    rss: f64,
    hwm: f64,
    pvs_cached: String,
}

/// Spawns a provisioner (`node_deployment`: with `--node-deployment` and
/// `NODE_NAME`), waits until its caches synced, reads its memory 5 s later, stops it.
async fn idle(csi: &Path, kubeconfig: &Path, log: &Path, label: &str, node_deployment: bool) -> Result<Idle> {
    let mut args = vec![format!("--csi-address={}", csi.display()), format!("--kubeconfig={}", kubeconfig.display())];
    args.push("provisioner".into());
    if node_deployment {
        args.push("--node-deployment".into());
    }
    let spawned = Instant::now();
    let mut p = Proc::spawn_env(label, &sidecar_bin(), &args, &[("NODE_NAME", Some(THIS_NODE))], log);
    while !p.logs().contains("Caches synced; provisioning") {
        if p.try_exit().is_some() || spawned.elapsed() > Duration::from_secs(300) {
            bail!("{label} did not sync:\n{}", p.logs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let synced_secs = spawned.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kib = |field| status_kib(p.pid(), field);
    let (rss, hwm) = (mib(kib("VmRSS:")), mib(kib("VmHWM:")));
    let pvs_cached = p
        .logs()
        .lines()
        .filter(|l| l.contains("Watch synced") && l.contains("PersistentVolume") && !l.contains("Claim"))
        .map(|l| l.split("Watch synced").last().unwrap_or("").trim().to_string())
        .collect::<Vec<_>>()
        .join("; ");
    p.terminate().await;
    Ok(Idle { synced_secs, rss, hwm, pvs_cached })
}

fn pv_of(i: usize, node: &str) -> PersistentVolume {
    let mut pv = csi_pv(&format!("bench-nd-pv-{i:05}"), DRIVER, &format!("vol-{i:05}"), "1Gi");
    pv.metadata.annotations = Some([("pv.kubernetes.io/provisioned-by".to_string(), DRIVER.to_string())].into());
    if let Some(spec) = pv.spec.as_mut() {
        spec.node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: KEY.into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    match_fields: None,
                }],
            }),
        });
    }
    pv
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = argh::from_env();
    let cp = ControlPlane::try_start()?;
    let admin = cp.client().await;
    let dir = tempfile::tempdir()?;
    let csi = dir.path().join("csi.sock");
    // The mock driver is started with topology; its NodeGetInfo names this node.
    let mut driver = {
        let args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={DRIVER}"),
            format!("--node-id={THIS_NODE}"),
            "--enable-topology".into(),
            format!("--topology-value={THIS_NODE}"),
            "--disable-attach".into(),
        ];
        let p = Proc::spawn(
            "csi-mock-driver-topo",
            &csi_sidecar_integration::component_bin("csi-mock-driver"),
            &args,
            dir.path(),
        );
        let t = Instant::now();
        while !csi.exists() {
            if t.elapsed() > Duration::from_secs(30) {
                bail!("the mock driver did not come up");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p
    };
    let kubeconfig = cp.kubeconfig().to_path_buf();

    let base = idle(&csi, &kubeconfig, dir.path(), "node-empty", true).await?;
    eprintln!("baseline: {:.1} MiB", base.rss);

    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let t = Instant::now();
    let others = args.other_nodes.max(1);
    stream::iter(0..args.pvs)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                pvs.create(&PostParams::default(), &pv_of(i, &format!("other-node-{}", i % others))).await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = t.elapsed().as_secs_f64();
    eprintln!("{} PVs created in {created:.0} s", args.pvs);

    let node = idle(&csi, &kubeconfig, dir.path(), "node-full", true).await?;
    let controller = idle(&csi, &kubeconfig, dir.path(), "controller-full", false).await?;
    driver.kill();
    for (label, i) in [
        ("node instance, no PVs", &base),
        ("node instance, PVs of other nodes", &node),
        ("without --node-deployment (all PVs cached, as upstream's node instance)", &controller),
    ] {
        println!(
            "{label}: synced {:.2} s after spawn ({}), idle RSS {:.1} MiB, peak {:.1} MiB",
            i.synced_secs, i.pvs_cached, i.rss, i.hwm
        );
    }
    println!(
        "| {} PVs of {} other nodes (created in {created:.0} s) | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
        args.pvs, others, base.rss, node.rss, controller.rss
    );
    Ok(())
}
