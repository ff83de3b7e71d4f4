//! prober (livenessprobe parity) against the fault driver and the real driver.

use std::time::Duration;

use csi_sidecar_integration::{
    component_bin,
    fault_driver::{FaultDriver, ProbeAnswer, Script, Transport},
    free_port,
    http::{Reply, get},
    process::Proc,
    symlinked_bin, wait_until,
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
}

/// The real driver: 200 while it serves, 500 after it is killed, 200 again
/// after it restarts, in one csi-sidecar process.
#[tokio::test]
async fn real_driver_killed_and_restarted() {
    let driver_bin = component_bin("csi-mock-driver");
    let p = start_prober(&["--probe-timeout=2s"]);
    let args = vec![format!("--endpoint=unix://{}", p.socket.display()), "--name=mock.csi.example.com".to_string()];
    let mut driver = Proc::spawn("csi-mock-driver", &driver_bin, &args, p.socket.parent().expect("dir"));
    healthz_until(&p, (200, "ok")).await;

    driver.kill();
    let r = wait_until("/healthz 500 after the driver died", Duration::from_secs(30), async || {
        let r = get(&p.addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 500), r)
    })
    .await
    .expect("reply");
    assert!(r.body.starts_with("rpc error: code = Unavailable"), "{r:?}");

    let _driver = Proc::spawn("csi-mock-driver-2", &driver_bin, &args, p.socket.parent().expect("dir"));
    healthz_until(&p, (200, "ok")).await;
}
