//! Benchmark of the `provisioner` module against a real control plane
//! (etcd, kube-apiserver, kube-controller-manager with the PV binder) and the
//! real CSI mock driver.
//!
//! Per scenario (PVC count × client QPS setting) a fresh csi-sidecar
//! provisioner process is started; the bench creates a StorageClass and N PVCs
//! (1Mi, ReadWriteOnce, Immediate binding) in a fresh namespace with several
//! concurrent creators and measures, from the first create:
//!
//! * when every PVC has a PV (the sidecar's own throughput),
//! * per claim, the time from kube-controller-manager setting the provisioner
//!   annotation (`volume.kubernetes.io/storage-provisioner`) to its PV (the
//!   sidecar's own latency; at unlimited QPS the whole-run time is bounded by
//!   kube-controller-manager, this is not), p50/p95/max, from the arrival of
//!   the watch events,
//! * when every PVC is `Bound` (the sidecar plus kube-controller-manager's binder),
//! * the API requests the sidecar made, per volume, counted by the apiserver,
//! * the events the sidecar wrote: `Provisioning` and `ProvisioningSucceeded`
//!   of its component (`--event-component`), counts summed, against one each
//!   per claim, read once the sidecar is quiet (waiting up to `--event-wait-secs`
//!   for deferred ones),
//! * the sidecar's peak RSS (VmHWM) and its RSS at the end,
//!
//! then deletes the PVCs and measures until every PV is gone, with the
//! sidecar's requests per deleted volume and the 409/422 answers to PV writes
//! (all clients minus kube-controller-manager's). Then the idle memory with a
//! large cache: `--cache-objects` PVCs and PVs, a fresh sidecar, its RSS 5 s
//! after "Caches synced", the time from its spawn to each `Watch synced
//! kind=...` log line and the LIST requests until it was ready. Last, with
//! `--failover`: two replicas with 4 s leases and those objects in the cluster;
//! the leader (the Lease's holder) is SIGKILLed, a claim is created right after,
//! and the time from the kill to its PV is reported (`--failover-rounds`, median).
//!
//! Another provisioner: `--sidecar-command "PROGRAM [ARGS...]"` (split at
//! whitespace) runs instead of `csi-sidecar provisioner`; the bench appends
//! `--csi-address=SOCKET --kubeconfig=FILE`, the QPS flags (none for
//! "default", `--kube-api-qps=-1`, or `--kube-api-qps=Q --kube-api-burst=2Q`),
//! in failover mode `--leader-election --leader-election-namespace=NS
//! --leader-election-lease-duration=4s --leader-election-renew-deadline=3s
//! --leader-election-retry-period=1s`, then every `--sidecar-arg`. It is ready
//! when its log shows `--ready-log` (default "Started provisioner controller";
//! csi-sidecar: "Caches synced"); RSS is read from the spawned process. Two
//! replicas of it on one machine need distinct leader-election identities.
//!
//! Request accounting: `apiserver_request_total` has no user label, so the
//! sidecar runs under its own minted identity (user `csi-sidecar-bench`, bound to
//! `cluster-admin`) and the bench creates an API Priority and Fairness FlowSchema
//! matching only that user; the apiserver's
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema="csi-sidecar-bench"}`
//! then counts exactly the sidecar's requests. The per-verb breakdown comes from
//! `apiserver_request_total` (all clients; the bench itself only creates PVCs and
//! holds two watches).
//!
//! Run with a release build (the bench finds `csi-sidecar` and `cluster` next to
//! itself):
//!
//! ```text
//! cargo build --release --workspace && target/release/bench-provisioner --sizes 20 --cache-objects 500
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{Delta, Qps, kcm_client, median, mib, settled_snapshot, sidecar_kubeconfig, snapshot, start_mock_driver},
    cluster::ControlPlane,
    kube_support::{csi_pv, pvc, storage_class, unique_name},
    process::Proc,
    process::status_kib,
    sidecar_bin,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use nix::sys::signal::Signal;
use serde::de::DeserializeOwned;

const DRIVER: &str = "bench.csi.example.com";
const OTHER_DRIVER: &str = "other.csi.example.com";
/// Set on a PVC by kube-controller-manager's PV binder; the provisioner acts only on PVCs carrying it.
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// csi-sidecar provisioner benchmark against a real control plane.
#[derive(FromArgs)]
struct Args {
    /// comma-separated PVC counts per scenario (default "100,1000")
    #[argh(option, default = "String::from(\"100,1000\")")]
    sizes: String,
    /// comma-separated client QPS settings: "default" (no flag: qps 5, burst 10),
    /// "unlimited" (--kube-api-qps=-1) or a number Q (--kube-api-qps=Q
    /// --kube-api-burst=2Q) (default "default,unlimited")
    #[argh(option, default = "String::from(\"default,unlimited\")")]
    qps: String,
    /// scenarios to leave out, as SIZE/QPS (e.g. 1000/default); repeatable
    #[argh(option)]
    skip: Vec<String>,
    /// PVCs and PVs in the cache for the idle-memory measurement (default 10000; 0 skips it)
    #[argh(option, default = "10_000")]
    cache_objects: usize,
    /// whose objects fill the idle cache: "own" (the sidecar's driver: PVCs
    /// annotated for it and pre-bound, CSI PVs of it; every one is cached) or
    /// "other" (another driver's: filtered out) (default "own")
    #[argh(option, default = "String::from(\"own\")")]
    cache_driver: String,
    /// the idle cache's PVCs (own driver only): "bound" (spec.volumeName set:
    /// the steady state of a cluster) or "pending" (a WaitForFirstConsumer
    /// class of the driver and no selected node: waiting for a pod) (default "bound")
    #[argh(option, default = "String::from(\"bound\")")]
    cache_pvcs: String,
    /// concurrent creators (default 16)
    #[argh(option, default = "16")]
    creators: usize,
    /// runs per scenario; the table shows medians (default 1)
    #[argh(option, default = "1")]
    runs: usize,
    /// timeout of each phase (provisioning, deletion) in seconds (default 1200)
    #[argh(option, default = "1200")]
    timeout_secs: u64,
    /// extra flag for the sidecar after `provisioner` (e.g. -v=2); repeatable
    #[argh(option)]
    sidecar_arg: Vec<String>,
    /// keep the sidecar and driver logs in this directory (default: a temporary directory)
    #[argh(option)]
    log_dir: Option<PathBuf>,
    /// run this provisioner instead of `csi-sidecar provisioner`: "PROGRAM
    /// [ARGS...]", split at whitespace (no quoting). The bench appends
    /// --csi-address=SOCKET --kubeconfig=FILE, the scenario's QPS flags (none,
    /// --kube-api-qps=-1, or --kube-api-qps=Q --kube-api-burst=2Q), in failover
    /// mode --leader-election --leader-election-namespace=NS
    /// --leader-election-lease-duration=4s --leader-election-renew-deadline=3s
    /// --leader-election-retry-period=1s, then every --sidecar-arg
    #[argh(option)]
    sidecar_command: Option<String>,
    /// log text that shows the provisioner is ready to provision (default
    /// "Caches synced" for csi-sidecar, "Started provisioner controller" for a
    /// --sidecar-command)
    #[argh(option)]
    ready_log: Option<String>,
    /// the source (or reporting) component of the provisioner's events; a
    /// value ending in "_" is a prefix (default "bench.csi.example.com_": the
    /// provisioner's identity `<driver>_<host>_<uuid>`, as upstream's)
    #[argh(option, default = "format!(\"{DRIVER}_\")")]
    event_component: String,
    /// how long to wait for deferred events after provisioning, in seconds (default 60)
    #[argh(option, default = "60")]
    event_wait_secs: u64,
    /// failover: with the --cache-objects PVCs and PVs in the cluster, two
    /// replicas with 4 s leases; SIGKILL the leader, create a claim, time the
    /// kill → its PV; --failover-rounds times
    #[argh(switch)]
    failover: bool,
    /// rounds of the failover measurement (default 3)
    #[argh(option, default = "3")]
    failover_rounds: usize,
}

// ---------------------------------------------------------------------------
// The sidecar
// ---------------------------------------------------------------------------

struct Env {
    cp: ControlPlane,
    admin: Client,
    kcm: Option<Client>,
    sidecar_kubeconfig: PathBuf,
    csi_sock: PathBuf,
    log_dir: PathBuf,
    /// What runs as the provisioner: the program and its first arguments.
    command: Command,
    args: Args,
}

/// The provisioner's program, the arguments before the bench's flags, and the
/// log text that shows it is ready.
struct Command {
    program: PathBuf,
    args: Vec<String>,
    ready_log: String,
    label: String,
}

impl Command {
    /// csi-sidecar's provisioner, or `--sidecar-command` split at whitespace.
    fn resolve(
        sidecar_command: Option<&str>,
        ready_log: Option<&str>,
        sidecar: impl FnOnce() -> PathBuf,
    ) -> Result<Self> {
        match sidecar_command {
            None => {
                let program = sidecar();
                Ok(Command {
                    label: format!("{} provisioner", program.display()),
                    program,
                    args: vec!["provisioner".into()],
                    ready_log: ready_log.unwrap_or("Caches synced").into(),
                })
            }
            Some(cmd) => {
                let mut words = cmd.split_whitespace().map(String::from);
                let program = words.next().ok_or_else(|| anyhow!("--sidecar-command is empty"))?;
                Ok(Command {
                    label: cmd.trim().to_string(),
                    program: PathBuf::from(program),
                    args: words.collect(),
                    ready_log: ready_log.unwrap_or("Started provisioner controller").into(),
                })
            }
        }
    }
}

struct Sidecar {
    proc: Proc,
    log: PathBuf,
    synced_after: Duration,
    /// Per kind, when the log said "Watch synced kind=KIND" (since the spawn).
    watch_synced: BTreeMap<String, Duration>,
}

/// The kinds of the `Watch synced kind=KIND` lines of a csi-sidecar log.
fn watch_synced_kinds(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("Watch synced"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("kind=")))
        .map(|k| k.trim_matches('"').to_string())
        .collect()
}

impl Env {
    /// The provisioner's arguments: the command's own, the bench's, `extra`, then `--sidecar-arg`s.
    fn provisioner_args(&self, qps: &Qps, extra: &[String]) -> Vec<String> {
        let mut args = self.command.args.clone();
        args.push(format!("--csi-address={}", self.csi_sock.display()));
        args.push(format!("--kubeconfig={}", self.sidecar_kubeconfig.display()));
        args.extend(qps.flags());
        args.extend(extra.iter().cloned());
        args.extend(self.args.sidecar_arg.iter().cloned());
        args
    }

    /// Spawns a provisioner with a fresh log file; returns it and its log's path.
    fn spawn_provisioner(&self, name: &str, qps: &Qps, extra: &[String]) -> (Proc, PathBuf) {
        let log = self.log_dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&log);
        let proc = Proc::spawn(name, &self.command.program, &self.provisioner_args(qps, extra), &self.log_dir);
        (proc, log)
    }

    /// Starts a provisioner and waits until it logs the ready text.
    async fn start_sidecar(&self, name: &str, qps: &Qps) -> Result<Sidecar> {
        let t = Instant::now();
        let (mut proc, log) = self.spawn_provisioner(name, qps, &[]);
        let mut watch_synced = BTreeMap::new();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            for kind in watch_synced_kinds(&text) {
                watch_synced.entry(kind).or_insert_with(|| t.elapsed());
            }
            if text.contains(&self.command.ready_log) {
                break;
            }
            if let Some(status) = proc.try_exit() {
                bail!("provisioner {name} exited ({status}) before it was ready; log:\n{}", proc.logs());
            }
            if t.elapsed() > Duration::from_secs(600) {
                bail!("provisioner {name}: no {:?} within 600 s; log:\n{}", self.command.ready_log, proc.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Sidecar { proc, log, synced_after: t.elapsed(), watch_synced })
    }
}

impl Sidecar {
    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGTERM; how it ended.
    async fn stop(mut self) -> String {
        let t = Instant::now();
        self.proc.signal(Signal::SIGTERM);
        match self.proc.wait_exit(Duration::from_secs(10)).await {
            Some(s) if s.success() => format!("exited 0 in {} ms after SIGTERM", t.elapsed().as_millis()),
            Some(s) => format!("exited with {s} after SIGTERM"),
            None => {
                self.proc.kill();
                "did not exit within 10 s of SIGTERM (killed)".into()
            }
        }
    }

    /// WARN/ERROR lines (normalised: no timestamp, digit runs as '#') with counts,
    /// and the number of lines mentioning throttling.
    fn log_problems(&self) -> (usize, Vec<(String, usize)>) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut total = 0;
        for line in text.lines() {
            if !(line.contains(" WARN ") || line.contains(" ERROR ") || line.to_lowercase().contains("throttl")) {
                continue;
            }
            total += 1;
            let body = line.split_once(' ').map(|(_, b)| b.trim()).unwrap_or(line);
            let mut norm = normalize(body);
            norm.truncate(300);
            *counts.entry(norm).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        (total, v)
    }
}

/// Replaces ids by `x` (hex parts of 4+ characters with a digit, or every hex
/// part of a word with 3+ of them, like a UUID) and numbers by `#`, so that
/// repeats of a message group together.
fn normalize(line: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let hex = |p: &str| p.len() >= 4 && p.chars().all(|c| c.is_ascii_hexdigit());
    let flush = |word: &mut String, out: &mut String| {
        let uuid_like = word.split('-').filter(|p| hex(p)).count() >= 3;
        let parts: Vec<&str> = word
            .split('-')
            .map(|p| {
                if hex(p) && (uuid_like || p.chars().any(|c| c.is_ascii_digit())) {
                    "x"
                } else if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) {
                    "#"
                } else {
                    p
                }
            })
            .collect();
        out.push_str(&parts.join("-"));
        word.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

// ---------------------------------------------------------------------------
// Watches
// ---------------------------------------------------------------------------

struct Watched<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: reflector::Store<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default + Send + Sync,
{
    /// A reflected watch that calls `on_apply` with each added or changed
    /// object as its event arrives.
    async fn start(api: Api<K>, mut on_apply: impl FnMut(&K) + Send + 'static) -> Result<Self> {
        let (store, writer) = reflector::store();
        let task = tokio::spawn(
            watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer).for_each(move |ev| {
                if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = &ev {
                    on_apply(o);
                }
                futures::future::ready(())
            }),
        );
        tokio::time::timeout(Duration::from_secs(60), store.wait_until_ready())
            .await
            .map_err(|_| anyhow!("watch not ready within 60 s"))??;
        Ok(Watched { store, task })
    }
}

impl<K: Resource + Clone + 'static> Drop for Watched<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When each key was first seen (the arrival of the watch event).
#[derive(Clone, Default)]
struct FirstSeen(Arc<Mutex<HashMap<String, Instant>>>);

impl FirstSeen {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn mark(&self, key: &str) {
        let now = Instant::now();
        self.lock().entry(key.to_string()).or_insert(now);
    }
    fn len(&self) -> usize {
        self.lock().len()
    }
    fn get(&self, key: &str) -> Option<Instant> {
        self.lock().get(key).copied()
    }
    fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }
    fn snapshot(&self) -> HashMap<String, Instant> {
        self.lock().clone()
    }
}

fn has_provisioner_annotation(c: &PersistentVolumeClaim) -> bool {
    c.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANN_STORAGE_PROVISIONER))
}

fn is_bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// The claim a PV of class `class` is for.
fn claim_of<'a>(pv: &'a PersistentVolume, class: &str) -> Option<&'a str> {
    let spec = pv.spec.as_ref()?;
    (spec.storage_class_name.as_deref() == Some(class)).then_some(())?;
    spec.claim_ref.as_ref()?.name.as_deref()
}

/// A PVC watch of `pvcs` recording the first time each claim carries the
/// provisioner annotation and is Bound.
async fn watch_claims(
    pvcs: &Api<PersistentVolumeClaim>,
) -> Result<(Watched<PersistentVolumeClaim>, FirstSeen, FirstSeen)> {
    let (annotated, bound) = (FirstSeen::default(), FirstSeen::default());
    let (a, b) = (annotated.clone(), bound.clone());
    let w = Watched::start(pvcs.clone(), move |c: &PersistentVolumeClaim| {
        let name = c.metadata.name.as_deref().unwrap_or_default();
        if has_provisioner_annotation(c) {
            a.mark(name);
        }
        if is_bound(c) {
            b.mark(name);
        }
    })
    .await?;
    Ok((w, annotated, bound))
}

/// A watch of all PVs recording, per claim, when a PV of `class` for it first appeared.
async fn watch_pvs(pvs: &Api<PersistentVolume>, class: &str) -> Result<(Watched<PersistentVolume>, FirstSeen)> {
    let seen = FirstSeen::default();
    let (s, class) = (seen.clone(), class.to_string());
    let w = Watched::start(pvs.clone(), move |pv: &PersistentVolume| {
        if let Some(claim) = claim_of(pv, &class) {
            s.mark(claim);
        }
    })
    .await?;
    Ok((w, seen))
}

/// Seconds from `from[k]` to `to[k]` for every key in both, sorted.
fn latencies(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<f64> {
    let mut v: Vec<f64> =
        to.iter().filter_map(|(k, t)| from.get(k).map(|f| t.saturating_duration_since(*f).as_secs_f64())).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// p50, p95 and max of sorted samples.
#[derive(Clone, Copy, Debug)]
struct Spread {
    p50: f64,
    p95: f64,
    max: f64,
}

impl Default for Spread {
    fn default() -> Self {
        Spread { p50: f64::NAN, p95: f64::NAN, max: f64::NAN }
    }
}

impl Spread {
    fn of(sorted: &[f64]) -> Spread {
        Spread { p50: pct(sorted, 0.5), p95: pct(sorted, 0.95), max: sorted.last().copied().unwrap_or(f64::NAN) }
    }
}

// ---------------------------------------------------------------------------
// Scenario
// ---------------------------------------------------------------------------

#[derive(Default, Clone)]
struct Result1 {
    n: usize,
    qps: String,
    create_s: f64,
    create_errors: usize,
    pv_s: Option<f64>,
    annotated_s: Option<f64>,
    ann_lat_p50: f64,
    ann_lat_p95: f64,
    /// The provisioner's own latency: claim annotated → its PV.
    ann_to_pv: Spread,
    /// Events of the provisioner's component, counts summed: Provisioning, ProvisioningSucceeded.
    events_provisioning: i32,
    events_succeeded: i32,
    bound_s: Option<f64>,
    pv_lat_p50: f64,
    pv_lat_p95: f64,
    bound_lat_p50: f64,
    bound_lat_p95: f64,
    req_per_vol: f64,
    rejected: f64,
    apf_wait_ms: f64,
    del_s: Option<f64>,
    del_req_per_vol: f64,
    /// 409/422 answers to PV writes during deletion: all clients, and without kube-controller-manager's.
    del_conflicts_all: f64,
    del_conflicts_sidecar: Option<f64>,
    synced_ms: f64,
    rss_idle: f64,
    rss_bound: f64,
    rss_end: f64,
    hwm: f64,
    log_problem_lines: usize,
    notes: Vec<String>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn breakdown(title: &str, d: &Delta, per: usize) -> String {
    let mut s = format!(
        "  {title}: sidecar {} requests ({:.2}/volume; APF rejected {}, mean APF wait {:.1} ms); all clients {}; \
         kube-controller-manager {} requests, {} s in its client-side rate limiter\n",
        d.sidecar,
        d.sidecar / per.max(1) as f64,
        d.sidecar_rejected,
        d.sidecar_mean_wait_ms,
        d.all_requests,
        d.kcm_requests.map_or("n/a".into(), |v| format!("{v}")),
        d.kcm_throttled_secs.map_or("n/a".into(), |v| format!("{v:.1}")),
    );
    s.push_str("    apiserver_request_total delta, all clients (verb resource code: count):\n");
    for (k, v) in d.requests.iter().take(25) {
        let _ = writeln!(s, "      {k}: {v}");
    }
    s
}

async fn create_retrying<K>(api: &Api<K>, obj: &K, errors: &Mutex<usize>) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut attempt = 0;
    loop {
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt > 0 => return Ok(()),
            Err(e) => {
                *errors.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                attempt += 1;
                if attempt > 10 {
                    return Err(e.into());
                }
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
        }
    }
}

async fn scenario(env: &Env, n: usize, qps: &Qps, run: usize, details: &mut String) -> Result<Result1> {
    let admin = &env.admin;
    let tag = format!("{n}-{}-r{run}", qps.short());
    let ns_name = unique_name(&format!("bench-{tag}"));
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    let sc_name = ns_name.clone();
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class(&sc_name, DRIVER)).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let pv_api: Api<PersistentVolume> = Api::all(admin.clone());

    let sidecar = env.start_sidecar(&format!("sidecar-{tag}"), qps).await?;
    let pid = sidecar.pid();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut r = Result1 {
        n,
        qps: qps.label(),
        synced_ms: sidecar.synced_after.as_secs_f64() * 1000.0,
        rss_idle: mib(status_kib(pid, "VmRSS:")),
        ..Default::default()
    };
    let (pvc_w, annotated_seen, bound_seen) = watch_claims(&pvcs).await?;
    let (pv_w, pv_seen) = watch_pvs(&pv_api, &sc_name).await?;
    let timeout = Duration::from_secs(env.args.timeout_secs);

    // --- provisioning ---
    let before = snapshot(admin, env.kcm.as_ref()).await?;
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let errors = Arc::new(Mutex::new(0usize));
    let t0 = Instant::now();
    let creator = {
        let (pvcs, created_at, errors, sc, c) =
            (pvcs.clone(), created_at.clone(), errors.clone(), sc_name.clone(), env.args.creators.max(1));
        tokio::spawn(async move {
            stream::iter(0..n)
                .map(|i| {
                    let (pvcs, created_at, errors, sc) = (&pvcs, &created_at, &errors, &sc);
                    async move {
                        let name = format!("pvc-{i:05}");
                        let t = Instant::now();
                        create_retrying(pvcs, &pvc(&name, Some(sc), "1Mi"), errors).await?;
                        created_at.lock().unwrap_or_else(|e| e.into_inner()).insert(name, t);
                        Ok::<_, anyhow::Error>(())
                    }
                })
                .buffer_unordered(c)
                .try_collect::<Vec<_>>()
                .await?;
            Ok::<_, anyhow::Error>(t0.elapsed())
        })
    };
    let mut creator = Some(creator);
    let mut last_print = Instant::now();
    loop {
        if let Some(c) = &creator
            && c.is_finished()
            && let Some(c) = creator.take()
        {
            let d = c.await??;
            r.create_s = d.as_secs_f64();
        }
        if r.annotated_s.is_none() && annotated_seen.len() >= n {
            r.annotated_s = Some(t0.elapsed().as_secs_f64());
        }
        if r.pv_s.is_none() && pv_seen.len() >= n {
            r.pv_s = Some(t0.elapsed().as_secs_f64());
        }
        if bound_seen.len() >= n && creator.is_none() {
            r.bound_s = Some(t0.elapsed().as_secs_f64());
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "  [{tag}] {:>5.0} s: created {}, with PV {}, bound {}, sidecar RSS {:.1} MiB",
                t0.elapsed().as_secs_f64(),
                created_at.lock().map(|m| m.len()).unwrap_or(0),
                pv_seen.len(),
                bound_seen.len(),
                mib(status_kib(pid, "VmRSS:"))
            );
        }
        if t0.elapsed() > timeout {
            let created = created_at.lock().map(|m| m.len()).unwrap_or(0);
            let stuck: Vec<String> = pvc_w
                .store
                .state()
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
                .take(10)
                .map(|c| {
                    let name = c.metadata.name.clone().unwrap_or_default();
                    format!("{name} (PV {})", if pv_seen.contains(&name) { "exists" } else { "missing" })
                })
                .collect();
            r.notes.push(format!(
                "provisioning TIMED OUT after {timeout:?}: created {created}, with PV {}, bound {}; not bound e.g. {}",
                pv_seen.len(),
                bound_seen.len(),
                stuck.join(", ")
            ));
            if let Some(c) = creator.take() {
                c.abort();
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.create_errors = *errors.lock().unwrap_or_else(|e| e.into_inner());
    {
        let created = created_at.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (pv, bound, ann) = (pv_seen.snapshot(), bound_seen.snapshot(), annotated_seen.snapshot());
        let lat = |seen: &HashMap<String, Instant>| {
            let v = latencies(&created, seen);
            (pct(&v, 0.5), pct(&v, 0.95))
        };
        (r.pv_lat_p50, r.pv_lat_p95) = lat(&pv);
        (r.bound_lat_p50, r.bound_lat_p95) = lat(&bound);
        (r.ann_lat_p50, r.ann_lat_p95) = lat(&ann);
        r.ann_to_pv = Spread::of(&latencies(&ann, &pv));
        // The last arrival, not the poll that noticed it.
        let last =
            |m: &HashMap<String, Instant>| m.values().max().map(|t| t.saturating_duration_since(t0).as_secs_f64());
        r.pv_s = r.pv_s.and(last(&pv));
        r.bound_s = r.bound_s.and(last(&bound));
        r.annotated_s = r.annotated_s.and(last(&ann));
    }
    let after = settled_snapshot(admin, env.kcm.as_ref()).await?;
    let prov = after.delta(&before);
    r.req_per_vol = prov.sidecar / n as f64;
    r.rejected = prov.sidecar_rejected;
    r.apf_wait_ms = prov.sidecar_mean_wait_ms;
    r.rss_bound = mib(status_kib(pid, "VmRSS:"));
    let _ = writeln!(details, "### {n} PVCs, QPS {} (run {run})\n\n```", qps.label());
    let _ = writeln!(
        details,
        "  kube-controller-manager annotated every PVC with {ANN_STORAGE_PROVISIONER} after {} s \
         (create→annotation p50 {:.2} s, p95 {:.2} s); every PVC had a PV after {} s; all Bound after {} s",
        r.annotated_s.map_or("-".into(), |v| format!("{v:.1}")),
        r.ann_lat_p50,
        r.ann_lat_p95,
        r.pv_s.map_or("-".into(), |v| format!("{v:.1}")),
        r.bound_s.map_or("-".into(), |v| format!("{v:.1}")),
    );
    details.push_str(&breakdown("provisioning", &prov, n));
    let events_api = Api::<Event>::namespaced(admin.clone(), &ns_name);
    let (ev, waited) =
        wait_for_events(&events_api, &env.args.event_component, n, Duration::from_secs(env.args.event_wait_secs))
            .await?;
    (r.events_provisioning, r.events_succeeded) = (ev.provisioning, ev.succeeded);
    let _ = writeln!(
        details,
        "  events of {:?} (counts summed), read {:.1} s after the sidecar went quiet: Provisioning {}/{n}, \
         ProvisioningSucceeded {}/{n}",
        env.args.event_component,
        waited.as_secs_f64(),
        ev.provisioning,
        ev.succeeded
    );
    if ev.provisioning < n as i32 || ev.succeeded < n as i32 {
        r.notes.push(format!(
            "{n}/{}: events missing after {} s: Provisioning {}/{n}, ProvisioningSucceeded {}/{n}",
            qps.short(),
            env.args.event_wait_secs,
            ev.provisioning,
            ev.succeeded
        ));
    }

    // --- deletion ---
    let before = snapshot(admin, env.kcm.as_ref()).await?;
    let t1 = Instant::now();
    pvcs.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    let mut last_print = Instant::now();
    loop {
        let pvs_left = pv_w
            .store
            .state()
            .iter()
            .filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(sc_name.as_str()))
            .count();
        let pvcs_left = pvc_w.store.state().len();
        if pvs_left == 0 && pvcs_left == 0 {
            r.del_s = Some(t1.elapsed().as_secs_f64());
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "  [{tag}] deleting {:>5.0} s: PVCs left {pvcs_left}, PVs left {pvs_left}",
                t1.elapsed().as_secs_f64()
            );
        }
        if t1.elapsed() > timeout {
            let phases: BTreeMap<String, usize> = pv_w
                .store
                .state()
                .iter()
                .filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(sc_name.as_str()))
                .fold(BTreeMap::new(), |mut m, pv| {
                    let phase = pv.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    let fin = pv.metadata.finalizers.clone().unwrap_or_default().join("+");
                    *m.entry(format!("{phase} finalizers={fin}")).or_default() += 1;
                    m
                });
            r.notes.push(format!(
                "deletion TIMED OUT after {timeout:?}: PVCs left {pvcs_left}, PVs left {pvs_left} by phase {phases:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = settled_snapshot(admin, env.kcm.as_ref()).await?;
    let del = after.delta(&before);
    r.del_req_per_vol = del.sidecar / n as f64;
    let conflicts = del.write_conflicts("persistentvolumes");
    (r.del_conflicts_all, r.del_conflicts_sidecar) = (conflicts.all, conflicts.others);
    details.push_str(&breakdown("deletion", &del, n));
    let _ = writeln!(
        details,
        "  deletion: 409/422 answers to PV writes: all clients {}, kube-controller-manager (any resource) {}, \
         so the sidecar's ≈ {} ({} per deleted volume); each is a request counted in its req/deleted volume",
        conflicts.all,
        conflicts.kcm.map_or("n/a".into(), |v| v.to_string()),
        conflicts.others.map_or("n/a".into(), |v| v.to_string()),
        conflicts.others.map_or("n/a".into(), |v| format!("{:.2}", v / n as f64)),
    );
    r.rss_end = mib(status_kib(pid, "VmRSS:"));
    r.hwm = mib(status_kib(pid, "VmHWM:"));

    // --- what went wrong, if anything ---
    let (problems, samples) = sidecar.log_problems();
    r.log_problem_lines = problems;
    if problems > 0 {
        let _ = writeln!(details, "  sidecar log: {problems} WARN/ERROR/throttling lines, by message:");
        for (m, c) in samples.iter().take(8) {
            let _ = writeln!(details, "    {c} x {m}");
        }
    }
    let events = events_api.list(&ListParams::default()).await?;
    let EventCounts { by_reason, warn_sample, .. } = count_events(&events.items, &env.args.event_component);
    let _ = writeln!(details, "  events in the namespace (type reason (component): count): {by_reason:?}");
    for (k, m) in &warn_sample {
        let _ = writeln!(details, "    e.g. {k}: {m}");
        r.notes.push(format!("warning events {k}"));
    }
    let stop = sidecar.stop().await;
    let _ = writeln!(
        details,
        "  sidecar: caches synced {:.0} ms after spawn; {stop}; PVC create errors (retried): {}",
        r.synced_ms, r.create_errors
    );
    details.push_str("```\n\n");
    drop(pvc_w);
    drop(pv_w);
    let _ = Api::<StorageClass>::all(admin.clone()).delete(&sc_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(admin.clone()).delete(&ns_name, &DeleteParams::default()).await;
    Ok(r)
}

/// Events in a namespace, counts summed.
#[derive(Default)]
struct EventCounts {
    /// The provisioner component's `Provisioning` and `ProvisioningSucceeded`.
    provisioning: i32,
    succeeded: i32,
    /// Every event by "type reason (component)".
    by_reason: BTreeMap<String, i32>,
    /// A message of each Warning kind.
    warn_sample: BTreeMap<String, String>,
}

fn event_component(e: &Event) -> &str {
    e.source
        .as_ref()
        .and_then(|s| s.component.as_deref())
        .filter(|c| !c.is_empty())
        .or(e.reporting_component.as_deref())
        .unwrap_or_default()
}

fn count_events(events: &[Event], component: &str) -> EventCounts {
    let mut c = EventCounts::default();
    for e in events {
        let count = e.count.unwrap_or(1).max(1);
        let reason = e.reason.as_deref().unwrap_or_default();
        let from = event_component(e);
        let ours = if component.ends_with('_') { from.starts_with(component) } else { from == component };
        if ours {
            match reason {
                "Provisioning" => c.provisioning += count,
                "ProvisioningSucceeded" => c.succeeded += count,
                _ => {}
            }
        }
        let key = format!("{} {reason} ({from})", e.type_.as_deref().unwrap_or_default());
        *c.by_reason.entry(key.clone()).or_default() += count;
        if e.type_.as_deref() == Some("Warning") {
            c.warn_sample.entry(key).or_insert_with(|| e.message.clone().unwrap_or_default());
        }
    }
    c
}

/// Reads the events until each claim's two are counted or `max` has passed;
/// returns the last reading and how long it waited.
async fn wait_for_events(
    api: &Api<Event>,
    component: &str,
    n: usize,
    max: Duration,
) -> Result<(EventCounts, Duration)> {
    let t = Instant::now();
    loop {
        let c = count_events(&api.list(&ListParams::default()).await?.items, component);
        if (c.provisioning >= n as i32 && c.succeeded >= n as i32) || t.elapsed() >= max {
            return Ok((c, t.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), ..Default::default() }
}

// ---------------------------------------------------------------------------
// Idle memory with a large cache
// ---------------------------------------------------------------------------

struct CacheResult {
    objects: usize,
    create_s: f64,
    pvcs_in_cluster: usize,
    pvs_in_cluster: usize,
    json_mb: f64,
    synced_s: f64,
    /// "Watch synced kind=..." lines: kind → time since the spawn.
    watch_synced: BTreeMap<String, Duration>,
    /// LIST requests (all clients) from the spawn until ready, by "resource code".
    lists: Vec<(String, f64)>,
    /// Requests of the sidecar's user from the spawn until ready.
    startup_requests: f64,
    rss_5s: f64,
    hwm: f64,
    stop: String,
    problems: Vec<(String, usize)>,
    driver: String,
    pvcs: String,
}

async fn cache_idle(env: &Env, count: usize) -> Result<CacheResult> {
    let admin = &env.admin;
    let ns_name = unique_name("bench-cache");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let errors = Mutex::new(0usize);
    let own = match env.args.cache_driver.as_str() {
        "own" => true,
        "other" => false,
        x => anyhow::bail!("--cache-driver must be own or other, not {x:?}"),
    };
    let pending = match env.args.cache_pvcs.as_str() {
        "bound" => false,
        "pending" => true,
        x => anyhow::bail!("--cache-pvcs must be bound or pending, not {x:?}"),
    };
    let wffc = format!("{ns_name}-wffc");
    if pending {
        let mut sc = storage_class(&wffc, DRIVER);
        sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
        Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;
    }
    let t = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    stream::iter(0..2 * count)
        .map(|j| {
            let (pvcs, pvs, errors, done, ns_name, wffc) = (&pvcs, &pvs, &errors, &done, &ns_name, &wffc);
            async move {
                let i = j / 2;
                if j % 2 == 0 {
                    // Class "" and a spec.volumeName that does not exist: nothing
                    // provisions it and the PV binder only keeps it Pending (no
                    // matching against the PVs below, no events).
                    let mut c = pvc(&format!("cache-pvc-{i:05}"), pending.then_some(wffc.as_str()), "1Mi");
                    if let Some(s) = c.spec.as_mut()
                        && !pending
                    {
                        s.volume_name = Some(format!("{ns_name}-missing-{i:05}"));
                    }
                    if own {
                        // Annotated for the sidecar's driver; pre-bound (not
                        // cached: a claim with a volume never needs one) or of
                        // a WaitForFirstConsumer class without a selected node
                        // (cached, waiting); never provisioned either way.
                        c.metadata.annotations =
                            Some([("volume.kubernetes.io/storage-provisioner".to_string(), DRIVER.to_string())].into());
                    }
                    create_retrying(pvcs, &c, errors).await?;
                } else {
                    let name = format!("{ns_name}-pv-{i:05}");
                    let driver = if own { DRIVER } else { OTHER_DRIVER };
                    let mut pv = csi_pv(&name, driver, &format!("vol-{i:05}"), "1Mi");
                    // What a dynamically provisioned volume carries (Retain:
                    // nothing for the sidecar to do with it).
                    if let Some(c) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
                        c.fs_type = Some("ext4".into());
                        c.volume_attributes = Some(
                            [(
                                "storage.kubernetes.io/csiProvisionerIdentity".to_string(),
                                format!("1764460000000-{i}-{driver}"),
                            )]
                            .into(),
                        );
                    }
                    create_retrying(pvs, &pv, errors).await?;
                    // Set phase Available ourselves (unthrottled), so that the PV
                    // binder (20 qps) has nothing left to write afterwards.
                    let patch = serde_json::json!({"status": {"phase": "Available"}});
                    pvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
                let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if d % 2000 == 0 {
                    eprintln!("  [cache] {d}/{} objects created", 2 * count);
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(env.args.creators.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    let create_s = t.elapsed().as_secs_f64();
    // Let kube-controller-manager catch up with the new objects.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (pvcs_in_cluster, pvc_bytes) = json_size(&Api::<PersistentVolumeClaim>::all(admin.clone())).await?;
    let (pvs_in_cluster, pv_bytes) = json_size(&pvs).await?;
    let before = snapshot(admin, None).await?;
    let sidecar = env.start_sidecar("sidecar-cache", &Qps::Default).await?;
    let startup = snapshot(admin, None).await?.delta(&before);
    let lists: Vec<(String, f64)> = startup
        .requests
        .iter()
        .filter_map(|(k, n)| k.strip_prefix("LIST ").map(|rest| (rest.to_string(), *n)))
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = sidecar.pid();
    let (rss_5s, hwm) = (mib(status_kib(pid, "VmRSS:")), mib(status_kib(pid, "VmHWM:")));
    let (_, problems) = sidecar.log_problems();
    let synced_s = sidecar.synced_after.as_secs_f64();
    let sidecar_watch_synced = sidecar.watch_synced.clone();
    let stop = sidecar.stop().await;
    let json_mb = (pvc_bytes + pv_bytes) as f64 / 1e6;
    Ok(CacheResult {
        objects: count,
        driver: env.args.cache_driver.clone(),
        pvcs: env.args.cache_pvcs.clone(),
        create_s,
        pvcs_in_cluster,
        pvs_in_cluster,
        json_mb,
        synced_s,
        watch_synced: sidecar_watch_synced,
        lists,
        startup_requests: startup.sidecar,
        rss_5s,
        hwm,
        stop,
        problems,
    })
}

// ---------------------------------------------------------------------------
// Failover
// ---------------------------------------------------------------------------

/// One SIGKILL of the leader.
struct Round {
    /// SIGKILL → the standby logged that it acquired the Lease (None: not logged).
    takeover: Option<Duration>,
    /// SIGKILL → the PV of the claim created right after it.
    pv: Option<Duration>,
}

struct FailoverResult {
    pvs_in_cluster: usize,
    rounds: Vec<Round>,
    notes: Vec<String>,
}

/// The replicas of one failover run, named in start order.
struct Replica {
    name: String,
    proc: Proc,
}

fn acquired(log: &str) -> bool {
    log.contains("successfully acquired lease")
}

/// The holder of some Lease in `ns` (the only Leases there are the provisioner's).
async fn lease_holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
        .find(|h| !h.is_empty()))
}

/// Which live replica leads: the one whose log names the Lease's holder, else
/// the only one that logged acquiring a Lease.
fn leader_index(replicas: &mut [Replica], holder: &str) -> Option<usize> {
    let live: Vec<(usize, String)> = replicas
        .iter_mut()
        .enumerate()
        .filter_map(|(i, r)| r.proc.try_exit().is_none().then(|| (i, r.proc.logs())))
        .collect();
    let pick = |f: &dyn Fn(&str) -> bool| {
        let hits: Vec<usize> = live.iter().filter(|(_, l)| f(l)).map(|(i, _)| *i).collect();
        (hits.len() == 1).then(|| hits[0])
    };
    pick(&|l: &str| l.contains(holder)).or_else(|| pick(&|l: &str| acquired(l)))
}

/// Waits (bounded) until a csi-sidecar standby has its PV and PVC watches
/// synced; a provisioner that never logs "Watch synced" gets 10 s.
async fn wait_standby_warm(r: &mut Replica) -> Result<()> {
    let t = Instant::now();
    loop {
        let kinds = watch_synced_kinds(&r.proc.logs());
        let has = |k: &str| kinds.iter().any(|x| x == k);
        if (has("PersistentVolume") && has("PersistentVolumeClaim"))
            || (kinds.is_empty() && t.elapsed() > Duration::from_secs(10))
        {
            return Ok(());
        }
        if let Some(s) = r.proc.try_exit() {
            bail!("standby {} exited ({s}); log:\n{}", r.name, r.proc.logs());
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("standby {}: watches not synced within 300 s", r.name);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until one live replica leads and is ready; its index.
async fn wait_leader_ready(replicas: &mut [Replica], leases: &Api<Lease>, ready: &str) -> Result<usize> {
    let t = Instant::now();
    loop {
        if let Some(holder) = lease_holder(leases).await?
            && let Some(i) = leader_index(replicas, &holder)
            && replicas[i].proc.logs().contains(ready)
        {
            return Ok(i);
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("no replica led and was ready within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two replicas with 4 s leases; each round SIGKILLs the leader, creates a
/// claim right after and times the kill → its PV; a fresh standby replaces
/// the killed one.
async fn failover(env: &Env) -> Result<FailoverResult> {
    let admin = &env.admin;
    let ns_name = unique_name("bench-failover");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class(&ns_name, DRIVER)).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns_name);
    let (_pv_w, pv_seen) = watch_pvs(&Api::all(admin.clone()), &ns_name).await?;
    let pvs_in_cluster = _pv_w.store.state().len();
    let le: Vec<String> = [
        "--leader-election".to_string(),
        format!("--leader-election-namespace={ns_name}"),
        "--leader-election-lease-duration=4s".into(),
        "--leader-election-renew-deadline=3s".into(),
        "--leader-election-retry-period=1s".into(),
    ]
    .into();
    let spawn = |i: usize| {
        let name = format!("failover-{i}");
        let (proc, _) = env.spawn_provisioner(&name, &Qps::Default, &le);
        Replica { name, proc }
    };
    let mut replicas = vec![spawn(0), spawn(1)];
    let mut rounds = Vec::new();
    let mut notes = Vec::new();
    for round in 0..env.args.failover_rounds.max(1) {
        let leader = wait_leader_ready(&mut replicas, &leases, &env.command.ready_log).await?;
        let standby = (0..replicas.len())
            .rev()
            .find(|&i| i != leader && replicas[i].proc.try_exit().is_none())
            .ok_or_else(|| anyhow!("no standby"))?;
        wait_standby_warm(&mut replicas[standby]).await?;
        let claim = format!("failover-{round}");
        replicas[leader].proc.signal(Signal::SIGKILL);
        let killed = Instant::now();
        create_retrying(&pvcs, &pvc(&claim, Some(&ns_name), "1Mi"), &Mutex::new(0)).await?;
        let mut takeover = None;
        let pv = loop {
            if takeover.is_none() && acquired(&replicas[standby].proc.logs()) {
                takeover = Some(killed.elapsed());
            }
            if let Some(at) = pv_seen.get(&claim) {
                break Some(at.saturating_duration_since(killed));
            }
            if killed.elapsed() > Duration::from_secs(120) {
                notes.push(format!("round {}: no PV for {claim} within 120 s of the SIGKILL", round + 1));
                break None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        eprintln!("  [failover] round {}: takeover {takeover:?}, SIGKILL → PV {pv:?}", round + 1);
        rounds.push(Round { takeover, pv });
        let _ = replicas[leader].proc.wait_exit(Duration::from_secs(10)).await;
        replicas.push(spawn(replicas.len()));
    }
    for r in &mut replicas {
        if r.proc.try_exit().is_none() {
            r.proc.signal(Signal::SIGTERM);
            if r.proc.wait_exit(Duration::from_secs(10)).await.is_none() {
                r.proc.kill();
            }
        }
    }
    let _ = pvcs.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    let _ = Api::<StorageClass>::all(admin.clone()).delete(&ns_name, &DeleteParams::default()).await;
    Ok(FailoverResult { pvs_in_cluster, rounds, notes })
}

fn failover_table(f: &FailoverResult) -> String {
    let secs = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()));
    let mut s = format!(
        "Failover ({} PVs in the cluster; 2 replicas, --leader-election-lease-duration=4s, renew deadline 3s, \
         retry 1s; SIGKILL of the leader, then one claim created):\n\n\
         | round | SIGKILL → standby acquired the Lease (s) | SIGKILL → PV of the new claim (s) |\n|---:|---:|---:|\n",
        f.pvs_in_cluster
    );
    for (i, r) in f.rounds.iter().enumerate() {
        let _ = writeln!(s, "| {} | {} | {} |", i + 1, secs(r.takeover), secs(r.pv));
    }
    let med = |v: Vec<Option<Duration>>| {
        if v.iter().any(Option::is_none) {
            "-".to_string()
        } else {
            format!("{:.2}", median(&v.iter().flatten().map(Duration::as_secs_f64).collect::<Vec<_>>()))
        }
    };
    let _ = writeln!(
        s,
        "| median | {} | {} |\n",
        med(f.rounds.iter().map(|r| r.takeover).collect()),
        med(f.rounds.iter().map(|r| r.pv).collect())
    );
    for n in &f.notes {
        let _ = writeln!(s, "* {n}");
    }
    s
}

/// How many objects of a kind there are and their JSON size without
/// managedFields (what the sidecar's informer keeps).
async fn json_size<K>(api: &Api<K>) -> Result<(usize, usize)>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut lp = ListParams::default().limit(500);
    let (mut count, mut bytes) = (0, 0);
    loop {
        let list = api.list(&lp).await?;
        for mut item in list.items {
            item.meta_mut().managed_fields = None;
            bytes += serde_json::to_vec(&item)?.len();
            count += 1;
        }
        match list.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok((count, bytes)),
        }
    }
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

fn opt_median(v: &[Option<f64>]) -> Option<f64> {
    if v.iter().any(Option::is_none) { None } else { Some(median(&v.iter().flatten().copied().collect::<Vec<_>>())) }
}

fn table(results: &[Vec<Result1>]) -> String {
    let mut s = String::new();
    s.push_str(
        "| PVCs | sidecar QPS/burst | creates done (s) | all have a PV (s) | PV/s | all Bound (s) | Bound/s | \
         create→PV p50/p95 (s) | annotation→PV p50/p95/max (s) | create→Bound p50/p95 (s) | sidecar API req/volume | \
         events Provisioning / Succeeded (of N) | delete: all PVs gone (s) | deleted/s | sidecar req/deleted volume | \
         409/422 on PV writes while deleting (sidecar ≈) | RSS idle (MiB) | RSS all Bound (MiB) | RSS end (MiB) | \
         peak RSS VmHWM (MiB) | WARN/ERROR log lines |\n",
    );
    s.push_str(
        "|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for runs in results {
        let Some(first) = runs.first() else { continue };
        let m = |f: fn(&Result1) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let om = |f: fn(&Result1) -> Option<f64>| opt_median(&runs.iter().map(f).collect::<Vec<_>>());
        let n = first.n as f64;
        let secs = |v: Option<f64>| v.map_or("timeout".into(), |v| format!("{v:.1}"));
        let rate = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.1}", n / v));
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {} | {} | {} | {:.1} / {:.1} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.2} | \
             {} | {} | {} | {:.2} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            first.n,
            first.qps,
            m(|r| r.create_s),
            secs(om(|r| r.pv_s)),
            rate(om(|r| r.pv_s)),
            secs(om(|r| r.bound_s)),
            rate(om(|r| r.bound_s)),
            m(|r| r.pv_lat_p50),
            m(|r| r.pv_lat_p95),
            m(|r| r.ann_to_pv.p50),
            m(|r| r.ann_to_pv.p95),
            m(|r| r.ann_to_pv.max),
            m(|r| r.bound_lat_p50),
            m(|r| r.bound_lat_p95),
            m(|r| r.req_per_vol),
            runs.iter()
                .map(|r| format!("{} / {}", r.events_provisioning, r.events_succeeded))
                .collect::<Vec<_>>()
                .join(", "),
            secs(om(|r| r.del_s)),
            rate(om(|r| r.del_s)),
            m(|r| r.del_req_per_vol),
            runs.iter()
                .map(|r| format!(
                    "{} ({})",
                    r.del_conflicts_all,
                    r.del_conflicts_sidecar.map_or("n/a".into(), |v| v.to_string())
                ))
                .collect::<Vec<_>>()
                .join(", "),
            m(|r| r.rss_idle),
            m(|r| r.rss_bound),
            m(|r| r.rss_end),
            m(|r| r.hwm),
            runs.iter().map(|r| r.log_problem_lines.to_string()).collect::<Vec<_>>().join("/"),
        );
    }
    s
}

async fn run(args: Args) -> Result<()> {
    let sizes: Vec<usize> =
        args.sizes.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    let qps: Vec<Qps> = args.qps.split(',').filter(|s| !s.trim().is_empty()).map(Qps::parse).collect::<Result<_>>()?;
    let tmp = tempfile::tempdir()?;
    let log_dir = match &args.log_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let command = Command::resolve(args.sidecar_command.as_deref(), args.ready_log.as_deref(), sidecar_bin)?;

    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin = cp.client().await;
    // Read on every snapshot; right after startup kube-controller-manager may not
    // have loaded the client CA yet (then it sees the bench as anonymous: n/a).
    let kcm = match kcm_client(&cp).await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("  (no client for kube-controller-manager, its numbers are n/a: {e:#})");
            None
        }
    };
    let sidecar_kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;

    let csi_sock = tmp.path().join("csi.sock");
    let mut driver = start_mock_driver(&csi_sock, DRIVER, "node-1", &log_dir).await?;
    eprintln!("control plane ready in {} ms; provisioner: {}", cp.info().startup_ms.kcm, command.label);

    let env = Env { cp, admin, kcm, sidecar_kubeconfig, csi_sock, log_dir: log_dir.clone(), command, args };
    let mut results: Vec<Vec<Result1>> = Vec::new();
    let mut details = String::new();
    for &n in &sizes {
        for q in &qps {
            if env.args.skip.iter().any(|s| *s == format!("{n}/{}", q.short())) {
                continue;
            }
            let mut runs = Vec::new();
            for run in 1..=env.args.runs.max(1) {
                eprintln!("scenario: {n} PVCs, QPS {} (run {run}) ...", q.label());
                let r = scenario(&env, n, q, run, &mut details).await?;
                eprintln!(
                    "  -> PVs {:?} s, Bound {:?} s, {:.2} req/volume, deleted {:?} s, peak RSS {:.1} MiB",
                    r.pv_s, r.bound_s, r.req_per_vol, r.del_s, r.hwm
                );
                runs.push(r);
            }
            results.push(runs);
        }
    }
    let cache = if env.args.cache_objects > 0 {
        eprintln!("idle cache: creating {} PVCs and {} PVs ...", env.args.cache_objects, env.args.cache_objects);
        Some(cache_idle(&env, env.args.cache_objects).await?)
    } else {
        None
    };
    let failover = if env.args.failover {
        eprintln!("failover: {} rounds ...", env.args.failover_rounds);
        Some(failover(&env).await?)
    } else {
        None
    };
    if driver.try_exit().is_some() {
        eprintln!("warning: the CSI mock driver exited during the run");
    }

    // --- report ---
    let size = std::fs::metadata(&env.command.program).map_or(0, |m| m.len());
    let mut out = String::new();
    let _ = writeln!(out, "## csi-sidecar provisioner benchmark\n");
    let _ = writeln!(
        out,
        "Real kube-apiserver + etcd + kube-controller-manager (PV binder, default client QPS 20/burst 30) on \
         127.0.0.1, CSI mock driver, one csi-sidecar `provisioner` process per scenario (default 100 workers), \
         {} concurrent PVC creators, {} run(s) per scenario (medians).\n",
        env.args.creators, env.args.runs
    );
    out.push_str(&table(&results));
    out.push('\n');
    if let Some(c) = &cache {
        out.push_str(
            "| idle cache | objects created (s) | PVCs / PVs in the cluster | their JSON without managedFields (MB) | \
             caches synced after (s) | RSS 5 s after sync (MiB) | peak RSS VmHWM (MiB) |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        let _ = writeln!(
            out,
            "| {} PVCs ({}) + {} PVs ({} driver) | {:.0} | {} / {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            c.objects,
            c.pvcs,
            c.objects,
            c.driver,
            c.create_s,
            c.pvcs_in_cluster,
            c.pvs_in_cluster,
            c.json_mb,
            c.synced_s,
            c.rss_5s,
            c.hwm
        );
        let synced: Vec<String> = c.watch_synced.iter().map(|(k, d)| format!("{k} {} ms", d.as_millis())).collect();
        let _ = writeln!(
            out,
            "Idle cache, from the spawn: \"Watch synced\" {}; ready (\"{}\") {:.0} ms. From the spawn until ready the \
             sidecar made {} requests; LIST requests of all clients then (resource code: count): {}.",
            if synced.is_empty() { "not logged".into() } else { synced.join(", ") },
            env.command.ready_log,
            c.synced_s * 1000.0,
            c.startup_requests,
            c.lists.iter().map(|(k, n)| format!("{k}: {n}")).collect::<Vec<_>>().join(", ")
        );
        let _ = writeln!(out, "Idle-cache sidecar: {}.", c.stop);
        for (m, n) in c.problems.iter().take(5) {
            let _ = writeln!(out, "  log: {n} x {m}");
        }
    }
    if let Some(f) = &failover {
        out.push_str(&failover_table(f));
    }
    let _ = writeln!(out, "Provisioner: `{}`.", env.command.label);
    let _ = writeln!(out, "Release binary size: {:.2} MB ({size} bytes).\n", size as f64 / 1e6);
    out.push_str(
        "Method: times count from the first PVC create; progress is read from two watches (PVCs of the \
         namespace, all PVs). \"sidecar API req/volume\" is exact per user: the sidecar runs as its own minted \
         user `csi-sidecar-bench` (ClusterRoleBinding to cluster-admin) and a FlowSchema matching only that user \
         puts its requests on a priority level of their own, so the delta of the apiserver's \
         `apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"csi-sidecar-bench\"}` between the first \
         create and all Bound (then until the sidecar made no request for 1 s), divided by N, counts every request of the sidecar and nothing else (the bench \
         and kube-controller-manager use other flow schemas). The per-verb tables below are \
         `apiserver_request_total` deltas of all clients (no user label): the bench's own requests are the N \
         `POST persistentvolumeclaims` and one `DELETECOLLECTION`; its two watches were opened before. Deletion is \
         timed from the DELETECOLLECTION of the PVCs until no PV of the class is left. Idle cache: PVCs of class \"\" \
         with a spec.volumeName that does not exist (else the PV binder would bind them to the PVs) and unbound \
         Retain CSI PVs of another driver; the RSS is read 5 s after the sidecar logged `Caches synced`.\n\n",
    );
    let notes: Vec<String> = results.iter().flatten().flat_map(|r| r.notes.clone()).collect();
    if !notes.is_empty() {
        out.push_str("Notes:\n");
        for n in notes {
            let _ = writeln!(out, "* {n}");
        }
        out.push('\n');
    }
    out.push_str("## Details\n\n");
    out.push_str(&details);
    println!("{out}");
    if env.args.log_dir.is_some() {
        eprintln!("logs kept in {}", log_dir.display());
    }
    driver.kill();
    let cp = env.cp;
    cp.stop();
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = argh::from_env();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Children are killed by the destructors of a finished `run`; SIGINT/SIGTERM end
    // it early the same way (a panic would abort without them in release builds).
    tokio::select! {
        r = run(args) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        _ = sigterm.recv() => Err(anyhow!("terminated")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, component: Option<&str>, reporting: Option<&str>, count: Option<i32>) -> Event {
        Event {
            reason: Some(reason.into()),
            type_: Some("Normal".into()),
            source: component
                .map(|c| k8s_openapi::api::core::v1::EventSource { component: Some(c.into()), ..Default::default() }),
            reporting_component: reporting.map(String::from),
            count,
            ..Default::default()
        }
    }

    #[test]
    fn events_of_the_provisioner_are_counted_with_their_aggregated_counts() {
        let events = [
            event("Provisioning", Some("external-provisioner"), None, Some(3)),
            event("Provisioning", None, Some("external-provisioner"), None),
            event("ProvisioningSucceeded", Some("external-provisioner"), None, Some(2)),
            event("ProvisioningSucceeded", Some("persistentvolume-controller"), None, Some(5)),
            event("ExternalProvisioning", Some("persistentvolume-controller"), None, Some(7)),
        ];
        let c = count_events(&events, "external-provisioner");
        assert_eq!((c.provisioning, c.succeeded), (4, 2));
        assert_eq!(c.by_reason.get("Normal ExternalProvisioning (persistentvolume-controller)"), Some(&7));
        // A component ending in "_" is the prefix of the provisioner's identity.
        let events = [
            event("Provisioning", Some("bench.csi.example.com_vm_42623e95"), None, Some(2)),
            event("ProvisioningSucceeded", Some("bench.csi.example.com_vm_42623e95"), None, None),
            event("Provisioning", Some("other.example.com_vm_1"), None, None),
            event("Provisioning", Some("bench.csi.example.com"), None, None),
        ];
        let c = count_events(&events, "bench.csi.example.com_");
        assert_eq!((c.provisioning, c.succeeded), (2, 1));
    }

    #[test]
    fn watch_synced_lines_give_their_kinds() {
        let log = "2026-12-01T10:00:00.1Z  INFO Watch synced kind=PersistentVolume objects=10000\n\
                   2026-12-01T10:00:00.2Z  INFO something else kind=Node\n\
                   2026-12-01T10:00:00.3Z  INFO Watch synced kind=\"PersistentVolumeClaim\" objects=0\n";
        assert_eq!(watch_synced_kinds(log), ["PersistentVolume", "PersistentVolumeClaim"]);
    }

    #[test]
    fn annotation_to_pv_latency_pairs_each_claim_with_its_own_times() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let from: HashMap<String, Instant> = [("a".into(), at(0)), ("b".into(), at(100)), ("c".into(), at(0))].into();
        let to: HashMap<String, Instant> = [("a".into(), at(500)), ("b".into(), at(300)), ("x".into(), at(1))].into();
        let v = latencies(&from, &to);
        assert_eq!(v, [0.2, 0.5]);
        let s = Spread::of(&v);
        assert_eq!((s.p50, s.max), (0.5, 0.5));
        assert!(Spread::of(&[]).p50.is_nan());
    }

    #[test]
    fn a_sidecar_command_is_split_and_gets_the_generic_ready_text() {
        let c = Command::resolve(Some(" /opt/csi-provisioner  --v=5 "), None, || unreachable!()).expect("command");
        assert_eq!(c.program, PathBuf::from("/opt/csi-provisioner"));
        assert_eq!(c.args, ["--v=5"]);
        assert_eq!(c.ready_log, "Started provisioner controller");
        let own = Command::resolve(None, None, || PathBuf::from("/x/csi-sidecar")).expect("command");
        assert_eq!(
            (own.args.as_slice(), own.ready_log.as_str()),
            (["provisioner".to_string()].as_slice(), "Caches synced")
        );
        assert!(Command::resolve(Some("  "), None, || unreachable!()).is_err());
    }

    #[test]
    fn normalizes_ids() {
        assert_eq!(
            normalize("WARN volume{pv=pvc-872b831a-acff-4b94-1234}: failed after 12 tries, added"),
            "WARN volume{pv=pvc-x-x-x-x}: failed after # tries, added"
        );
    }
}
