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

use std::{fmt::Write as _, path::PathBuf, sync::Mutex, time::Duration};

use anyhow::{Result, anyhow};
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{Qps, kcm_client, sidecar_kubeconfig, start_mock_driver},
    cluster::ControlPlane,
    sidecar_bin,
};
use kube::{
    Api, Resource,
    api::{ObjectMeta, PostParams},
};
use serde::de::DeserializeOwned;

#[path = "bench-provisioner/cache.rs"]
mod cache;
#[path = "bench-provisioner/failover.rs"]
mod failover;
#[path = "bench-provisioner/scenario.rs"]
mod scenario;
#[path = "bench-provisioner/sidecar.rs"]
mod sidecar;
#[path = "bench-provisioner/watches.rs"]
mod watches;

use cache::cache_idle;
use failover::{failover, failover_table};
use scenario::{ScenarioResult, scenario, table};
use sidecar::{Command, Env};

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
// Shared by the three benchmarks
// ---------------------------------------------------------------------------

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

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), ..Default::default() }
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

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
    let mut results: Vec<Vec<ScenarioResult>> = Vec::new();
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
