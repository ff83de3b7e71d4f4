//! Benchmark of the `snapshotter` module: N VolumeSnapshots of bound claims
//! created at once, against the real control plane with the real
//! snapshot-controller and the CSI mock driver.
//!
//! The claims are provisioned first by a csi-sidecar `provisioner` process
//! (not measured, stopped before the rounds). Then, per QPS setting, a fresh
//! `snapshotter` process runs as its own user (its requests counted exactly
//! by an APF FlowSchema, see `bench.rs`); the bench creates N VolumeSnapshots
//! at once (one per claim, spread over the claims) and measures until every
//! one is `readyToUse`: wall time, the sidecar's API requests per snapshot,
//! its peak RSS (VmHWM). The snapshots are deleted (and their contents gone:
//! DeleteSnapshot, finalizer) before the next round, that part timed too.
//!
//! With `--restores N`, each round also restores N new claims from its
//! ready snapshots with a fresh `provisioner` process (same accounting).
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-snapshotter --claims 200 --snapshots 200 --restores 200 --qps default,unlimited
//! ```

use std::time::{Duration, Instant};

use anyhow::Result;
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{Qps, bound_claims, idle_rss, mib, settled_snapshot, sidecar, start_mock_driver, synced_sidecar, wait_for},
    bench_world::SnapshotWorld,
    kube_support::pvc,
    process::status_kib,
    snapshots::{SnapApis, obj, ready},
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};

const DRIVER: &str = "bench-snap.csi.example.com";
const NS: &str = "bench-snap";
const CLASS: &str = "bench-snap";

/// csi-sidecar snapshotter benchmark.
#[derive(FromArgs)]
struct Args {
    /// volume snapshots per round (default 300)
    #[argh(option, default = "300")]
    snapshots: usize,
    /// bound claims the snapshots are taken of (default 30)
    #[argh(option, default = "30")]
    claims: usize,
    /// comma-separated client QPS settings: default, unlimited, or a number (default "default,unlimited")
    #[argh(option, default = "String::from(\"default,unlimited\")")]
    qps: String,
    /// idle cache: this many ready pre-provisioned contents of the driver
    /// and as many of another driver, then the idle RSS of a snapshotter
    /// with them (default 0: skipped)
    #[argh(option, default = "0")]
    idle_cache: usize,
    /// restores per round: this many new claims restored from the round's
    /// ready snapshots by a fresh `provisioner` process (default 0: none)
    #[argh(option, default = "0")]
    restores: usize,
}

/// Creates `n` ready contents of [`DRIVER`] and `n` of another driver, starts a
/// snapshotter and reads its RSS 5 s after its caches synced; returns the
/// report line.
async fn idle_cache(
    snaps: &SnapApis,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
) -> Result<String> {
    use kube::api::{Patch, PatchParams};
    let t = Instant::now();
    stream::iter(0..2 * n)
        .map(|i| {
            let api = snaps.contents.clone();
            async move {
                let (driver, name) = if i < n {
                    (DRIVER, format!("idle-{i:05}"))
                } else {
                    ("other.csi.example.com", format!("other-{i:05}"))
                };
                let v = serde_json::json!({"metadata": {"name": name}, "spec": {
                    "deletionPolicy": "Retain", "driver": driver, "source": {"snapshotHandle": format!("h-{name}")},
                    "volumeSnapshotRef": {"name": name, "namespace": NS}}});
                api.create(&PostParams::default(), &obj("VolumeSnapshotContent", v)).await?;
                let st = serde_json::json!({"status": {"snapshotHandle": format!("h-{name}"), "readyToUse": true,
                    "creationTime": 1_700_000_000_000_000_000i64, "restoreSize": 1_073_741_824}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = t.elapsed().as_secs_f64();
    let idle = idle_rss("snapshotter", csi, kubeconfig, dir, "Caches synced; snapshotting").await?;
    Ok(format!(
        "Idle cache: {n} ready contents of the driver + {n} of another driver, created in {created:.0} s; the \
         snapshotter's caches synced {:.2} s after its spawn ({}); RSS 5 s later **{:.1} MiB**, peak {:.1} MiB.",
        idle.synced_secs,
        idle.watches.join(", "),
        idle.rss,
        idle.hwm
    ))
}

struct Round {
    qps: Qps,
    create_secs: f64,
    delete_secs: f64,
    requests_per_snapshot: f64,
    peak_rss: f64,
    /// (wall time, requests per restore, the provisioner's peak RSS)
    restores: Option<(f64, f64, f64)>,
}

/// Restores `args.restores` claims from round `r`'s ready snapshots with a
/// fresh provisioner (as the counted sidecar user) and measures until all are
/// Bound; then deletes them (and waits for their PVs) before the snapshots go.
#[allow(clippy::too_many_arguments)]
async fn restore_round(
    args: &Args,
    r: usize,
    q: &Qps,
    admin: &Client,
    pvcs: &Api<PersistentVolumeClaim>,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
) -> Result<(f64, f64, f64)> {
    let mut extra = q.flags();
    extra.push("provisioner".into());
    let caches = ("the provisioner's caches", "Caches synced; provisioning");
    let mut prov = synced_sidecar(&format!("provisioner-{}", q.short()), csi, kubeconfig, &extra, log, caches).await?;
    let before = settled_snapshot(admin, None).await?;
    eprintln!("  {} restores ...", args.restores);
    let start = Instant::now();
    let snapshots = args.snapshots;
    stream::iter(0..args.restores)
        .map(|i| {
            let api = pvcs.clone();
            async move {
                let mut claim = pvc(&format!("r{r}-restore{i}"), Some(CLASS), "1Mi");
                if let Some(spec) = claim.spec.as_mut() {
                    spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                        api_group: Some("snapshot.storage.k8s.io".into()),
                        kind: "VolumeSnapshot".into(),
                        name: format!("r{r}-s{}", i % snapshots),
                    });
                }
                api.create(&PostParams::default(), &claim).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let want = args.claims + args.restores;
    wait_for("every restore bound", Duration::from_secs(1800), async || Ok(bound_claims(pvcs, "").await? == want))
        .await?;
    let secs = start.elapsed().as_secs_f64();
    let d = settled_snapshot(admin, None).await?.delta(&before);
    let rss = mib(status_kib(prov.pid(), "VmHWM:"));
    eprintln!("  -> all Bound in {secs:.1} s, {:.2} requests per restore", d.sidecar / args.restores as f64);
    let prefix = format!("r{r}-restore");
    for c in pvcs.list(&ListParams::default()).await?.items {
        if let Some(name) = c.metadata.name.filter(|n| n.starts_with(&prefix)) {
            pvcs.delete(&name, &DeleteParams::default()).await?;
        }
    }
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(admin.clone());
    wait_for("the restored volumes deleted", Duration::from_secs(1800), async || {
        Ok(pvs.list(&ListParams::default()).await?.items.len() == args.claims)
    })
    .await?;
    prov.terminate().await;
    Ok((secs, d.sidecar / args.restores as f64, rss))
}

async fn run(args: Args) -> Result<()> {
    let qps: Vec<Qps> = args.qps.split(',').filter(|s| !s.trim().is_empty()).map(Qps::parse).collect::<Result<_>>()?;
    let tmp = tempfile::tempdir()?;
    let SnapshotWorld { cp, admin, kubeconfig, snaps } = SnapshotWorld::start(NS, CLASS, DRIVER).await?;
    let csi = tmp.path().join("csi.sock");
    let mut driver = start_mock_driver(&csi, DRIVER, "bench-node", tmp.path()).await?;

    eprintln!("provisioning {} claims ...", args.claims);
    let admin_kc = cp.kubeconfig().to_path_buf();
    let mut prov =
        sidecar("provisioner", &csi, &admin_kc, &["provisioner".into(), "--kube-api-qps=-1".into()], tmp.path());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS);
    for i in 0..args.claims {
        pvcs.create(&PostParams::default(), &pvc(&format!("c{i}"), Some(CLASS), "1Mi")).await?;
    }
    wait_for("every claim bound", Duration::from_secs(600), async || Ok(bound_claims(&pvcs, "").await? == args.claims))
        .await?;
    prov.terminate().await;

    let idle = if args.idle_cache > 0 {
        eprintln!("idle cache: {} contents of the driver, as many of another ...", args.idle_cache);
        Some(idle_cache(&snaps, &csi, &kubeconfig, tmp.path(), args.idle_cache).await?)
    } else {
        None
    };
    let mut rounds = Vec::new();
    for (r, q) in qps.iter().enumerate() {
        let mut extra = q.flags();
        extra.push("snapshotter".into());
        let caches = ("the snapshotter's caches", "Caches synced; snapshotting");
        let mut snap =
            synced_sidecar(&format!("snapshotter-{}", q.short()), &csi, &kubeconfig, &extra, tmp.path(), caches)
                .await?;
        let before = settled_snapshot(&admin, None).await?;
        eprintln!("round {}: QPS {}, {} snapshots ...", r + 1, q.label(), args.snapshots);
        let start = Instant::now();
        let claims = args.claims;
        stream::iter(0..args.snapshots)
            .map(|i| {
                let api = snaps.snapshots.clone();
                async move {
                    let v = serde_json::json!({"metadata": {"name": format!("r{r}-s{i}")},
                        "spec": {"volumeSnapshotClassName": CLASS,
                                 "source": {"persistentVolumeClaimName": format!("c{}", i % claims)}}});
                    api.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        wait_for("every snapshot ready", Duration::from_secs(1800), async || {
            let list = snaps.snapshots.list(&ListParams::default()).await?;
            Ok(list.items.iter().filter(|s| ready(s)).count() == args.snapshots)
        })
        .await?;
        let create_secs = start.elapsed().as_secs_f64();
        let after = settled_snapshot(&admin, None).await?;
        let d = after.delta(&before);
        let peak_rss = mib(status_kib(snap.pid(), "VmHWM:"));
        eprintln!("  -> all ready in {create_secs:.1} s");
        let restores = if args.restores > 0 {
            Some(restore_round(&args, r, q, &admin, &pvcs, &csi, &kubeconfig, tmp.path()).await?)
        } else {
            None
        };
        eprintln!("  deleting ...");
        let start = Instant::now();
        snaps.snapshots.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        wait_for("every content gone", Duration::from_secs(1800), async || {
            let contents = snaps.contents.list(&ListParams::default()).await?.items;
            // (The idle cache's pre-provisioned contents stay.)
            let dynamic =
                contents.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("snapcontent-")));
            Ok(dynamic.count() == 0 && snaps.snapshots.list(&ListParams::default()).await?.items.is_empty())
        })
        .await?;
        let delete_secs = start.elapsed().as_secs_f64();
        let round = Round {
            qps: q.clone(),
            create_secs,
            delete_secs,
            requests_per_snapshot: d.sidecar / args.snapshots as f64,
            peak_rss,
            restores,
        };
        eprintln!(
            "  -> deleted in {:.1} s, {:.2} requests per snapshot (creation), peak RSS {:.1} MiB",
            round.delete_secs, round.requests_per_snapshot, round.peak_rss
        );
        rounds.push(round);
        snap.terminate().await;
    }
    if driver.try_exit().is_some() {
        eprintln!("warning: the CSI mock driver exited during the run");
    }
    println!(
        "Snapshotter: {} VolumeSnapshots of {} bound claims created at once (real snapshot-controller, mock driver, \
         one fresh snapshotter process per row; requests = the sidecar's own until all are ready, counted by the \
         apiserver; peak = VmHWM).\n",
        args.snapshots, args.claims
    );
    println!("| QPS | all ready | requests per snapshot | all deleted | peak RSS |\n|---|---|---|---|---|");
    for r in &rounds {
        println!(
            "| {} | {:.1} s | {:.2} | {:.1} s | {:.1} MiB |",
            r.qps.label(),
            r.create_secs,
            r.requests_per_snapshot,
            r.delete_secs,
            r.peak_rss
        );
    }
    if args.restores > 0 {
        println!(
            "\nRestores: {} new claims, each from one of the ready snapshots, created at once; a fresh provisioner \
             process per row (requests = the sidecar user's until all are Bound; the idle snapshotter runs as the \
             same user).\n",
            args.restores
        );
        println!("| QPS | all Bound | requests per restore | provisioner peak RSS |\n|---|---|---|---|");
        for r in &rounds {
            if let Some((secs, per, rss)) = r.restores {
                println!("| {} | {secs:.1} s | {per:.2} | {rss:.1} MiB |", r.qps.label());
            }
        }
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
