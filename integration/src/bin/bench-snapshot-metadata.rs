//! Benchmark of the snapshot-metadata module (issue 39), against the real
//! control plane with the real snapshot-controller and the fault driver's
//! CSI SnapshotMetadata service, through csi-sidecar running `provisioner
//! snapshotter snapshot-metadata` in one process (default budgets):
//!
//! 1. **Wall time** of a 16 384-block delta (64 MiB of changed 4 KiB
//!    blocks, real data) measured by a Python gRPC client, as upstream's
//!    0.25 s was: TLS, the TokenReview, the SubjectAccessReview and the
//!    snapshot's resolution included. `--runs` calls (default 5), each after
//!    a pause that refills the module's request budget (a backup
//!    application asks once per snapshot); the median.
//! 2. **API requests per call**: the module's
//!    `csi_sidecar_api_budget_requests_total` before and after the calls.
//! 3. **Memory in the stream's length**: the process's peak RSS (VmHWM)
//!    after a 1 000-block stream and after a 1 000 000-block one (the
//!    driver's synthetic records), before anything else ran.
//! 4. **Idle RSS the module adds** to a combined `provisioner snapshotter
//!    health-monitor` process, each started alone and measured 10 s after
//!    its caches synced.
//!
//! ```text
//! cargo build --release -p csi-sidecar -p csi-sidecar-integration \
//!   --bin csi-sidecar --bin bench-snapshot-metadata --bin cluster
//! target/release/bench-snapshot-metadata
//! ```
//! It makes a Python virtual environment with grpcio and grpcio-tools
//! (from PyPI) under `target/bench-venv` on its first run.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail};
use argh::FromArgs;
use csi_sidecar::modules::snapshot_metadata::client;
use csi_sidecar_integration::{
    bench::{median, mib, synced_sidecar, wait_for},
    bench_world::SnapshotWorld,
    fault_driver::{FaultDriver, HealthForms, Script, Transport},
    kube_support::pvc,
    process::{Proc, status_kib},
    snapshot_metadata::{TlsFiles, backup_account},
    snapshots::SnapApis,
    workspace_root,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, Client, api::PostParams};

const DRIVER: &str = "bench-snapshot-metadata.csi.example.com";
const NS: &str = "bench-snapshot-metadata";
const CLASS: &str = "bench-snapshot-metadata";
const AUDIENCE: &str = "bench-backup";
const BLOCK: u64 = 4096;

/// csi-sidecar benchmark: the snapshot-metadata module.
#[derive(FromArgs)]
struct Args {
    /// changed blocks of the timed delta (default 16384)
    #[argh(option, default = "16384")]
    blocks: u64,
    /// timed calls (default 5)
    #[argh(option, default = "5")]
    runs: usize,
}

fn main() -> Result<()> {
    let args: Args = argh::from_env();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

/// The Python interpreter of the bench's virtual environment (made once).
fn python() -> Result<PathBuf> {
    let venv = workspace_root().join("target/bench-venv");
    let python = venv.join("bin/python");
    let ready = Command::new(&python).args(["-c", "import grpc, grpc_tools"]).status().is_ok_and(|s| s.success());
    if !ready {
        eprintln!("making {} (grpcio, grpcio-tools) ...", venv.display());
        let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?;
        let pip = Command::new(venv.join("bin/pip")).args(["install", "-q", "grpcio", "grpcio-tools"]).status()?;
        if !made.success() || !pip.success() {
            bail!("could not make the Python environment {}", venv.display());
        }
    }
    Ok(python)
}

/// What the Python client measured of one call.
#[derive(serde::Deserialize, Debug)]
struct Call {
    seconds: f64,
    records: u64,
}

/// The Python client's calls.
struct PyClient {
    python: PathBuf,
    address: String,
    ca: PathBuf,
    token: String,
}

impl PyClient {
    fn calls(&self, snapshot: &str, base: Option<&str>, runs: usize, pause: f64) -> Result<Vec<Call>> {
        let proto = workspace_root().join("proto");
        let script = workspace_root().join("integration/scripts/snapshot-metadata-client.py");
        let mut cmd = Command::new(&self.python);
        cmd.arg(script)
            .arg(format!("--proto-dir={}", proto.display()))
            .arg(format!("--address={}", self.address))
            .arg(format!("--ca={}", self.ca.display()))
            .arg(format!("--token={}", self.token))
            .arg(format!("--namespace={NS}"))
            .arg(format!("--snapshot={snapshot}"))
            .arg(format!("--runs={runs}"))
            .arg(format!("--pause={pause}"));
        if let Some(b) = base {
            cmd.arg(format!("--base={b}"));
        }
        let out = cmd.output()?;
        if !out.status.success() {
            bail!("the Python client failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).with_context(|| format!("the client's line {l:?}")))
            .collect()
    }
}

/// The module's granted API requests and the seconds its driver streams
/// of `MetadataDelta` took in all, from the process's `/metrics`.
async fn module_counters(http: &str) -> Result<(f64, f64)> {
    let body = csi_sidecar_integration::http::get(http, "/metrics").await.map_err(anyhow::Error::msg)?.body;
    let value = |prefix: &str, label: &str| {
        let line = body.lines().find(|l| l.starts_with(prefix) && l.contains(label));
        line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    };
    Ok((
        value("csi_sidecar_api_budget_requests_total", "\"snapshot-metadata\""),
        value("csi_sidecar_operations_seconds_sum", "\"MetadataDelta\""),
    ))
}

/// A bound block claim's volume handle.
async fn block_volume(admin: &Client, name: &str) -> Result<String> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NS);
    let mut claim = pvc(name, Some(CLASS), "1Mi");
    if let Some(spec) = claim.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
    }
    pvcs.create(&PostParams::default(), &claim).await?;
    let mut volume = None;
    wait_for(&format!("claim {name} bound"), Duration::from_secs(120), async || {
        volume = pvcs.get(name).await?.spec.and_then(|s| s.volume_name);
        Ok(volume.is_some())
    })
    .await?;
    Ok(format!("fault-{}", volume.unwrap_or_default()))
}

/// VolumeSnapshot `name` of claim `claim`, ready; its snapshot handle.
async fn ready_snapshot(snaps: &SnapApis, name: &str, claim: &str) -> Result<String> {
    let content = snaps.snapshot_of(name, CLASS, claim).await;
    let c = snaps.wait_content_ready(&content, Duration::from_secs(120)).await;
    snaps.wait_snapshot_ready(name, Duration::from_secs(120)).await;
    Ok(c.data["status"]["snapshotHandle"].as_str().unwrap_or_default().to_string())
}

/// Wall times of the delta `base` to `target` read straight from the
/// driver's socket (no sidecar, no Kubernetes checks).
async fn driver_alone(csi: &std::path::Path, base: &str, target: &str, runs: usize) -> Result<Vec<f64>> {
    use csi_sidecar::csi::{Connection, proto::csi::v1 as csi_v1};
    let conn = Connection::new(&format!("unix://{}", csi.display()))?;
    let mut times = Vec::new();
    for _ in 0..runs {
        let req = csi_v1::GetMetadataDeltaRequest {
            base_snapshot_id: base.into(),
            target_snapshot_id: target.into(),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let mut stream = conn.get_metadata_delta(Duration::from_secs(60), req).await?;
        while stream.message().await?.is_some() {}
        times.push(started.elapsed().as_secs_f64());
    }
    Ok(times)
}

fn free_port() -> Result<u16> {
    let [port] = csi_sidecar_integration::ports::free_ports::<1>()?;
    Ok(port)
}

async fn run(args: Args) -> Result<()> {
    let python = python()?;
    let tmp = tempfile::tempdir()?;
    let SnapshotWorld { cp: _cp, admin, kubeconfig, snaps } = SnapshotWorld::start(NS, CLASS, DRIVER).await?;
    let csi = tmp.path().join("csi.sock");
    let script = Script {
        name: DRIVER.into(),
        controller: true,
        snapshots: true,
        snapshot_metadata: true,
        health: HealthForms { legacy_list: true, ..HealthForms::NONE },
        ..Script::default()
    };
    let driver = FaultDriver::start(&csi, Transport::Grpc, script);
    backup_account(&admin, NS, "backup", true).await?;

    let tls = TlsFiles::write(tmp.path()).map_err(anyhow::Error::msg)?;
    let ca = tmp.path().join("ca.crt");
    std::fs::write(&ca, &tls.ca)?;
    let (port, http_port) = (free_port()?, free_port()?);
    let http = format!("127.0.0.1:{http_port}");
    let sidecar_args: Vec<String> = [
        format!("--http-endpoint={http}"),
        "provisioner".into(),
        "snapshotter".into(),
        "snapshot-metadata".into(),
        format!("--tls-cert={}", tls.cert.display()),
        format!("--tls-key={}", tls.key.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--port={port}"),
        format!("--audience={AUDIENCE}"),
    ]
    .into();
    let synced = ("its caches", "Driver validated; serving SnapshotMetadata");
    let mut sidecar = synced_sidecar("sidecar", &csi, &kubeconfig, &sidecar_args, tmp.path(), synced).await?;
    let token = client::token_for(&admin, NS, "backup", AUDIENCE).await?;
    let py = PyClient { python, address: format!("127.0.0.1:{port}"), ca, token };

    // 3. Memory in the stream's length, first.
    let volume = block_volume(&admin, "data").await?;
    driver.set_volume_size(&volume, (args.blocks + 64) * BLOCK);
    let base = ready_snapshot(&snaps, "base", "data").await?;
    let mut peaks = Vec::new();
    for n in [1_000u64, 1_000_000] {
        driver.update(|s| s.metadata_synthetic_blocks = Some(n));
        let call = py.calls("base", None, 1, 0.0)?;
        if call.first().map(|c| c.records) != Some(n) {
            bail!("a {n}-block stream answered {call:?}");
        }
        peaks.push((n, status_kib(sidecar.pid(), "VmHWM"), call[0].seconds));
    }
    driver.update(|s| s.metadata_synthetic_blocks = None);

    // 1 and 2. The timed delta.
    eprintln!("writing {} blocks ...", args.blocks);
    for b in 0..args.blocks {
        driver.write_volume(&volume, b * BLOCK, b"changed");
    }
    let target = ready_snapshot(&snaps, "target", "data").await?;
    // The driver's own part: the same delta straight from its socket.
    let direct = driver_alone(&csi, &base, &target, args.runs).await?;
    let before = module_counters(&http).await?;
    let calls = py.calls("target", Some(&base), args.runs, 2.0)?;
    let after = module_counters(&http).await?;
    if let Some(c) = calls.iter().find(|c| c.records != args.blocks) {
        bail!("a delta answered {} blocks, not {}", c.records, args.blocks);
    }
    let times: Vec<f64> = calls.iter().map(|c| c.seconds).collect();
    let requests = (after.0 - before.0) / calls.len() as f64;
    let streamed = (after.1 - before.1) / calls.len() as f64;
    sidecar.terminate().await;

    // 4. Idle RSS the module adds to the controller modules.
    let controllers = ["provisioner", "snapshotter", "health-monitor"];
    let mut idle = Vec::new();
    for with in [false, true] {
        let mut a: Vec<String> = controllers.iter().map(|m| m.to_string()).collect();
        if with {
            a.push("snapshot-metadata".into());
            a.extend(sidecar_args[4..].iter().cloned());
        }
        let line = if with { synced.1 } else { "Caches synced; monitoring volume health" };
        let p =
            synced_sidecar(&format!("idle-{with}"), &csi, &kubeconfig, &a, tmp.path(), ("its caches", line)).await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        idle.push(status_kib(p.pid(), "VmRSS"));
        let mut p: Proc = p;
        p.terminate().await;
    }

    println!("\nsnapshot-metadata, csi-sidecar `provisioner snapshotter snapshot-metadata`, default budgets\n");
    println!("| measure | csi-sidecar | upstream |");
    println!("|---|---:|---:|");
    let runs: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
    println!(
        "| {}-block delta, Python client, median of {} | {:.3} s ({}) | 0.25 s |",
        args.blocks,
        times.len(),
        median(&times),
        runs.join(", ")
    );
    println!(
        "| of which the driver (the same delta from its socket, median of {}) | {:.3} s | |",
        direct.len(),
        median(&direct)
    );
    println!("| of which the driver's stream through the sidecar (its call metric, mean) | {streamed:.3} s | |");
    println!("| API requests per call | {requests:.1} | 5 to 7 |");
    for (n, kib, secs) in &peaks {
        println!("| peak RSS after a {n}-block stream ({secs:.1} s) | {:.1} MiB | |", mib(*kib));
    }
    println!(
        "| idle RSS, controller modules | {:.1} MiB | |\n| idle RSS, controller modules + snapshot-metadata | {:.1} MiB (+{:.1}) | |",
        mib(idle[0]),
        mib(idle[1]),
        mib(idle[1].saturating_sub(idle[0]))
    );
    Ok(())
}
