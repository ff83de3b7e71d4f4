//! The built binary under each upstream name: dispatch, flags, exit codes.

use std::time::Duration;

use csi_sidecar_integration::{process::run_to_end, sidecar_bin, symlinked_bin};

const T: Duration = Duration::from_secs(10);

#[test]
fn every_upstream_name_dispatches_to_its_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, module, own_flag) in [
        ("livenessprobe", "prober", "--probe-timeout"),
        ("prober", "prober", "--probe-timeout"),
        ("csi-node-driver-registrar", "registrar", "--kubelet-registration-path"),
        ("registrar", "registrar", "--kubelet-registration-path"),
        ("csi-snapshotter", "snapshotter", "--snapshot-name-prefix"),
        ("snapshotter", "snapshotter", "--snapshot-name-prefix"),
    ] {
        let bin = symlinked_bin(dir.path(), name);
        let (code, out, err) = run_to_end(&bin, &["--help"], T);
        assert_eq!(code, Some(0), "{name}: {err}");
        assert!(
            out.contains(&format!("Usage: {name}")) && out.contains(module) && out.contains(own_flag),
            "{name}:\n{out}"
        );
        let (code, out, _) = run_to_end(&bin, &["--version"], T);
        assert_eq!(code, Some(0));
        assert!(out.starts_with(&format!("{name} ")), "{out}");
    }
}

#[test]
fn every_module_is_listed() {
    let (code, out, _) = run_to_end(&sidecar_bin(), &["--list"], T);
    assert_eq!(code, Some(0));
    for line in ["provisioner", "attacher", "resizer", "snapshotter", "registrar", "prober"] {
        assert!(out.lines().any(|l| l.starts_with(line)), "{line} not listed:\n{out}");
    }
}

#[test]
fn snapshotter_refuses_an_empty_name_prefix_like_upstream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = symlinked_bin(dir.path(), "csi-snapshotter");
    let (code, _, err) = run_to_end(&bin, &["--csi-address=/csi/csi.sock", "--snapshot-name-prefix="], T);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("Snapshot name prefix cannot be of length 0"), "{err}");
    let (code, _, err) = run_to_end(&bin, &["--snapshot-name-uuid-length=-1", "--no-such-flag"], T);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn usage_errors_exit_2_and_name_flag_value_and_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lp = symlinked_bin(dir.path(), "livenessprobe");
    let (code, _, err) = run_to_end(&lp, &["--no-such-flag=1"], T);
    assert_eq!(code, Some(2));
    assert!(err.contains("prober") && err.contains("no-such-flag"), "{err}");
    let (code, _, err) = run_to_end(&lp, &["--probe-timeout", "fast"], T);
    assert_eq!(code, Some(2));
    assert!(err.contains("probe-timeout") && err.contains("fast") && err.contains("prober"), "{err}");
    let (code, _, err) =
        run_to_end(&sidecar_bin(), &["registrar", "--csi-address=/a", "prober", "--csi-address=/b"], T);
    assert_eq!(code, Some(2));
    assert!(err.contains("conflicting"), "{err}");
}

#[test]
fn conflicting_http_flags_exit_1_like_upstream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lp = symlinked_bin(dir.path(), "livenessprobe");
    let (code, _, err) = run_to_end(&lp, &["--http-endpoint=127.0.0.1:0", "--metrics-address=127.0.0.1:0"], T);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--metrics-address") && err.contains("--http-endpoint"), "{err}");
}

#[test]
fn json_logging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = symlinked_bin(dir.path(), "csi-node-driver-registrar");
    let (code, _, err) = run_to_end(&reg, &["--logging-format=json"], T);
    assert_eq!(code, Some(1));
    let line = err
        .lines()
        .find(|l| l.contains("kubelet-registration-path"))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    assert!(line.starts_with('{') && line.contains("\"level\":\"ERROR\""), "not JSON: {line}");
}

/// The router cannot serve a metrics path without a leading slash, or one on
/// top of the health checks: refused at parse time, never a panic.
#[test]
fn a_metrics_path_the_router_cannot_serve_exits_2_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let resizer = symlinked_bin(dir.path(), "csi-resizer");
    for (path, why) in [("metrics", "must start with"), ("/healthz", "health checks"), ("/m/{x}", "not allowed")] {
        let flag = format!("--metrics-path={path}");
        let (code, _, err) =
            run_to_end(&resizer, &["--csi-address=/csi/csi.sock", "--http-endpoint=127.0.0.1:0", &flag], T);
        assert_eq!(code, Some(2), "{flag}: {err}");
        assert!(err.contains("--metrics-path") && err.contains(why) && !err.contains("panicked"), "{flag}: {err}");
    }
}

/// KEP-4958's command line (`csi-sidecars --controllers=...`, prefixed
/// per-controller flags): usage errors as every other form, and a node
/// process in that form serving the real CSI driver's health.
#[tokio::test]
async fn the_kep_4958_command_line_runs_the_same_modules() {
    use csi_sidecar_integration::{component_bin, free_port, http::get, process::Proc, wait_until};
    let dir = tempfile::tempdir().expect("tempdir");
    let aio = symlinked_bin(dir.path(), "csi-sidecars");
    let (code, out, err) = run_to_end(&aio, &["--help"], T);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("--controllers") && out.contains("node-driver-registrar"), "{out}");
    assert!(out.contains("health-monitor"), "{out}");
    let (code, _, err) = run_to_end(&aio, &["--controllers=attacher,nope"], T);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown controller \"nope\""), "{err}");
    let (code, _, err) = run_to_end(&aio, &["--controllers=livenessprobe", "--livenessprobe-probe-timeout=soon"], T);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("prober") && err.contains("soon"), "{err}");
    // The health monitor's own flags under its prefix (a bad value names it).
    let (code, _, err) = run_to_end(
        &aio,
        &["--controllers=attacher,health-monitor", "--health-monitor-monitor-interval=soon", "--timeout=30s"],
        T,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("health-monitor") && err.contains("soon"), "{err}");

    let socket = dir.path().join("csi.sock");
    let _driver = Proc::spawn(
        "csi-mock-driver",
        &component_bin("csi-mock-driver"),
        &[format!("--endpoint=unix://{}", socket.display()), "--name=kep.csi.example.com".into()],
        dir.path(),
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let node = Proc::spawn(
        "csi-sidecars",
        &aio,
        &[
            format!("--csi-address=unix://{}", socket.display()),
            "--controllers=livenessprobe".into(),
            format!("--http-endpoint={addr}"),
            "--livenessprobe-probe-timeout=2s".into(),
            "-v=2".into(),
        ],
        dir.path(),
    );
    let (reply, _) = wait_until("/healthz ok from the KEP-form process", Duration::from_secs(30), async || {
        let r = get(&addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 200 && r.body == "ok"), (r, node.logs()))
    })
    .await;
    assert_eq!(reply.map(|r| r.status), Ok(200));
}

/// `--reconcile-sync=0` is refused at parse time, naming the flag; before,
/// the reconciler's ticker panicked once the driver was up (an abort in a
/// release build).
#[test]
fn a_zero_reconcile_period_exits_2_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let attacher = symlinked_bin(dir.path(), "csi-attacher");
    let (code, _, err) = run_to_end(&attacher, &["--csi-address=/csi/csi.sock", "--reconcile-sync=0"], T);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--reconcile-sync") && !err.contains("panicked"), "{err}");
}
