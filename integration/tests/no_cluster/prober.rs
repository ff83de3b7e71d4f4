//! prober (livenessprobe parity) against the fault driver and the real driver.

use std::time::Duration;

use csi_sidecar::csi::dial_error::{self, Access, Identity, Stat};
use csi_sidecar_integration::{
    component_bin,
    fault_driver::{FaultDriver, ProbeAnswer, Script, Transport},
    free_port,
    http::{Reply, get},
    process::Proc,
    sidecar_bin, symlinked_bin, wait_until,
};
use tonic::Code;

struct Prober {
    proc: Proc,
    addr: String,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

fn start_prober(extra: &[&str]) -> Prober {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    let addr = format!("127.0.0.1:{}", free_port());
    let bin = symlinked_bin(dir.path(), "livenessprobe");
    let mut args =
        vec![format!("--csi-address={}", socket.display()), format!("--http-endpoint={addr}"), "-v=5".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let proc = Proc::spawn("livenessprobe", &bin, &args, dir.path());
    Prober { proc, addr, _dir: dir, socket }
}

async fn healthz(p: &Prober) -> Reply {
    wait_until("the HTTP server", Duration::from_secs(10), async || {
        let r = get(&p.addr, "/healthz").await;
        (r.is_ok(), r)
    })
    .await
    .expect("reply")
}

async fn healthz_until(p: &Prober, want: (u16, &str)) -> Reply {
    wait_until(&format!("/healthz {want:?}"), Duration::from_secs(30), async || {
        let r = get(&p.addr, "/healthz").await;
        let ok = matches!(&r, Ok(r) if r.status == want.0 && r.body == want.1);
        (ok, r)
    })
    .await
    .expect("reply")
}

#[tokio::test]
async fn upstream_codes_and_bodies_for_every_probe_outcome() {
    let p = start_prober(&["--probe-timeout=1s"]);
    let driver = FaultDriver::start(&p.socket, Transport::Grpc, Script::default());
    healthz_until(&p, (200, "ok")).await;

    let table: Vec<(ProbeAnswer, Duration, u16, &str)> = vec![
        (ProbeAnswer::NotReady, Duration::ZERO, 500, "driver responded but is not ready"),
        (ProbeAnswer::Absent, Duration::ZERO, 200, "ok"),
        (
            ProbeAnswer::Fail(Code::Internal, "disk on fire".into()),
            Duration::ZERO,
            500,
            "rpc error: code = Internal desc = disk on fire",
        ),
        (
            ProbeAnswer::Ready,
            Duration::from_secs(3),
            500,
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        ),
        (ProbeAnswer::Ready, Duration::ZERO, 200, "ok"),
    ];
    for (answer, delay, status, body) in table {
        driver.update(|s| {
            s.probe = answer.clone();
            s.probe_delay = delay;
        });
        let r = healthz(&p).await;
        assert_eq!((r.status, r.body.as_str()), (status, body), "{answer:?} after {delay:?}");
    }
    // The per-module path answers the same.
    let r = get(&p.addr, "/healthz/prober").await.expect("reply");
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
}

#[tokio::test]
async fn one_connection_for_all_requests_and_one_probe_for_concurrent_ones() {
    let p = start_prober(&["--probe-timeout=5s"]);
    let driver = FaultDriver::start(&p.socket, Transport::Grpc, Script::default());
    healthz_until(&p, (200, "ok")).await;
    for _ in 0..50 {
        assert_eq!(healthz(&p).await.status, 200);
    }
    assert_eq!(driver.connections(), 1, "upstream dials once per /healthz; csi-sidecar must reuse one connection");

    // 16 concurrent requests while a Probe takes 500 ms: they share it.
    driver.update(|s| s.probe_delay = Duration::from_millis(500));
    let before = driver.probes();
    let replies = futures::future::join_all((0..16).map(|_| get(&p.addr, "/healthz"))).await;
    assert!(replies.iter().all(|r| matches!(r, Ok(r) if r.status == 200)), "{replies:?}");
    let probes = driver.probes() - before;
    assert!(probes <= 2, "16 concurrent /healthz caused {probes} Probe calls");
}

#[tokio::test]
async fn a_socket_that_never_answers_times_out_without_harm() {
    let p = start_prober(&["--probe-timeout=500ms"]);
    let _silent = FaultDriver::start(&p.socket, Transport::Silent, Script::default());
    let r = healthz(&p).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body, "rpc error: code = DeadlineExceeded desc = context deadline exceeded");
}

#[tokio::test]
async fn garbage_on_the_socket_is_an_error_not_a_crash() {
    let mut p = start_prober(&["--probe-timeout=1s"]);
    let garbage = FaultDriver::start(&p.socket, Transport::Garbage, Script::default());
    for _ in 0..3 {
        let r = healthz(&p).await;
        assert_eq!(r.status, 500, "{r:?}");
        assert!(r.body.starts_with("rpc error: code = "), "{r:?}");
    }
    assert!(p.proc.try_exit().is_none(), "csi-sidecar exited on garbage:\n{}", p.proc.logs());
    assert!(!p.proc.logs().contains("panicked"), "{}", p.proc.logs());
    // A proper driver on the same path afterwards is picked up.
    drop(garbage);
    let _good = FaultDriver::start(&p.socket, Transport::Grpc, Script::default());
    healthz_until(&p, (200, "ok")).await;
}

#[tokio::test]
async fn metrics_carry_upstream_names_labels_and_buckets() {
    let p = start_prober(&[]);
    let _driver = FaultDriver::start(&p.socket, Transport::Grpc, Script::default());
    healthz_until(&p, (200, "ok")).await;
    let m = wait_until("driver name in metrics", Duration::from_secs(10), async || {
        let m = get(&p.addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
        (m.contains("driver_name=\"fault.csi.example.com\",method_name=\"/csi.v1.Identity/Probe\""), m)
    })
    .await;
    assert!(m.contains("# TYPE csi_sidecar_operations_seconds histogram"), "{m}");
    assert!(m.contains("# HELP csi_sidecar_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total"), "{m}");
    for le in ["0.1", "0.25", "0.5", "1", "2.5", "5", "10", "15", "25", "50", "120", "300", "600", "+Inf"] {
        assert!(m.contains(&format!("grpc_status_code=\"OK\",le=\"{le}\"}}")), "bucket {le} missing:\n{m}");
    }
    assert!(m.contains("method_name=\"/csi.v1.Identity/GetPluginInfo\""), "{m}");
    assert!(m.contains("process_resident_memory_bytes"), "{m}");
    let m = metrics_with(&p, "csi_sidecar_driver_connected 1").await;
    assert!(!m.contains("csi_sidecar_api_budget_"), "no Kubernetes module, no budget: {m}");
}

/// A /healthz asked while the driver is still being discovered (its
/// GetPluginInfo is slow) waits for the discovery: its Probe is counted
/// under the driver's name, never `unknown-driver` (upstream asks the name
/// before each Probe).
#[tokio::test]
async fn a_probe_during_discovery_is_counted_under_the_drivers_name() {
    let p = start_prober(&["--probe-timeout=5s"]);
    let script = Script { plugin_info_delay: Duration::from_millis(1500), ..Script::default() };
    let driver = FaultDriver::start(&p.socket, Transport::Grpc, script);
    wait_until("discovery under way", Duration::from_secs(10), async || (driver.plugin_infos() > 0, ())).await;
    let r = healthz(&p).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    let m = get(&p.addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
    let probes: Vec<&str> =
        m.lines().filter(|l| l.contains("/csi.v1.Identity/Probe") && l.contains("_count")).collect();
    assert_eq!(
        probes,
        [
            "csi_sidecar_operations_seconds_count{driver_name=\"fault.csi.example.com\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1"
        ],
        "{m}"
    );
}

/// The lines of /metrics once one of them is `line`.
async fn metrics_with(p: &Prober, line: &str) -> String {
    wait_until(&format!("{line} in /metrics"), Duration::from_secs(30), async || {
        let m = get(&p.addr, "/metrics").await.map(|r| r.body).unwrap_or_default();
        (m.lines().any(|l| l == line), m)
    })
    .await
}

/// The real driver: 200 while it serves, 500 after it is killed, 200 again
/// after it restarts, in one csi-sidecar process; the connection gauge 0
/// before the driver starts and after it is killed (no /healthz needed),
/// 1 while it serves.
#[tokio::test]
async fn real_driver_killed_and_restarted() {
    let driver_bin = component_bin("csi-mock-driver");
    let p = start_prober(&["--probe-timeout=2s"]);
    metrics_with(&p, "csi_sidecar_driver_connected 0").await;
    let args = vec![format!("--endpoint=unix://{}", p.socket.display()), "--name=mock.csi.example.com".to_string()];
    let mut driver = Proc::spawn("csi-mock-driver", &driver_bin, &args, p.socket.parent().expect("dir"));
    metrics_with(&p, "csi_sidecar_driver_connected 1").await;
    healthz_until(&p, (200, "ok")).await;

    driver.kill();
    metrics_with(&p, "csi_sidecar_driver_connected 0").await;
    let r = wait_until("/healthz 500 after the driver died", Duration::from_secs(30), async || {
        let r = get(&p.addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 500), r)
    })
    .await
    .expect("reply");
    assert!(r.body.starts_with("rpc error: code = Unavailable"), "{r:?}");

    let _driver = Proc::spawn("csi-mock-driver-2", &driver_bin, &args, p.socket.parent().expect("dir"));
    healthz_until(&p, (200, "ok")).await;
    metrics_with(&p, "csi_sidecar_driver_connected 1").await;
}

/// The non-root user of csi-sidecar's image.
const SIDECAR_USER: u32 = 65532;

/// Why csi-sidecar cannot be run here as [`SIDECAR_USER`], if it cannot.
fn cannot_run_as_sidecar_user() -> Option<String> {
    if dial_error::identity().uid != 0 {
        return Some("not running as root, so csi-sidecar cannot be started as another user".into());
    }
    let bin = std::fs::canonicalize(sidecar_bin()).expect("csi-sidecar binary");
    let o = dial_error::observe(&bin);
    let who = Identity { uid: SIDECAR_USER, gid: SIDECAR_USER, groups: Vec::new() };
    let reachable = |s: &Stat| matches!(s, Stat::Found(f) if dial_error::permits(f, &who, Access::Search));
    // Execute permission is the same bit as search permission.
    if !o.directories.iter().all(|(_, s)| reachable(s)) || !reachable(&o.socket) {
        return Some(format!("uid {SIDECAR_USER} cannot execute {}", bin.display()));
    }
    None
}

/// The production failure: the driver (root) creates its socket
/// `srwxr-xr-x root:root` and csi-sidecar runs as a non-root user. /healthz
/// keeps upstream's 500 and `rpc error` form, and the text (and the log)
/// names the path, mode, owner and user; a directory on the path that the
/// user may not search is named too; fixing the modes makes it healthy.
#[tokio::test]
async fn a_socket_the_sidecar_may_not_open_is_explained() {
    if let Some(why) = cannot_run_as_sidecar_user() {
        eprintln!("skipped: {why}");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let chmod = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    chmod(tmp.path(), 0o755);
    let dir = tmp.path().join("csi");
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o755);
    let socket = dir.join("csi.sock");
    let _driver = FaultDriver::start(&socket, Transport::Grpc, Script::default());
    chmod(&socket, 0o755);

    let addr = format!("127.0.0.1:{}", free_port());
    let args = vec![
        format!("--csi-address={}", socket.display()),
        format!("--http-endpoint={addr}"),
        "--probe-timeout=2s".into(),
    ];
    let bin = symlinked_bin(tmp.path(), "livenessprobe");
    let p = Proc::spawn_as("livenessprobe", &bin, &args, (SIDECAR_USER, SIDECAR_USER), tmp.path());
    let prober = Prober { proc: p, addr, _dir: tmp, socket: socket.clone() };

    let denied = format!(
        "rpc error: code = Unavailable desc = cannot connect to the CSI driver socket {}: permission denied: the socket is srwxr-xr-x owned by 0:0 and csi-sidecar runs as uid {SIDECAR_USER} gid {SIDECAR_USER} (no supplementary groups); it needs write permission on the socket",
        socket.display()
    );
    wait_until("/healthz explains the socket's permissions", Duration::from_secs(30), async || {
        let r = get(&prober.addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 500 && r.body.starts_with(&denied)), r)
    })
    .await
    .expect("reply");
    wait_until("the log explains it too", Duration::from_secs(10), async || {
        let logs = prober.proc.logs();
        let line = logs.lines().find(|l| l.contains("Health check failed")).unwrap_or_default().to_string();
        (line.contains(&denied), line)
    })
    .await;

    // A directory on the path that the user may not search.
    chmod(&dir, 0o750);
    let dir_denied = format!(
        "rpc error: code = Unavailable desc = cannot connect to the CSI driver socket {}: permission denied: the directory {} is drwxr-x--- owned by 0:0 and csi-sidecar runs as uid {SIDECAR_USER}",
        socket.display(),
        dir.display()
    );
    wait_until("/healthz names the directory", Duration::from_secs(30), async || {
        let r = get(&prober.addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 500 && r.body.starts_with(&dir_denied)), r)
    })
    .await
    .expect("reply");

    // Permissions fixed: the same process becomes healthy.
    chmod(&dir, 0o755);
    chmod(&socket, 0o777);
    healthz_until(&prober, (200, "ok")).await;
}
