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

use anyhow::Result;
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{
        Qps, create_namespace, idle_rss, mib, settled_snapshot, sidecar, sidecar_kubeconfig, start_mock_driver,
        synced_sidecar, wait_for,
    },
    cluster::ControlPlane,
    kube_support::{csi_pv, pod, pvc, storage_class},
    process::{Proc, status_kib},
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
    /// idle cache: bound claims, their PVs and a pod using each, of an
    /// offline-only driver (so the resizer watches pods), then the idle RSS
    /// of a resizer with all of them cached (default 0: skipped)
    #[argh(option, default = "0")]
    idle_cache: usize,
}

/// The idle-cache driver: offline expansion only, so the in-use check (the Pod watch) is on.
const IDLE_DRIVER: &str = "bench-idle.csi.example.com";
const IDLE_NS: &str = "bench-resize-idle";

/// Creates `n` claims bound to `n` PVs of [`IDLE_DRIVER`] (both statuses
/// written here, consistent, so the PV binder has nothing to do) and a
/// pending pod using each; starts a resizer and reads its RSS 5 s after its
/// caches synced; returns the report line.
async fn idle_cache(admin: &Client, kubeconfig: &std::path::Path, dir: &std::path::Path, n: usize) -> Result<String> {
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};
    let csi = dir.join("idle.sock");
    let mut driver = Proc::spawn(
        "csi-mock-driver-idle",
        &csi_sidecar_integration::component_bin("csi-mock-driver"),
        &[
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={IDLE_DRIVER}"),
            "--disable-online-expansion".into(),
        ],
        dir,
    );
    let ns =
        Namespace { metadata: ObjectMeta { name: Some(IDLE_NS.into()), ..Default::default() }, ..Default::default() };
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), IDLE_NS);
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), IDLE_NS);
    let t = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (pvcs, pvs, pods) = (pvcs.clone(), pvs.clone(), pods.clone());
            async move {
                let (claim, volume) = (format!("c{i:05}"), format!("{IDLE_NS}-pv-{i:05}"));
                let mut c = pvc(&claim, Some(""), "1Gi");
                if let Some(spec) = c.spec.as_mut() {
                    spec.volume_name = Some(volume.clone());
                }
                let created = pvcs.create(&PostParams::default(), &c).await?;
                let mut pv = csi_pv(&volume, IDLE_DRIVER, &format!("vol-{i:05}"), "1Gi");
                if let Some(spec) = pv.spec.as_mut() {
                    spec.claim_ref = Some(ObjectReference {
                        kind: Some("PersistentVolumeClaim".into()),
                        namespace: Some(IDLE_NS.into()),
                        name: Some(claim.clone()),
                        uid: created.metadata.uid.clone(),
                        ..Default::default()
                    });
                }
                pvs.create(&PostParams::default(), &pv).await?;
                let bound = serde_json::json!({"status": {"phase": "Bound"}});
                pvs.patch_status(&volume, &PatchParams::default(), &Patch::Merge(&bound)).await?;
                let claim_bound = serde_json::json!({"status": {"phase": "Bound",
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}});
                pvcs.patch_status(&claim, &PatchParams::default(), &Patch::Merge(&claim_bound)).await?;
                let mut p = pod(&format!("p{i:05}"), "", &claim);
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = None;
                }
                pods.create(&PostParams::default(), &p).await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = t.elapsed().as_secs_f64();
    let idle = idle_rss("resizer", &csi, kubeconfig, dir, "Caches synced").await?;
    driver.kill();
    Ok(format!(
        "Idle cache: {n} bound claims + {n} PVs + {n} pending pods using them (offline-only driver: pods watched), \
         created in {created:.0} s; the resizer's caches synced {:.2} s after its spawn ({}); \
         RSS 5 s later **{:.1} MiB**, peak {:.1} MiB.",
        idle.synced_secs,
        idle.watches.join(", "),
        idle.rss,
        idle.hwm
    ))
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

async fn run(args: Args) -> Result<()> {
    let qps: Vec<Qps> = args.qps.split(',').filter(|s| !s.trim().is_empty()).map(Qps::parse).collect::<Result<_>>()?;
    let tmp = tempfile::tempdir()?;
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin: Client = cp.client().await;
    let kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;
    let csi = tmp.path().join("csi.sock");
    let mut driver = start_mock_driver(&csi, DRIVER, "bench-node", tmp.path()).await?;
    create_namespace(&admin, NS).await?;
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

    let idle = if args.idle_cache > 0 {
        eprintln!("idle cache: {} claims, PVs and pods ...", args.idle_cache);
        Some(idle_cache(&admin, &kubeconfig, tmp.path(), args.idle_cache).await?)
    } else {
        None
    };
    let mut rounds = Vec::new();
    for (r, q) in qps.iter().enumerate() {
        let size = format!("{}Mi", r + 2);
        let mut extra = q.flags();
        extra.push("resizer".into());
        let caches = ("the resizer's caches", "Caches synced");
        let mut rsz =
            synced_sidecar(&format!("resizer-{}", q.short()), &csi, &kubeconfig, &extra, tmp.path(), caches).await?;
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
    if let Some(idle) = idle {
        println!("\n{idle}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    run(argh::from_env()).await
}
