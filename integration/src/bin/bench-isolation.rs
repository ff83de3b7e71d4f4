//! Benchmark of one module's backlog beside another's work: N claims
//! provisioned while M VolumeSnapshots keep failing (the driver refuses every
//! `CreateSnapshot`), with the health monitor watching one abnormal volume.
//!
//! Against the real control plane with the real snapshot-controller and the
//! in-repo fault driver (the CSI mock driver cannot refuse snapshots). Per
//! round and layout, with default flags (5 QPS / 10 burst per process):
//! 1. the layout's processes start and sync their caches;
//! 2. M VolumeSnapshots of one bound claim are created; once the snapshotter
//!    has made its first failed `CreateSnapshot` calls (its backlog is
//!    there), at once: N new claims, and the volume of another bound claim
//!    turns abnormal (a message new to this round);
//! 3. measured: the time until every new claim has a PersistentVolume (the
//!    provisioner's own part), until every one is Bound (kube-controller-
//!    manager's binder after that), and until the monitor's `VolumeConditionAbnormal` event with that message appears
//!    (its interval, `--monitor-interval` and `--list-volumes-interval`, is
//!    the bound that event must meet);
//! 4. the snapshots and the new claims are deleted (not measured) and the
//!    processes stopped; their peak RSS (VmHWM) is read first, and the run
//!    fails if any process went above `--rss-bound-mib`.
//!
//! Layouts (`--layouts`, default `separate,combined`):
//! * `separate`: `provisioner`, `snapshotter` and `health-monitor` as three
//!   processes, each with its own budget (upstream's layout);
//! * `combined`: `provisioner snapshotter health-monitor` in one process.
//!
//! With `--rounds N` > 1, every figure is the median.
//!
//! ```text
//! cargo build --release -p csi-sidecar -p csi-sidecar-integration \
//!   --bin csi-sidecar --bin bench-isolation --bin cluster
//! target/release/bench-isolation --rounds 3
//! ```

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use argh::FromArgs;
use csi_sidecar::csi::{HealthCondition, HealthStatus};
use csi_sidecar_integration::{
    bench::{bound_claims, claims_with_volume, median, mib, synced_sidecar, wait_for},
    bench_world::SnapshotWorld,
    fault_driver::{FaultDriver, HealthForms, Script, SnapshotMethod, Transport},
    kube_support::pvc,
    process::{Proc, status_kib},
    snapshots::{SnapApis, obj},
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use tonic::Code;

const DRIVER: &str = "bench-isolation.csi.example.com";
const NS: &str = "bench-isolation";
const CLASS: &str = "bench-isolation";
const ABNORMAL: &str = "VolumeConditionAbnormal";

/// csi-sidecar benchmark: provisioning beside a snapshot backlog.
#[derive(FromArgs)]
struct Args {
    /// new claims per round (default 100)
    #[argh(option, default = "100")]
    claims: usize,
    /// failing VolumeSnapshots per round (default 1000)
    #[argh(option, default = "1000")]
    snapshots: usize,
    /// rounds per layout (default 3)
    #[argh(option, default = "3")]
    rounds: usize,
    /// the health monitor's --monitor-interval and --list-volumes-interval in seconds (default 15)
    #[argh(option, default = "15")]
    monitor_interval: u64,
    /// comma-separated layouts: separate, combined (default "separate,combined")
    #[argh(option, default = "String::from(\"separate,combined\")")]
    layouts: String,
    /// an argument for every sidecar process (repeatable), e.g. `-v=5`
    #[argh(option)]
    sidecar_arg: Vec<String>,
    /// the peak RSS (VmHWM) no sidecar process may exceed, in MiB (default 32)
    #[argh(option, default = "32")]
    rss_bound_mib: u64,
}

/// One round of one layout.
struct Round {
    /// Every new claim has a PersistentVolume.
    volumes: f64,
    /// Every new claim is Bound.
    provisioned: f64,
    event: f64,
    rss_kib: u64,
    failed_creates: usize,
}

/// What the rounds share.
struct World {
    admin: Client,
    kubeconfig: PathBuf,
    csi: PathBuf,
    dir: PathBuf,
    driver: FaultDriver,
    snaps: SnapApis,
    sick_volume: String,
}

fn main() -> Result<()> {
    let args: Args = argh::from_env();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

/// The run in a temporary directory (the driver's socket, the sidecars'
/// logs), kept when the run fails so its logs can be read.
async fn run(args: Args) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let result = run_in(args, &tmp).await;
    if result.is_err() {
        eprintln!("the sidecars' logs are kept in {}", tmp.keep().display());
    }
    result
}

async fn run_in(args: Args, tmp: &tempfile::TempDir) -> Result<()> {
    let SnapshotWorld { cp, admin, kubeconfig, snaps } = SnapshotWorld::start(NS, CLASS, DRIVER).await?;
    let csi = tmp.path().join("csi.sock");
    let refuse = Some((Code::Internal, "the backend refuses snapshots".to_string()));
    let script = Script {
        name: DRIVER.into(),
        controller: true,
        snapshots: true,
        create_snapshot_error: refuse,
        health: HealthForms { legacy_list: true, ..HealthForms::NONE },
        ..Script::default()
    };
    let driver = FaultDriver::start(&csi, Transport::Grpc, script);

    eprintln!("provisioning the snapshot source and the volume that turns abnormal ...");
    let admin_kc = cp.kubeconfig().to_path_buf();
    let unlimited = ["provisioner".to_string(), "--kube-api-qps=-1".to_string()];
    let caches = ("the setup provisioner's caches", "Caches synced; provisioning");
    let mut setup = synced_sidecar("setup", &csi, &admin_kc, &unlimited, tmp.path(), caches).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS);
    for name in ["source", "sick"] {
        pvcs.create(&PostParams::default(), &pvc(name, Some(CLASS), "1Mi")).await?;
    }
    wait_for("the setup claims bound", Duration::from_secs(120), async || Ok(bound_claims(&pvcs, "").await? == 2))
        .await?;
    setup.terminate().await;
    let sick_volume = volume_of(&admin, &pvcs, "sick").await?;

    let world = World { admin, kubeconfig, csi, dir: tmp.path().to_path_buf(), driver, snaps, sick_volume };
    let layouts: Vec<&str> = args.layouts.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let mut report = String::new();
    for layout in &layouts {
        let mut rounds = Vec::new();
        for r in 0..args.rounds {
            eprintln!(
                "{layout}, round {}: {} claims beside {} failing snapshots ...",
                r + 1,
                args.claims,
                args.snapshots
            );
            let done = round(&world, &args, layout, r).await?;
            eprintln!(
                "{layout}, round {}: every claim had a volume after {:.1} s, all Bound after {:.1} s, the abnormal-volume event after {:.1} s, \
                 {} failed CreateSnapshot calls, peak RSS {:.1} MiB",
                r + 1,
                done.volumes,
                done.provisioned,
                done.event,
                done.failed_creates,
                mib(done.rss_kib)
            );
            rounds.push(done);
        }
        let med = |f: fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        report.push_str(&format!(
            "| {layout} | {:.1} s ({}) | {:.1} s | {:.1} s | {:.0} | {:.1} MiB |\n",
            med(|r| r.volumes),
            rounds.iter().map(|r| format!("{:.1}", r.volumes)).collect::<Vec<_>>().join(", "),
            med(|r| r.provisioned),
            med(|r| r.event),
            med(|r| r.failed_creates as f64),
            mib(med(|r| r.rss_kib as f64) as u64),
        ));
    }
    println!(
        "\n{} claims provisioned beside {} VolumeSnapshots the driver refuses; the health monitor's interval {} s; \
         medians of {} rounds\n",
        args.claims, args.snapshots, args.monitor_interval, args.rounds
    );
    println!(
        "| Layout | Every claim has a volume (rounds) | All claims Bound | Abnormal-volume event | \
         Failed CreateSnapshot calls meanwhile | Peak RSS (sum) |"
    );
    println!("|---|---|---|---|---|---|");
    print!("{report}");
    Ok(())
}

/// The processes of `layout`, started and synced.
async fn start(world: &World, args: &Args, layout: &str, r: usize) -> Result<Vec<Proc>> {
    let interval = format!("--monitor-interval={}s", args.monitor_interval);
    let list_interval = format!("--list-volumes-interval={}s", args.monitor_interval);
    let module_args = |m: &str| -> Vec<String> {
        let mut all = match m {
            // The interval of the form the driver serves (ListVolumes: the
            // list interval).
            "health-monitor" => vec![m.to_string(), interval.clone(), list_interval.clone()],
            _ => vec![m.to_string()],
        };
        all.extend(args.sidecar_arg.iter().cloned());
        all
    };
    let synced_line = |m: &str| match m {
        "provisioner" => "Caches synced; provisioning",
        "snapshotter" => "Caches synced; snapshotting",
        _ => "Caches synced; monitoring volume health",
    };
    let modules = ["provisioner", "snapshotter", "health-monitor"];
    let (kc, csi, dir) = (&world.kubeconfig, &world.csi, &world.dir);
    match layout {
        "combined" => {
            let all: Vec<String> = modules.iter().flat_map(|m| module_args(m)).collect();
            let p = synced_sidecar(
                &format!("combined-{r}"),
                csi,
                kc,
                &all,
                dir,
                ("its caches", synced_line("provisioner")),
            )
            .await?;
            for m in &modules[1..] {
                wait_for(&format!("{m} synced"), Duration::from_secs(120), async || {
                    Ok(p.logs().contains(synced_line(m)))
                })
                .await?;
            }
            Ok(vec![p])
        }
        "separate" => {
            let mut procs = Vec::new();
            for m in modules {
                let caches = (m, synced_line(m));
                procs.push(synced_sidecar(&format!("{m}-{r}"), csi, kc, &module_args(m), dir, caches).await?);
            }
            Ok(procs)
        }
        other => bail!("unknown layout {other:?} (separate, combined)"),
    }
}

async fn round(world: &World, args: &Args, layout: &str, r: usize) -> Result<Round> {
    let mut procs = start(world, args, layout, r).await?;
    let creates = || world.driver.snapshot_calls_of(SnapshotMethod::Create).len();
    let creates_before = creates();
    stream::iter(0..args.snapshots)
        .map(|i| {
            let api = world.snaps.snapshots.clone();
            async move {
                let v = serde_json::json!({"metadata": {"name": format!("{layout}-{r}-s{i}")},
                    "spec": {"volumeSnapshotClassName": CLASS, "source": {"persistentVolumeClaimName": "source"}}});
                api.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    wait_for("the snapshotter's backlog", Duration::from_secs(300), async || Ok(creates() >= creates_before + 20))
        .await?;

    // The load: new claims and a volume that turns abnormal, at once.
    let tag = format!("{layout}-{r}");
    let message = format!("bench {tag}: the disk is failing");
    let condition =
        HealthCondition { status: HealthStatus::Inaccessible, reason: "Failing".into(), message: message.clone() };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(world.admin.clone(), NS);
    let start = Instant::now();
    world.driver.set_volume_health(&world.sick_volume, vec![condition]);
    for i in 0..args.claims {
        pvcs.create(&PostParams::default(), &pvc(&format!("{tag}-c{i}"), Some(CLASS), "1Mi")).await?;
    }
    let pvs: Api<PersistentVolume> = Api::all(world.admin.clone());
    let (mut volumes, mut provisioned, mut event) = (None, None, None);
    let events: Api<Event> = Api::namespaced(world.admin.clone(), NS);
    let abnormal = ListParams::default().fields(&format!("involvedObject.name=sick,reason={ABNORMAL}"));
    wait_for("every claim bound and the abnormal event", Duration::from_secs(900), async || {
        if volumes.is_none() && claims_with_volume(&pvs, &tag).await.ok() == Some(args.claims) {
            volumes = Some(start.elapsed());
        }
        if provisioned.is_none() && bound_claims(&pvcs, &tag).await.ok() == Some(args.claims) {
            provisioned = Some(start.elapsed());
        }
        if event.is_none() {
            // A request the loaded apiserver drops is asked again next pass.
            let list = events.list(&abnormal).await.map(|l| l.items).unwrap_or_default();
            if list.iter().any(|e| e.message.as_deref().is_some_and(|m| m.contains(&message))) {
                event = Some(start.elapsed());
            }
        }
        Ok(volumes.is_some() && provisioned.is_some() && event.is_some())
    })
    .await?;
    let failed_creates = creates() - creates_before;
    let peaks: Vec<u64> = procs.iter().map(|p| status_kib(p.pid(), "VmHWM")).collect();
    let rss_kib = peaks.iter().sum();
    world.driver.clear_volume_health(&world.sick_volume);

    // Clean up with the processes still running (the snapshotter removes the
    // contents' finalizers, the provisioner deletes the volumes); a request
    // the loaded apiserver drops is sent again on the next pass.
    let cleaning = Instant::now();
    let mut reported = 0;
    wait_for("the round's snapshots, contents and volumes gone", Duration::from_secs(900), async || {
        let left = clean_up(world, &pvcs, &pvs, &tag).await.unwrap_or_else(|e| {
            eprintln!("cleaning up: {e} (again)");
            Left::default()
        });
        let secs = cleaning.elapsed().as_secs();
        if secs / 30 > reported {
            reported = secs / 30;
            eprintln!("cleaning up, {secs} s: {left:?} left");
        }
        Ok(left.is_none())
    })
    .await?;
    for p in &mut procs {
        p.terminate().await;
    }
    if let Some(peak) = peaks.iter().max().filter(|&&k| k > args.rss_bound_mib * 1024) {
        bail!(
            "{layout}, round {}: a sidecar's peak RSS {:.1} MiB is above the bound {} MiB",
            r + 1,
            mib(*peak),
            args.rss_bound_mib
        );
    }
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    Ok(Round { volumes: secs(volumes), provisioned: secs(provisioned), event: secs(event), rss_kib, failed_creates })
}

/// What a round's cleanup has still to see gone.
#[derive(Debug, Default)]
struct Left {
    snapshots: usize,
    contents: usize,
    /// Beyond the two setup volumes.
    volumes: usize,
    /// Whether the lists answered (a failed list counts as something left).
    listed: bool,
}

impl Left {
    fn is_none(&self) -> bool {
        self.listed && self.snapshots == 0 && self.contents == 0 && self.volumes == 0
    }
}

/// Deletes what the round made; what is left of it (the two setup volumes
/// stay).
async fn clean_up(
    world: &World,
    pvcs: &Api<PersistentVolumeClaim>,
    pvs: &Api<PersistentVolume>,
    tag: &str,
) -> Result<Left> {
    let snapshots = world.snaps.snapshots.list(&ListParams::default()).await?.items;
    if snapshots.iter().any(|s| s.metadata.deletion_timestamp.is_none()) {
        world.snaps.snapshots.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    }
    for claim in pvcs.list(&ListParams::default()).await?.items {
        let name = claim.metadata.name.unwrap_or_default();
        if name.starts_with(tag) && claim.metadata.deletion_timestamp.is_none() {
            pvcs.delete(&name, &DeleteParams::default()).await?;
        }
    }
    let contents = world.snaps.contents.list(&ListParams::default()).await?.items;
    // The snapshot-controller (v8.7.0) now and then removes a VolumeSnapshot
    // deleted a moment after it was bound without marking or deleting its
    // content, which then has no snapshot and no deletionTimestamp, and
    // nothing ever deletes it (its CreateSnapshot always failed, so there is
    // no backend snapshot). Those are removed here, and counted.
    if snapshots.is_empty() {
        let orphans: Vec<String> = contents
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        for name in &orphans {
            eprintln!(
                "cleaning up: content {name} has no snapshot and no deletion (the snapshot-controller's); removed"
            );
            world.snaps.force_delete_content(name).await;
        }
    }
    let contents = contents.len();
    let volumes = pvs.list(&ListParams::default()).await?.items.len().saturating_sub(2);
    Ok(Left { snapshots: snapshots.len(), contents, volumes, listed: true })
}

/// The CSI volume handle of claim `name`'s PV.
async fn volume_of(admin: &Client, pvcs: &Api<PersistentVolumeClaim>, name: &str) -> Result<String> {
    let claim = pvcs.get(name).await?;
    let Some(pv) = claim.spec.and_then(|s| s.volume_name) else { bail!("claim {name} has no volume") };
    let pv = Api::<PersistentVolume>::all(admin.clone()).get(&pv).await?;
    match pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle) {
        Some(h) => Ok(h),
        None => bail!("PersistentVolume of {name} is not a CSI volume"),
    }
}
