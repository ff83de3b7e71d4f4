//! Benchmark of the `resizer` module: N bound claims expanded at once,
//! against the real control plane and the CSI mock driver.
//!
//! The volumes are provisioned first by a csi-sidecar `provisioner` process
//! (not measured, stopped before the rounds). Then, per QPS setting, a fresh
//! `resizer` process runs as its own user (its requests counted exactly by an
//! APF FlowSchema, see `bench.rs`); the bench raises every claim's request by
//! 1 Mi at once and measures until every claim's `status.capacity` shows the
//! new size: wall time, the sidecar's API requests per expansion, its peak
//! RSS (VmHWM).
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-resizer --claims 500 --qps default,unlimited
//! ```

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{Qps, SIDECAR_USER, check_accounting, mib, settled_snapshot, setup_identity, start_mock_driver},
    cluster::{ControlPlane, Identity},
    kube_support::{pvc, storage_class},
    process::{Proc, status_kib},
    sidecar_bin,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};

const DRIVER: &str = "bench-resize.csi.example.com";
const NS: &str = "bench-resize";

/// csi-sidecar resizer benchmark.
#[derive(FromArgs)]
struct Args {
    /// bound claims to expand (default 500)
    #[argh(option, default = "500")]
    claims: usize,
    /// comma-separated client QPS settings: default, unlimited, or a number (default "default,unlimited")
    #[argh(option, default = "String::from(\"default,unlimited\")")]
    qps: String,
}

struct Round {
    qps: Qps,
    secs: f64,
    requests_per_expansion: f64,
    peak_rss: f64,
}

/// (claims whose capacity is `size`, all claims).
async fn at_size(pvcs: &Api<PersistentVolumeClaim>, size: &str) -> Result<(usize, usize)> {
    let list = pvcs.list(&ListParams::default()).await?;
    let done = list
        .items
        .iter()
        .filter(|c| {
            c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|m| m.get("storage")).map(|q| q.0.as_str())
                == Some(size)
        })
        .count();
    Ok((done, list.items.len()))
}

async fn wait_for(what: &str, timeout: Duration, mut probe: impl AsyncFnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !probe().await? {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn sidecar(
    name: &str,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    extra: &[String],
    log: &std::path::Path,
) -> Proc {
    let mut args = vec![format!("--csi-address={}", csi.display()), format!("--kubeconfig={}", kubeconfig.display())];
    args.extend(extra.iter().cloned());
    Proc::spawn(name, &sidecar_bin(), &args, log)
}

async fn run(args: Args) -> Result<()> {
    let qps: Vec<Qps> = args.qps.split(',').filter(|s| !s.trim().is_empty()).map(Qps::parse).collect::<Result<_>>()?;
    let tmp = tempfile::tempdir()?;
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin: Client = cp.client().await;
    setup_identity(&admin).await?;
    let identity = Identity::user(SIDECAR_USER, &[]);
    let kubeconfig = cp.mint(&identity);
    check_accounting(&admin, &cp.client_as(&identity).await).await?;
    let csi = tmp.path().join("csi.sock");
    let mut driver = start_mock_driver(&csi, DRIVER, "bench-node", tmp.path()).await?;
    let ns = Namespace { metadata: ObjectMeta { name: Some(NS.into()), ..Default::default() }, ..Default::default() };
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await?;
    let mut sc = storage_class("bench-resize", DRIVER);
    sc.allow_volume_expansion = Some(true);
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;

    eprintln!("provisioning {} claims ...", args.claims);
    let admin_kc = cp.kubeconfig().to_path_buf();
    let mut prov =
        sidecar("provisioner", &csi, &admin_kc, &["provisioner".into(), "--kube-api-qps=-1".into()], tmp.path());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS);
    stream::iter(0..args.claims)
        .map(|i| {
            let pvcs = pvcs.clone();
            async move { pvcs.create(&PostParams::default(), &pvc(&format!("c{i}"), Some("bench-resize"), "1Mi")).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    wait_for("every claim bound at 1Mi", Duration::from_secs(600), async || {
        Ok(at_size(&pvcs, "1Mi").await?.0 == args.claims)
    })
    .await?;
    prov.terminate().await;

    let mut rounds = Vec::new();
    for (r, q) in qps.iter().enumerate() {
        let size = format!("{}Mi", r + 2);
        let mut extra = q.flags();
        extra.push("resizer".into());
        let mut rsz = sidecar(&format!("resizer-{}", q.short()), &csi, &kubeconfig, &extra, tmp.path());
        wait_for("the resizer's caches", Duration::from_secs(120), async || Ok(rsz.logs().contains("Caches synced")))
            .await?;
        let before = settled_snapshot(&admin, None).await?;
        eprintln!("round {}: QPS {}, {} claims to {size} ...", r + 1, q.label(), args.claims);
        let start = Instant::now();
        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": size}}}});
        stream::iter(0..args.claims)
            .map(|i| {
                let (pvcs, patch) = (pvcs.clone(), patch.clone());
                async move { pvcs.patch(&format!("c{i}"), &PatchParams::default(), &Patch::Merge(&patch)).await }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        wait_for(&format!("every claim at {size}"), Duration::from_secs(1800), async || {
            Ok(at_size(&pvcs, &size).await?.0 == args.claims)
        })
        .await?;
        let secs = start.elapsed().as_secs_f64();
        let after = settled_snapshot(&admin, None).await?;
        let d = after.delta(&before);
        let round = Round {
            qps: q.clone(),
            secs,
            requests_per_expansion: d.sidecar / args.claims as f64,
            peak_rss: mib(status_kib(rsz.pid(), "VmHWM:")),
        };
        eprintln!(
            "  -> {:.1} s, {:.2} requests per expansion, peak RSS {:.1} MiB",
            round.secs, round.requests_per_expansion, round.peak_rss
        );
        rounds.push(round);
        rsz.terminate().await;
    }
    if driver.try_exit().is_some() {
        eprintln!("warning: the CSI mock driver exited during the run");
    }
    println!(
        "Resizer: {} bound claims expanded at once (mock driver, one fresh resizer process per row; requests = \
         the sidecar's own, counted by the apiserver; peak = VmHWM).\n",
        args.claims
    );
    println!("| QPS | all expanded | requests per expansion | peak RSS |\n|---|---|---|---|");
    for r in &rounds {
        println!("| {} | {:.1} s | {:.2} | {:.1} MiB |", r.qps.label(), r.secs, r.requests_per_expansion, r.peak_rss);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    run(argh::from_env()).await
}
