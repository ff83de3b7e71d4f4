//! Benchmark of `--enable-debug-endpoints` (issue 30): how fast
//! `/debug/objects` answers with a large cache and objects waiting, and what
//! the feature costs in idle memory.
//!
//! One world, on a real control plane (etcd, kube-apiserver,
//! kube-controller-manager with the PV binder) with the CSI mock driver:
//! * `--objects` claims bound to as many CSI PVs of the driver (both
//!   statuses written by the bench, consistent, so kube-controller-manager
//!   has nothing to write): done objects, all in the process's caches (the
//!   provisioner's and attacher's view of the driver's PVs, the resizer's
//!   view of bound claims; the "Watch synced" lines give the counts);
//! * `--waiting` claims of an Immediate class of the driver whose
//!   `csi.storage.k8s.io/provisioner-secret-name` names a Secret that does
//!   not exist: each attempt fails before CreateVolume and the claim waits
//!   with `waiting_for: "secret"`.
//!
//! Then, per round, one csi-sidecar process with the feature off and one with
//! it on (same flags otherwise: `--modules` with `--http-endpoint` on a free
//! port, the provisioner with `--retry-interval-start`), one after the other
//! against the same world:
//! 1. spawn; wait until every module logged "Caches synced", then until the
//!    waiting-object gauge `csi_sidecar_objects_waiting{module="provisioner",
//!    waiting_for="secret"}` (served with the feature off too) shows every
//!    waiting claim, then until the sidecar's user (its own APF FlowSchema,
//!    see `bench.rs`) made no request for 3 s;
//! 2. idle RSS: `--samples` readings of VmRSS one second apart, their median,
//!    the sidecar's requests meanwhile (0: idle) and the other clients'
//!    writes other than Events (kube-controller-manager reports each pending
//!    claim every 15 s; nothing in the sidecar watches Events);
//! 3. feature on: wait until `/debug/objects` reports `matching` equal to
//!    the waiting claims, then `--requests` GETs of the default page and
//!    as many of one filtered query (`?namespace=..&name=..`, one object), in
//!    turn on one keep-alive connection, each answer checked (200, JSON,
//!    `matching`); their latency median, p99 and max; the RSS after them;
//!    feature off: `/debug/objects` must answer 404;
//! 4. peak RSS (VmHWM), SIGTERM.
//!
//! Odd rounds run the feature off first, even ones on first. The report
//! gives per round the idle RSS of each, their difference, the medians over
//! the rounds, the RSS the GETs added, the latency table and the load
//! average while measuring. A benchmark reports, it asserts no timing: it exits non-zero
//! only when the world cannot be set up or a process misbehaves.
//!
//! `--retry-interval-start` defaults to 5m (upstream's 1s is the
//! provisioner's default): each waiting claim fails once and then waits, so
//! the process is idle while its memory is read. With 1s the 100 claims
//! retry at 1, 2, 4, ... s and their Secret reads and Warning events keep a
//! 5-QPS client busy for minutes.
//!
//! ```text
//! cargo build --release -p csi-sidecar -p csi-sidecar-integration \
//!   --bin csi-sidecar --bin cluster --bin bench-debug
//! target/release/bench-debug --rounds 3
//! ```

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{create_namespace, median, mib, parse_metrics, sidecar, sidecar_kubeconfig, snapshot, start_mock_driver},
    cluster::ControlPlane,
    free_port, http,
    kube_support::{csi_pv, pvc, storage_class},
    process::{Proc, status_kib},
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};

const DRIVER: &str = "bench-debug.csi.example.com";
/// The done claims (bound to the PVs).
const NS_DONE: &str = "bench-debug-done";
/// The waiting claims.
const NS_WAITING: &str = "bench-debug-waiting";
/// The class whose provisioner secret is missing.
const CLASS_SECRET: &str = "bench-debug-missing-secret";
/// The Secret the class names (never created).
const MISSING_SECRET: &str = "bench-debug-missing";

/// csi-sidecar benchmark: /debug/objects latency and the idle memory of --enable-debug-endpoints.
#[derive(FromArgs)]
struct Args {
    /// bound claims and their PVs in the caches (default 10000)
    #[argh(option, default = "10_000")]
    objects: usize,
    /// claims waiting for the missing secret (default 100)
    #[argh(option, default = "100")]
    waiting: usize,
    /// GETs per query (default 200)
    #[argh(option, default = "200")]
    requests: usize,
    /// rounds of (feature off, feature on); medians over them (default 2)
    #[argh(option, default = "2")]
    rounds: usize,
    /// readings of VmRSS per idle measurement, one second apart (default 5)
    #[argh(option, default = "5")]
    samples: usize,
    /// the modules of the process, comma-separated (default "provisioner,attacher,resizer")
    #[argh(option, default = "String::from(\"provisioner,attacher,resizer\")")]
    modules: String,
    /// the provisioner's --retry-interval-start (default 5m: see the file's docs)
    #[argh(option, default = "String::from(\"5m\")")]
    retry_interval_start: String,
    /// concurrent creators while setting up the world (default 32)
    #[argh(option, default = "32")]
    creators: usize,
    /// an extra flag for the process before the modules, e.g. -v=2 (repeatable)
    #[argh(option)]
    sidecar_arg: Vec<String>,
    /// timeout of each wait in seconds (default 600)
    #[argh(option, default = "600")]
    timeout_secs: u64,
    /// keep the logs in this directory (default: a temporary directory)
    #[argh(option)]
    log_dir: Option<PathBuf>,
}

/// Latency figures of one query, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

/// The value at fraction `p` of `sorted` (nearest rank; 0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Latency {
        ms.sort_by(f64::total_cmp);
        Latency { p50: median(&ms), p99: percentile(&ms, 0.99), max: ms.last().copied().unwrap_or(0.0) }
    }
}

/// The provisioner's claims waiting for a secret, from the `/metrics` text
/// (`None`: the series is not there).
fn waiting_for_secret(metrics: &str) -> Option<f64> {
    parse_metrics(metrics, &["csi_sidecar_objects_waiting"])
        .iter()
        .find(|s| s.label("module") == "provisioner" && s.label("waiting_for") == "secret")
        .map(|s| s.value)
}

/// One query's measurement.
struct Measured {
    label: String,
    latency: Latency,
    body_bytes: usize,
}

/// One process's figures.
struct Run {
    debug: bool,
    /// Spawn → every module's "Caches synced".
    synced_s: f64,
    /// Spawn → every waiting claim counted by the gauge.
    waiting_s: f64,
    /// VmRSS readings while idle, MiB.
    rss: Vec<f64>,
    /// The sidecar user's requests while they were read.
    requests_while_sampled: f64,
    /// Writes of every client (POST, PUT, PATCH, DELETE) meanwhile.
    writes_while_sampled: f64,
    /// VmRSS after the debug requests (feature on), MiB.
    rss_after: Option<f64>,
    /// VmHWM at the end, MiB.
    hwm: f64,
    measured: Vec<Measured>,
    /// `not_done` per module, from the first default page.
    not_done: Vec<String>,
    /// The "Watch synced" lines' fields.
    watches: Vec<String>,
    /// /proc/loadavg while measuring.
    load: String,
}

/// The world's fixed parts.
struct World {
    admin: Client,
    kubeconfig: PathBuf,
    csi: PathBuf,
    dir: PathBuf,
    /// Seconds to create the done objects.
    create_s: f64,
}

/// `n` claims bound to `n` CSI PVs of the driver, statuses consistent.
async fn create_done(admin: &Client, n: usize, creators: usize) -> Result<()> {
    create_namespace(admin, NS_DONE).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS_DONE);
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let done = std::sync::atomic::AtomicUsize::new(0);
    stream::iter(0..n)
        .map(|i| {
            let (pvcs, pvs, done) = (pvcs.clone(), pvs.clone(), &done);
            async move {
                let (claim, volume) = (format!("c{i:05}"), format!("{NS_DONE}-pv-{i:05}"));
                let mut c = pvc(&claim, Some(""), "1Mi");
                // As the PV binder leaves a bound claim: without the
                // annotation it adds it, one write per claim at its 20 QPS.
                c.metadata.annotations =
                    Some([("pv.kubernetes.io/bind-completed".to_string(), "yes".to_string())].into());
                if let Some(spec) = c.spec.as_mut() {
                    spec.volume_name = Some(volume.clone());
                }
                let created = pvcs.create(&PostParams::default(), &c).await.context("create a claim")?;
                let mut pv = csi_pv(&volume, DRIVER, &format!("vol-{i:05}"), "1Mi");
                if let Some(spec) = pv.spec.as_mut() {
                    spec.claim_ref = Some(ObjectReference {
                        kind: Some("PersistentVolumeClaim".into()),
                        namespace: Some(NS_DONE.into()),
                        name: Some(claim.clone()),
                        uid: created.metadata.uid.clone(),
                        ..Default::default()
                    });
                }
                pvs.create(&PostParams::default(), &pv).await.context("create a PV")?;
                let bound = serde_json::json!({"status": {"phase": "Bound"}});
                pvs.patch_status(&volume, &PatchParams::default(), &Patch::Merge(&bound)).await?;
                let claim_bound = serde_json::json!({"status": {"phase": "Bound",
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"}}});
                pvcs.patch_status(&claim, &PatchParams::default(), &Patch::Merge(&claim_bound)).await?;
                let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if d % 2000 == 0 {
                    eprintln!("  {d}/{n} bound claims and PVs");
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(creators.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// The class naming the missing secret and `n` claims of it.
async fn create_waiting(admin: &Client, n: usize) -> Result<()> {
    create_namespace(admin, NS_WAITING).await?;
    let mut sc = storage_class(CLASS_SECRET, DRIVER);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name".to_string(), MISSING_SECRET.to_string()),
            ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), NS_WAITING.to_string()),
        ]
        .into(),
    );
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS_WAITING);
    stream::iter(0..n)
        .map(|i| {
            let pvcs = pvcs.clone();
            async move { pvcs.create(&PostParams::default(), &pvc(&waiting_name(i), Some(CLASS_SECRET), "1Mi")).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

fn waiting_name(i: usize) -> String {
    format!("w{i:04}")
}

/// Polls `probe` every 200 ms until it says true; `proc` exiting or the
/// timeout ends the benchmark.
async fn wait_while_alive(
    proc: &mut Proc,
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    while !probe().await? {
        if let Some(status) = proc.try_exit() {
            bail!("{} exited ({status}) while waiting for {what}; log:\n{}", proc.name(), proc.logs());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `--requests` GETs of `path` on one keep-alive connection; each answer
/// must be 200 with `matching` = `want`.
async fn measure(addr: &str, label: &str, path: &str, n: usize, want: usize) -> Result<Measured> {
    let mut conn = http::KeepAlive::connect(addr).await?;
    let mut ms = Vec::with_capacity(n);
    let mut body_bytes = 0;
    for _ in 0..n {
        let t = Instant::now();
        let reply = conn.get(path).await.map_err(|e| anyhow::anyhow!("GET {path}: {e}"))?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if reply.status != 200 {
            bail!("GET {path}: {} {}", reply.status, reply.body);
        }
        let page: serde_json::Value = serde_json::from_str(&reply.body).with_context(|| format!("GET {path}"))?;
        if page["matching"].as_u64() != Some(want as u64) {
            bail!("GET {path}: matching {} (want {want})", page["matching"]);
        }
        body_bytes = reply.body.len();
    }
    Ok(Measured { label: label.to_string(), latency: Latency::of(ms), body_bytes })
}

/// VmRSS (MiB) of `pid` `n` times, one second apart.
async fn sample_rss(pid: u32, n: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        v.push(mib(status_kib(pid, "VmRSS:")));
    }
    v
}

/// The write requests among `requests` ("VERB resource code": count),
/// Events left out (kube-controller-manager's PV binder reports each
/// pending claim every resync; no module of the sidecar watches Events).
fn writes(requests: &[(String, f64)]) -> f64 {
    let write = |k: &str| {
        ["POST ", "PUT ", "PATCH ", "DELETE "].iter().any(|v| k.starts_with(v))
            && k.split_whitespace().nth(1) != Some("events")
    };
    requests.iter().filter(|(k, _)| write(k)).map(|(_, n)| n).sum::<f64>() + 0.0 // not -0.0 (an empty sum)
}

/// The fields of each kind's last "Watch synced" line (a kind relists when
/// a module starting later adds a view to it).
fn last_synced(log: &str) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for fields in log.lines().filter_map(|l| l.split_once("Watch synced")).map(|(_, f)| f.trim()) {
        let kind = fields.split_whitespace().next().unwrap_or_default().to_string();
        match out.iter_mut().find(|(k, _)| *k == kind) {
            Some(e) => e.1 = fields.to_string(),
            None => out.push((kind, fields.to_string())),
        }
    }
    out.into_iter().map(|(_, f)| f).collect()
}

/// One process of the world, the feature `debug` on or off.
async fn run_once(w: &World, args: &Args, debug: bool, round: usize) -> Result<Run> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let addr = format!("127.0.0.1:{}", free_port());
    let modules: Vec<&str> = args.modules.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    let mut flags = vec![format!("--http-endpoint={addr}")];
    if debug {
        flags.push("--enable-debug-endpoints".into());
    }
    flags.extend(args.sidecar_arg.iter().cloned());
    for m in &modules {
        flags.push((*m).to_string());
        if *m == "provisioner" {
            flags.push(format!("--retry-interval-start={}", args.retry_interval_start));
        }
    }
    let name = format!("sidecar-{}-{round}", if debug { "on" } else { "off" });
    let log = w.dir.join(format!("{name}.log"));
    let _ = std::fs::remove_file(&log);
    let spawned = Instant::now();
    let mut p = sidecar(&name, &w.csi, &w.kubeconfig, &flags, &w.dir);
    let pid = p.pid();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    wait_while_alive(&mut p, "every module's caches", timeout, async || {
        Ok(read_log().matches("Caches synced").count() >= modules.len())
    })
    .await?;
    let synced_s = spawned.elapsed().as_secs_f64();
    let want = args.waiting;
    wait_while_alive(&mut p, "the waiting-object gauge", timeout, async || {
        let m = http::get(&addr, "/metrics").await.map_err(|e| anyhow::anyhow!("GET /metrics: {e}"))?;
        Ok(waiting_for_secret(&m.body) == Some(want as f64))
    })
    .await?;
    let waiting_s = spawned.elapsed().as_secs_f64();
    // Idle: the sidecar's user made no request for 3 s.
    let mut quiet_since = (snapshot(&w.admin, None).await?.sidecar_dispatched, Instant::now());
    wait_while_alive(&mut p, "the sidecar to be idle (no request for 3 s)", timeout, async || {
        let n = snapshot(&w.admin, None).await?.sidecar_dispatched;
        if n != quiet_since.0 {
            quiet_since = (n, Instant::now());
        }
        Ok(quiet_since.1.elapsed() >= Duration::from_secs(3))
    })
    .await?;
    let before = snapshot(&w.admin, None).await?;
    let rss = sample_rss(pid, args.samples.max(1)).await;
    let sampled = snapshot(&w.admin, None).await?.delta(&before);
    let requests_while_sampled = sampled.sidecar;
    let writes_while_sampled = writes(&sampled.requests);

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    let mut measured = Vec::new();
    let mut not_done = Vec::new();
    let mut rss_after = None;
    if debug {
        let mut first: Option<serde_json::Value> = None;
        wait_while_alive(&mut p, "/debug/objects to report every waiting claim", timeout, async || {
            let r = http::get(&addr, "/debug/objects").await.map_err(|e| anyhow::anyhow!("GET /debug/objects: {e}"))?;
            if r.status != 200 {
                bail!("GET /debug/objects: {} {}", r.status, r.body);
            }
            let page: serde_json::Value = serde_json::from_str(&r.body)?;
            let ok = page["matching"].as_u64() == Some(want as u64);
            first = Some(page);
            Ok(ok)
        })
        .await?;
        let page = first.unwrap_or_default();
        let objects = page["objects"].as_array().cloned().unwrap_or_default();
        let secret = objects.iter().filter(|o| o["waiting_for"] == "secret").count();
        if secret != want.min(500) {
            bail!("/debug/objects: {secret} of {} objects wait for the secret (want {want})", objects.len());
        }
        for m in page["modules"].as_array().into_iter().flatten() {
            not_done.push(format!("{} {}", m["module"].as_str().unwrap_or("?"), m["not_done"]));
        }
        let target = waiting_name(want / 2);
        let filtered = format!("/debug/objects?namespace={NS_WAITING}&name={target}");
        measured.push(measure(&addr, "default page", "/debug/objects", args.requests, want).await?);
        measured.push(measure(&addr, "filtered: one claim", &filtered, args.requests, 1).await?);
        rss_after = Some(mib(status_kib(pid, "VmRSS:")));
    } else {
        let r = http::get(&addr, "/debug/objects").await.map_err(|e| anyhow::anyhow!("GET /debug/objects: {e}"))?;
        if r.status != 404 {
            bail!("feature off: GET /debug/objects answered {} (want 404)", r.status);
        }
    }
    let hwm = mib(status_kib(pid, "VmHWM:"));
    let watches = last_synced(&read_log());
    if let Some(status) = p.try_exit() {
        bail!("{name} exited ({status}) during the measurement; log:\n{}", p.logs());
    }
    let status = p.terminate().await;
    if !status.success() {
        eprintln!("  warning: {name} exited with {status} after SIGTERM");
    }
    Ok(Run {
        debug,
        synced_s,
        waiting_s,
        rss,
        requests_while_sampled,
        writes_while_sampled,
        rss_after,
        hwm,
        measured,
        not_done,
        watches,
        load,
    })
}

/// The world: control plane, sidecar identity, mock driver, the done and
/// the waiting objects.
async fn world(cp: &ControlPlane, args: &Args, dir: &Path) -> Result<(World, Proc)> {
    let admin = cp.client().await;
    let kubeconfig = sidecar_kubeconfig(cp, &admin).await?;
    let csi = dir.join("csi.sock");
    let driver = start_mock_driver(&csi, DRIVER, "bench-node", dir).await?;
    eprintln!("creating {} bound claims and PVs ...", args.objects);
    let t = Instant::now();
    create_done(&admin, args.objects, args.creators).await?;
    let create_s = t.elapsed().as_secs_f64();
    eprintln!("  done in {create_s:.0} s; {} claims waiting for a missing secret ...", args.waiting);
    create_waiting(&admin, args.waiting).await?;
    // kube-controller-manager hands each waiting claim to the driver (the
    // storage-provisioner annotation) before a sidecar starts.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS_WAITING);
    let timeout = Duration::from_secs(args.timeout_secs);
    let start = Instant::now();
    loop {
        let list = pvcs.list(&ListParams::default()).await?;
        let annotated = list
            .items
            .iter()
            .filter(|c| {
                c.metadata.annotations.as_ref().and_then(|a| a.get("volume.kubernetes.io/storage-provisioner"))
                    == Some(&DRIVER.to_string())
            })
            .count();
        if annotated == args.waiting {
            break;
        }
        if start.elapsed() > timeout {
            bail!("kube-controller-manager annotated {annotated} of {} waiting claims", args.waiting);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((World { admin, kubeconfig, csi, dir: dir.to_path_buf(), create_s }, driver))
}

fn report(args: &Args, w: &World, runs: &[Run]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## /debug/objects: latency and idle memory (bench-debug)\n");
    let _ = writeln!(
        out,
        "csi-sidecar `{}` (provisioner `--retry-interval-start={}`), CSI mock driver; {} claims bound to {} CSI PVs \
         of the driver (created in {:.0} s), {} claims waiting for a missing provisioner secret; {} round(s) of \
         (feature off, feature on).\n",
        args.modules.replace(',', " "),
        args.retry_interval_start,
        args.objects,
        args.objects,
        w.create_s,
        args.waiting,
        args.rounds
    );
    out.push_str(
        "| round | feature | caches synced (s) | all waiting (s) | idle RSS median (MiB) | readings (MiB) | sidecar \
         requests / non-Event writes of all clients while read | RSS after the GETs (MiB) | peak RSS (MiB) |\n|---|---|---:|---:|---:|---|---|---:|---:|\n",
    );
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.1} | {:.2} | {} | {} / {} | {} | {:.2} |",
            i / 2 + 1,
            if r.debug { "on" } else { "off" },
            r.synced_s,
            r.waiting_s,
            median(&r.rss),
            r.rss.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" "),
            r.requests_while_sampled,
            r.writes_while_sampled,
            r.rss_after.map_or("".into(), |x| format!("{x:.2}")),
            r.hwm
        );
    }
    let of = |debug: bool, f: &dyn Fn(&Run) -> f64| -> f64 {
        median(&runs.iter().filter(|r| r.debug == debug).map(f).collect::<Vec<_>>())
    };
    let idle = |r: &Run| median(&r.rss);
    let (off, on) = (of(false, &idle), of(true, &idle));
    let diffs: Vec<f64> = runs
        .chunks(2)
        .filter_map(|c| {
            let on = c.iter().find(|r| r.debug)?;
            let off = c.iter().find(|r| !r.debug)?;
            Some(idle(on) - idle(off))
        })
        .collect();
    let spread = |debug: bool| {
        let v: Vec<f64> = runs.iter().filter(|r| r.debug == debug).map(idle).collect();
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        format!("{min:.2} to {:.2}", v.iter().copied().fold(0.0, f64::max))
    };
    let serving: Vec<f64> = runs.iter().filter_map(|r| Some(r.rss_after? - idle(r))).collect();
    let _ = writeln!(
        out,
        "\nIdle RSS, median over the rounds: off **{off:.2} MiB**, on **{on:.2} MiB**, on − off **{:+.2} MiB** \
         (per round: {}; median {:+.2}); runs off {} MiB, on {} MiB; peak RSS off {:.2} / on {:.2} MiB (target: \
         on − off < 1 MiB). The GETs added {} MiB to the RSS of the process serving them (median {:+.2}).\n",
        on - off,
        diffs.iter().map(|d| format!("{d:+.2}")).collect::<Vec<_>>().join(", "),
        median(&diffs),
        spread(false),
        spread(true),
        of(false, &|r| r.hwm),
        of(true, &|r| r.hwm),
        serving.iter().map(|d| format!("{d:+.2}")).collect::<Vec<_>>().join(", "),
        median(&serving),
    );
    out.push_str(
        "| query | GETs per round | body (bytes) | median (ms) | p99 (ms) | max (ms) | load average then |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
    );
    for r in runs.iter().filter(|r| r.debug) {
        for m in &r.measured {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
                m.label, args.requests, m.body_bytes, m.latency.p50, m.latency.p99, m.latency.max, r.load
            );
        }
    }
    let all = |label: &str, f: fn(&Latency) -> f64| {
        let v: Vec<f64> =
            runs.iter().flat_map(|r| r.measured.iter()).filter(|m| m.label == label).map(|m| f(&m.latency)).collect();
        (median(&v), v.iter().copied().fold(0.0, f64::max))
    };
    for label in ["default page", "filtered: one claim"] {
        let ((p50, _), (p99, _), (_, max)) = (all(label, |l| l.p50), all(label, |l| l.p99), all(label, |l| l.max));
        let _ = writeln!(
            out,
            "\n{label}: median of the rounds' medians **{p50:.2} ms**, of their p99 {p99:.2} ms, max of all {max:.2} ms \
             (target: < 50 ms)."
        );
    }
    if let Some(r) = runs.iter().find(|r| r.debug) {
        let _ = writeln!(out, "\nnot_done per module: {}.", r.not_done.join(", "));
    }
    if let Some(r) = runs.first() {
        let _ = writeln!(out, "Caches (\"Watch synced\"): {}.", r.watches.join("; "));
    }
    out
}

async fn run(args: Args) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = match &args.log_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let (w, mut driver) = world(&cp, &args, &dir).await?;
    let mut runs = Vec::new();
    for round in 1..=args.rounds.max(1) {
        // Odd rounds start with the feature off, even ones with it on.
        let order = if round % 2 == 1 { [false, true] } else { [true, false] };
        for debug in order {
            eprintln!("round {round}: feature {} ...", if debug { "on" } else { "off" });
            let r = run_once(&w, &args, debug, round).await?;
            eprintln!(
                "  idle RSS {:.2} MiB, peak {:.2} MiB{}",
                median(&r.rss),
                r.hwm,
                r.measured
                    .iter()
                    .map(|m| format!("; {}: p50 {:.2} ms, p99 {:.2} ms", m.label, m.latency.p50, m.latency.p99))
                    .collect::<String>()
            );
            runs.push(r);
        }
    }
    if driver.try_exit().is_some() {
        bail!("the CSI mock driver exited during the run; log:\n{}", driver.logs());
    }
    println!("{}", report(&args, &w, &runs));
    if args.log_dir.is_some() {
        eprintln!("logs kept in {}", dir.display());
    }
    driver.kill();
    cp.stop();
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = argh::from_env();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Children are killed by the destructors of a finished `run`; SIGINT/SIGTERM end
    // it early the same way.
    tokio::select! {
        r = run(args) => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        _ = sigterm.recv() => bail!("terminated"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 198.0);
        assert_eq!(percentile(&v, 1.0), 200.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let l = Latency::of(vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(l, Latency { p50: 3.0, p99: 5.0, max: 5.0 });
    }

    #[test]
    fn each_kind_keeps_its_last_synced_line() {
        let log = "t INFO Watch synced kind=PersistentVolume objects=200\n\
                   t INFO Watch synced kind=PersistentVolumeClaim objects=200\n\
                   t INFO Caches synced; resizing\n\
                   t INFO Watch synced kind=PersistentVolumeClaim objects=210\n";
        assert_eq!(last_synced(log), ["kind=PersistentVolume objects=200", "kind=PersistentVolumeClaim objects=210"]);
    }

    #[test]
    fn writes_are_counted_by_verb() {
        let r = [
            ("GET persistentvolumes 200".to_string(), 5.0),
            ("PATCH events 200".to_string(), 2.0),
            ("PUT persistentvolumeclaims 409".to_string(), 1.0),
            ("WATCH pods 200".to_string(), 1.0),
        ];
        assert_eq!(writes(&r), 1.0);
    }

    #[test]
    fn the_secret_gauge_is_read_for_the_provisioner_only() {
        let text = "# TYPE csi_sidecar_objects_waiting gauge\n\
                    csi_sidecar_objects_waiting{module=\"provisioner\",waiting_for=\"retry\"} 3\n\
                    csi_sidecar_objects_waiting{module=\"resizer\",waiting_for=\"secret\"} 7\n\
                    csi_sidecar_objects_waiting{module=\"provisioner\",waiting_for=\"secret\"} 100\n";
        assert_eq!(waiting_for_secret(text), Some(100.0));
        assert_eq!(waiting_for_secret("other 1\n"), None);
    }
}
