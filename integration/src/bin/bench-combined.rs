//! Benchmark of one csi-sidecar process running `provisioner resizer
//! snapshotter` against the same three modules as three processes: the
//! mixed load of a controller Deployment (new volumes, snapshots and
//! expansions at once), each layout with default flags everywhere (5 QPS /
//! 10 burst per process).
//!
//! Per layout and round, on a fresh control plane with the real
//! snapshot-controller (`cluster serve --snapshots`) and a fresh CSI mock
//! driver, so every run starts from the same state:
//! 1. setup, not measured: 2 × N claims of an expandable class, provisioned by
//!    an unlimited csi-sidecar `provisioner` running as the admin, then stopped;
//! 2. the layout's processes start as the bench's sidecar user and sync
//!    their caches;
//! 3. at once: N new claims, N VolumeSnapshots of the first N existing claims
//!    and N expansions (1Gi → 2Gi) of the other N; measured until every new
//!    claim is Bound, every snapshot `readyToUse` and every expanded claim's
//!    `status.capacity` shows 2Gi.
//!
//! Reported per layout: the wall time; each module's time to done (the
//! provisioner's: the last new claim Bound; the resizer's: the last
//! expansion; the snapshotter's: the last snapshot ready); the sidecar
//! user's API requests as counted by the apiserver (APF FlowSchema, read
//! once the user made no request for a second, see `bench.rs`); per volume,
//! per expansion and per snapshot the requests of that module, told apart
//! by the `User-Agent` in the apiserver's audit log (`csi-provisioner/...`,
//! `csi-resizer/...`, `csi-snapshotter/...`; anything else is "other", e.g.
//! a combined process's shared watches); the peak RSS (VmHWM) of each
//! process and their sum. With `--rounds N` > 1, every figure is the median.
//!
//! Layouts (`--layouts`, comma list, default `combined,separate`):
//! * `combined`: `csi-sidecar provisioner resizer snapshotter`, one process;
//! * `separate`: `csi-sidecar provisioner`, `csi-sidecar resizer` and
//!   `csi-sidecar snapshotter`, three processes of the same user;
//! * `external`: the processes given by `--sidecar-command NAME=CMD`
//!   (repeatable; giving one adds this layout), e.g. upstream's sidecars:
//!
//! ```text
//! bench-combined --layouts combined \
//!   --sidecar-command "provisioner=/opt/csi-provisioner -v=2" \
//!   --sidecar-command "resizer=/opt/csi-resizer" \
//!   --sidecar-command "snapshotter=/opt/csi-snapshotter"
//! ```
//!
//! NAME labels the process (its log and RSS); CMD is split at whitespace (no
//! shell quoting) and gets `--csi-address=<socket> --kubeconfig=<file>`
//! appended. The RSS is the spawned process's own (not a wrapper's
//! children). An external process counts as started once the sidecar user
//! made requests and then none for 3 s (the csi-sidecar layouts wait for
//! each module's "Caches synced" line). `--sidecar-arg` flags (e.g. `-v=5`)
//! go to the csi-sidecar layouts only.
//!
//! ```text
//! cargo build --release -p csi-sidecar -p csi-sidecar-integration \
//!   --bin csi-sidecar --bin bench-combined --bin cluster
//! target/release/bench-combined --rounds 3
//! ```

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    audit::AuditLog,
    bench::{
        SIDECAR_USER, bound_claims, create_namespace, median, mib, settled_snapshot, sidecar, sidecar_kubeconfig,
        snapshot, start_mock_driver, wait_for,
    },
    cluster::{ControlPlane, try_launcher_bin},
    kube_support::{pvc, storage_class},
    process::{Proc, status_kib},
    sidecar_bin,
    snapshots::{SnapApis, obj, ready},
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};

const DRIVER: &str = "bench-combined.csi.example.com";
const CLASS: &str = "bench-combined";
/// New claims (the provisioner's work).
const NS_NEW: &str = "bench-new";
/// Claims expanded (the resizer's work).
const NS_EXPAND: &str = "bench-expand";
/// Claims snapshotted and their VolumeSnapshots (the snapshotter's work).
const NS_SNAP: &str = "bench-snap";
const MODULES: [&str; 3] = ["provisioner", "resizer", "snapshotter"];

/// csi-sidecar benchmark: provisioner + resizer + snapshotter in one process or three.
#[derive(FromArgs)]
struct Args {
    /// new claims, snapshots and expansions, each (default 30)
    #[argh(option, default = "30")]
    claims: usize,
    /// comma-separated layouts: combined, separate, external (default "combined,separate")
    #[argh(option, default = "String::from(\"combined,separate\")")]
    layouts: String,
    /// an external process of the `external` layout, as NAME=CMD (repeatable; see the file's docs)
    #[argh(option)]
    sidecar_command: Vec<String>,
    /// an extra flag for every csi-sidecar process, e.g. -v=5 (repeatable)
    #[argh(option)]
    sidecar_arg: Vec<String>,
    /// rounds per layout; medians are reported (default 1)
    #[argh(option, default = "1")]
    rounds: usize,
    /// timeout of each wait in seconds (default 1800)
    #[argh(option, default = "1800")]
    timeout_secs: u64,
}

/// A process of a layout: its label, program and arguments (without the
/// CSI address and kubeconfig).
struct Launch {
    name: String,
    program: PathBuf,
    args: Vec<String>,
}

/// The processes of `layout`.
fn launches(layout: &str, args: &Args) -> Result<Vec<Launch>> {
    let ours = |name: &str, modules: &[&str]| Launch {
        name: name.to_string(),
        program: sidecar_bin(),
        args: args.sidecar_arg.iter().cloned().chain(modules.iter().map(|m| m.to_string())).collect(),
    };
    match layout {
        "combined" => Ok(vec![ours("combined", &MODULES)]),
        "separate" => Ok(MODULES.iter().map(|m| ours(m, &[m])).collect()),
        "external" if args.sidecar_command.is_empty() => bail!("layout external: no --sidecar-command given"),
        "external" => args.sidecar_command.iter().map(|c| parse_command(c)).collect(),
        l => bail!("unknown layout {l:?} (combined, separate, external)"),
    }
}

/// `NAME=CMD`: CMD split at whitespace, the first word the program.
fn parse_command(spec: &str) -> Result<Launch> {
    let Some((name, cmd)) = spec.split_once('=') else { bail!("--sidecar-command {spec:?}: not NAME=CMD") };
    let mut words = cmd.split_whitespace().map(str::to_string);
    let (name, Some(program)) = (name.trim(), words.next()) else { bail!("--sidecar-command {spec:?}: no command") };
    if name.is_empty() || name.contains('/') {
        bail!("--sidecar-command {spec:?}: NAME must be a non-empty label without '/'");
    }
    Ok(Launch { name: format!("external-{name}"), program: PathBuf::from(program), args: words.collect() })
}

/// The module a request came from, by its User-Agent.
fn module_of(agent: &str) -> String {
    let agent = agent.to_ascii_lowercase();
    MODULES.iter().find(|m| agent.contains(*m)).map_or("other", |m| m).to_string()
}

/// One run's figures.
#[derive(Clone, Default)]
struct Outcome {
    wall: f64,
    /// Seconds until the provisioner's, resizer's, snapshotter's last object was done.
    done: [f64; 3],
    /// The sidecar user's requests, counted by APF.
    requests: f64,
    /// Requests by module (audit log), per operation: [provisioner, resizer, snapshotter].
    per_op: [f64; 3],
    /// Requests of no module (audit log).
    other: f64,
    /// The modules' requests other than Event writes received before the
    /// last object was done (audit log): what the wall time waited for.
    critical: f64,
    /// (process, VmHWM MiB).
    rss: Vec<(String, f64)>,
}

/// What one run needs besides the layout.
struct World {
    cp: ControlPlane,
    admin: Client,
    kubeconfig: PathBuf,
    csi: PathBuf,
    audit: AuditLog,
    driver: Proc,
}

/// A fresh control plane with snapshot-controller, the sidecar user, the
/// mock driver, the classes and the 2 × N claims (setup, not measured).
async fn world(dir: &Path, n: usize, timeout: Duration) -> Result<World> {
    let audit = AuditLog::for_user(dir, SIDECAR_USER)?;
    let mut flags = vec!["--snapshots".to_string()];
    flags.extend(audit.launcher_args.iter().cloned());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cp = ControlPlane::spawn_launcher(&try_launcher_bin()?, &flags)?;
    let admin = cp.client().await;
    let kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;
    let csi = dir.join("csi.sock");
    let driver = start_mock_driver(&csi, DRIVER, "bench-node", dir).await?;
    for ns in [NS_NEW, NS_EXPAND, NS_SNAP] {
        create_namespace(&admin, ns).await?;
    }
    let mut sc = storage_class(CLASS, DRIVER);
    sc.allow_volume_expansion = Some(true);
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;
    SnapApis::new(&admin, NS_SNAP).class(CLASS, DRIVER, "Delete", serde_json::Value::Null).await;

    let admin_kc = cp.kubeconfig().to_path_buf();
    let mut setup =
        sidecar("setup-provisioner", &csi, &admin_kc, &["provisioner".into(), "--kube-api-qps=-1".into()], dir);
    let items: Vec<(&str, usize)> = [NS_EXPAND, NS_SNAP].iter().flat_map(|ns| (0..n).map(move |i| (*ns, i))).collect();
    stream::iter(items)
        .map(|(ns, i)| {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
            async move { api.create(&PostParams::default(), &pvc(&format!("c{i}"), Some(CLASS), "1Gi")).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    for ns in [NS_EXPAND, NS_SNAP] {
        let api = Api::namespaced(admin.clone(), ns);
        wait_for(&format!("the setup claims in {ns} bound"), timeout, async || Ok(bound_claims(&api, "").await? == n))
            .await?;
    }
    setup.terminate().await;
    Ok(World { cp, admin, kubeconfig, csi, audit, driver })
}

async fn at_size(pvcs: &Api<PersistentVolumeClaim>, size: &str) -> Result<usize> {
    let list = pvcs.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|c| {
            c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|m| m.get("storage")).map(|q| q.0.as_str())
                == Some(size)
        })
        .count())
}

/// Starts the layout's processes and waits until they are ready (see the
/// file's docs).
async fn start(w: &World, layout: &str, launch: Vec<Launch>, dir: &Path, timeout: Duration) -> Result<Vec<Proc>> {
    let before = snapshot(&w.admin, None).await?.sidecar_dispatched;
    let procs: Vec<Proc> = launch
        .into_iter()
        .map(|l| {
            let mut args = l.args;
            args.push(format!("--csi-address={}", w.csi.display()));
            args.push(format!("--kubeconfig={}", w.kubeconfig.display()));
            Proc::spawn(&l.name, &l.program, &args, dir)
        })
        .collect();
    let exited = |procs: &mut [Proc]| -> Result<()> {
        for p in procs.iter_mut() {
            if p.try_exit().is_some() {
                bail!("{} (layout {layout}) exited at start; its log:\n{}", p.name(), p.logs());
            }
        }
        Ok(())
    };
    let mut procs = procs;
    if layout == "external" {
        // Started: requests, then none for 3 s.
        let (mut last, mut quiet_since) = (before, Instant::now());
        let t = Instant::now();
        loop {
            exited(&mut procs)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = snapshot(&w.admin, None).await?.sidecar_dispatched;
            if now != last {
                (last, quiet_since) = (now, Instant::now());
            } else if last > before && quiet_since.elapsed() >= Duration::from_secs(3) {
                return Ok(procs);
            }
            if t.elapsed() > timeout {
                bail!("layout external: the processes made no requests or never went quiet");
            }
        }
    }
    let t = Instant::now();
    while procs.iter().map(|p| p.logs().matches("Caches synced").count()).sum::<usize>() < MODULES.len() {
        exited(&mut procs)?;
        if t.elapsed() > timeout {
            bail!("layout {layout}: not every module's caches synced within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(procs)
}

/// The measured part: creates the work at once and waits for all of it.
async fn measure(w: &World, procs: &mut [Proc], n: usize, timeout: Duration) -> Result<Outcome> {
    let new: Api<PersistentVolumeClaim> = Api::namespaced(w.admin.clone(), NS_NEW);
    let expand: Api<PersistentVolumeClaim> = Api::namespaced(w.admin.clone(), NS_EXPAND);
    let snaps = SnapApis::new(&w.admin, NS_SNAP);
    let before = settled_snapshot(&w.admin, None).await?;
    let mark = w.audit.mark();
    let start = Instant::now();
    let start_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
    // Interleaved, so that all three kinds of work arrive together.
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    stream::iter((0..n).flat_map(|i| (0..3).map(move |k| (k, i))))
        .map(|(k, i)| {
            let (new, expand, snapshots, patch) = (new.clone(), expand.clone(), snaps.snapshots.clone(), &patch);
            async move {
                match k {
                    0 => new.create(&PostParams::default(), &pvc(&format!("n{i}"), Some(CLASS), "1Gi")).await.map(drop),
                    1 => {
                        let v = serde_json::json!({"metadata": {"name": format!("s{i}")},
                            "spec": {"volumeSnapshotClassName": CLASS,
                                     "source": {"persistentVolumeClaimName": format!("c{i}")}}});
                        snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await.map(drop)
                    }
                    _ => expand.patch(&format!("c{i}"), &PatchParams::default(), &Patch::Merge(patch)).await.map(drop),
                }
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let mut done: [Option<f64>; 3] = [None; 3];
    while done.iter().any(Option::is_none) {
        let counts = [
            bound_claims(&new, "").await?,
            at_size(&expand, "2Gi").await?,
            snaps.snapshots.list(&ListParams::default()).await?.items.iter().filter(|s| ready(s)).count(),
        ];
        let secs = start.elapsed().as_secs_f64();
        for (d, c) in done.iter_mut().zip(counts) {
            if d.is_none() && c == n {
                *d = Some(secs);
            }
        }
        if secs > timeout.as_secs_f64() {
            bail!("timed out after {timeout:?}: new claims bound, expansions, snapshots ready = {counts:?} of {n}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = done.map(|d| d.unwrap_or(f64::NAN));
    let after = settled_snapshot(&w.admin, None).await?;
    let by_module = w.audit.count_since(mark, module_of)?;
    let wall = done.iter().copied().fold(0.0, f64::max);
    let requests: Vec<_> = w.audit.requests()?.into_iter().filter(|r| r.at >= start_epoch).collect();
    let critical =
        requests.iter().filter(|r| !r.event && r.at <= start_epoch + wall && module_of(&r.program) != "other").count()
            as f64;
    // What each module's requests were (stderr: the table keeps the totals).
    let mut kinds: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &requests {
        *kinds.entry((module_of(&r.program), r.kind.clone())).or_default() += 1;
    }
    for ((module, kind), count) in &kinds {
        eprintln!("  {module}: {kind}: {count}");
    }
    let per = |m: &str| by_module.get(m).copied().unwrap_or(0.0) / n as f64;
    Ok(Outcome {
        wall,
        done,
        critical,
        requests: after.delta(&before).sidecar,
        per_op: MODULES.map(per),
        other: by_module.get("other").copied().unwrap_or(0.0),
        rss: procs.iter_mut().map(|p| (p.name().to_string(), mib(status_kib(p.pid(), "VmHWM:")))).collect(),
    })
}

/// One round of one layout on a fresh world.
async fn run_once(layout: &str, args: &Args, dir: &Path) -> Result<Outcome> {
    let timeout = Duration::from_secs(args.timeout_secs);
    std::fs::create_dir_all(dir)?;
    let mut w = world(dir, args.claims, timeout).await?;
    let mut procs = start(&w, layout, launches(layout, args)?, dir, timeout).await?;
    let out = measure(&w, &mut procs, args.claims, timeout).await;
    for p in &mut procs {
        p.terminate().await;
    }
    if w.driver.try_exit().is_some() {
        eprintln!("warning: the CSI mock driver exited during the run");
    }
    w.driver.kill();
    let cp = w.cp;
    tokio::task::spawn_blocking(move || cp.stop()).await?;
    out
}

/// The medians of the rounds' figures (the RSS per process position).
fn medians(rounds: &[Outcome]) -> Outcome {
    let m = |f: &dyn Fn(&Outcome) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let first = rounds.first().cloned().unwrap_or_default();
    Outcome {
        wall: m(&|o| o.wall),
        done: [0, 1, 2].map(|i| m(&|o| o.done[i])),
        requests: m(&|o| o.requests),
        per_op: [0, 1, 2].map(|i| m(&|o| o.per_op[i])),
        other: m(&|o| o.other),
        critical: m(&|o| o.critical),
        rss: first
            .rss
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), m(&|o| o.rss.get(i).map_or(f64::NAN, |r| r.1))))
            .collect(),
    }
}

fn report(results: &[(String, Outcome)], args: &Args) -> String {
    let mut s = format!(
        "## csi-sidecar: provisioner + resizer + snapshotter, one process or several\n\n\
         {n} new claims, {n} VolumeSnapshots and {n} expansions (1Gi to 2Gi) created at once, after 2 × {n} claims \
         were provisioned (not measured); a fresh control plane with the real snapshot-controller and a fresh CSI \
         mock driver per run; default flags (5 QPS / 10 burst per process). Requests = the sidecar user's, counted \
         by the apiserver (APF); per operation = that module's requests (audit log, by User-Agent) / {n}; \
         peak RSS = VmHWM. {} round(s) per layout{}.\n\n",
        args.rounds,
        if args.rounds > 1 { ", medians" } else { "" },
        n = args.claims,
    );
    s.push_str(
        "| layout | processes | wall | provisioner done | resizer done | snapshotter done | requests | \
         per volume / expansion / snapshot | other requests | non-event requests until done | \
         peak RSS per process | peak RSS sum |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|\n",
    );
    for (layout, o) in results {
        let rss: Vec<String> = o.rss.iter().map(|(name, r)| format!("{name} {r:.1}")).collect();
        let _ = writeln!(
            s,
            "| {layout} | {} | {:.1} s | {:.1} s | {:.1} s | {:.1} s | {:.0} | {:.2} / {:.2} / {:.2} | {:.0} | {:.0} \
             | {} MiB | {:.1} MiB |",
            o.rss.len(),
            o.wall,
            o.done[0],
            o.done[1],
            o.done[2],
            o.requests,
            o.per_op[0],
            o.per_op[1],
            o.per_op[2],
            o.other,
            o.critical,
            rss.join(", "),
            o.rss.iter().map(|r| r.1).sum::<f64>(),
        );
    }
    if let Some((_, c)) = results.iter().find(|(l, _)| l == "combined") {
        for (layout, o) in results.iter().filter(|(l, _)| l != "combined") {
            let _ = writeln!(s, "\nWall time combined / {layout}: **{:.2}**", c.wall / o.wall);
        }
        // Default flags: three modules of 5 QPS / 10 burst pooled.
        let (qps, burst) = (15.0, 30.0);
        let _ = writeln!(
            s,
            "\nToken-bucket floor of the combined run: ({:.0} non-event requests - {burst} burst) / {qps} QPS = \
             **{:.1} s**",
            c.critical,
            ((c.critical - burst) / qps).max(0.0)
        );
    }
    s
}

async fn run(args: Args) -> Result<()> {
    let mut layouts: Vec<String> =
        args.layouts.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    if !args.sidecar_command.is_empty() && !layouts.iter().any(|l| l == "external") {
        layouts.push("external".into());
    }
    for l in &layouts {
        launches(l, &args)?;
    }
    let tmp = tempfile::tempdir()?;
    let mut outcomes: BTreeMap<&str, Vec<Outcome>> = BTreeMap::new();
    for r in 0..args.rounds.max(1) {
        // Every other round in the reverse order, so no layout always goes first.
        let order: Vec<&String> = if r % 2 == 0 { layouts.iter().collect() } else { layouts.iter().rev().collect() };
        for layout in order {
            eprintln!("round {}: layout {layout}, {} of each kind ...", r + 1, args.claims);
            let o = run_once(layout, &args, &tmp.path().join(format!("r{r}-{layout}"))).await?;
            eprintln!(
                "  -> wall {:.1} s (provisioner {:.1} s, resizer {:.1} s, snapshotter {:.1} s), {:.0} requests, \
                 peak RSS {:.1} MiB",
                o.wall,
                o.done[0],
                o.done[1],
                o.done[2],
                o.requests,
                o.rss.iter().map(|r| r.1).sum::<f64>()
            );
            outcomes.entry(layout.as_str()).or_default().push(o);
        }
    }
    let results: Vec<(String, Outcome)> =
        layouts.iter().map(|l| (l.clone(), medians(outcomes.get(l.as_str()).map_or(&[][..], Vec::as_slice)))).collect();
    print!("{}", report(&results, &args));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    run(argh::from_env()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_external_command() {
        let l = parse_command("provisioner=/opt/csi-provisioner  -v=2 --timeout=30s").unwrap();
        assert_eq!(l.name, "external-provisioner");
        assert_eq!(l.program, PathBuf::from("/opt/csi-provisioner"));
        assert_eq!(l.args, ["-v=2", "--timeout=30s"]);
        assert!(parse_command("/opt/csi-provisioner").is_err());
        assert!(parse_command("x=").is_err());
        assert!(parse_command("=/bin/true").is_err());
    }

    #[test]
    fn tells_the_module_by_user_agent() {
        assert_eq!(module_of("csi-provisioner/0.1.0 (linux/amd64) csi-sidecar"), "provisioner");
        assert_eq!(module_of("csi-resizer/v1.13.0 (linux/amd64) kubernetes/$Format"), "resizer");
        assert_eq!(module_of("csi-snapshotter/0.1.0 (linux/amd64) csi-sidecar"), "snapshotter");
        assert_eq!(module_of("csi-sidecar/0.1.0 (linux/amd64) csi-sidecar"), "other");
    }
}
