//! Test support for csi-sidecar: the built binary under its upstream names,
//! the real CSI driver (built from the Go module proxy), an in-process
//! fault-injecting CSI driver, a real Kubernetes control plane ([`cluster`])
//! with Kubernetes test helpers ([`kube_support`]), and small HTTP/gRPC helpers.
//!
//! Everything listens on 127.0.0.1 or on unix sockets in temporary dirs.

pub mod audit;
pub mod bench;
pub mod bench_world;
pub mod chart;
pub mod cluster;
pub mod failover;
pub mod fault_driver;
pub mod http;
pub mod kube_support;
pub mod monitoring;
pub mod node_figures;
pub mod ports;
pub mod process;
pub mod promql;
pub mod sidecar_build;
pub mod snapshot_metadata;
pub mod snapshots;
pub mod yaml;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".."))
}

/// The csi-sidecar binary: `$CSI_SIDECAR_BIN`, else `target/<profile>/csi-sidecar`
/// next to the running test executable, rebuilt first (once per process)
/// when any of its sources is newer ([`sidecar_build`]).
pub fn sidecar_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CSI_SIDECAR_BIN") {
        return PathBuf::from(p);
    }
    static FRESH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FRESH
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current executable");
            // A bench binary sits in target/<profile>/, a test in target/<profile>/deps/.
            let profile_dir = exe
                .ancestors()
                .skip(1)
                .take(2)
                .find(|d| d.file_name().is_some_and(|n| n == "debug" || n == "release"))
                .unwrap_or_else(|| panic!("{} is not in a cargo target directory", exe.display()))
                .to_path_buf();
            let bin = profile_dir.join("csi-sidecar");
            let target_dir = profile_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| profile_dir.clone());
            let release = profile_dir.ends_with("release");
            if let Err(e) = sidecar_build::ensure_fresh(&workspace_root(), &target_dir, release, &bin) {
                panic!("{e} (or set CSI_SIDECAR_BIN)");
            }
            bin
        })
        .clone()
}

/// A directory holding `name` as a symlink to the csi-sidecar binary, as the
/// container image does.
pub fn symlinked_bin(dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(sidecar_bin(), &link).expect("symlink");
    }
    link
}

/// A built Go component (`csi-mock-driver`, `kubelet-plugin-harness`, ...):
/// `$CSI_SIDECAR_<NAME>` if set, else built or found in the cache by
/// `integration/scripts/build-components.sh`.
pub fn component_bin(component: &str) -> PathBuf {
    let var = format!("CSI_SIDECAR_{}", component.to_uppercase().replace('-', "_"));
    if let Some(p) = std::env::var_os(&var) {
        return PathBuf::from(p);
    }
    let script = workspace_root().join("integration/scripts/build-components.sh");
    let mut child = std::process::Command::new("bash")
        .arg(&script)
        .args(["--print-path", component])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run build-components.sh");
    // Pass the build's progress through, but not the "cached: <path>" line of
    // every call.
    let stderr = child.stderr.take().expect("stderr pipe");
    let forward = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if !line.starts_with("cached: ") {
                eprintln!("{line}");
            }
        }
    });
    let out = child.wait_with_output().expect("run build-components.sh");
    let _ = forward.join();
    assert!(out.status.success(), "building {component} failed");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.exists(), "{component}: {} does not exist", path.display());
    path
}

/// A free TCP port on 127.0.0.1 for another process to bind, which no other
/// test process picks meanwhile (see [`ports`]).
pub fn free_port() -> u16 {
    let [port] = ports::free_ports::<1>().expect("free port");
    port
}

/// Makes `path` a stale unix socket, as a process that died leaves: a
/// socket file that nobody listens on. The socket is bound but never listens
/// (a connect is refused at once), then closed; a dropped listener instead
/// keeps accepting while a child that another test thread is spawning holds
/// a copy of its descriptor (until that child's exec).
pub fn stale_unix_socket(path: &Path) -> std::io::Result<()> {
    let socket = tokio::net::UnixSocket::new_stream()?;
    socket.bind(path)
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; on timeout
/// panics with `what` and the last observed state.
pub async fn wait_until<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> (bool, T),
) -> T {
    let start = Instant::now();
    loop {
        let (ok, state) = probe().await;
        if ok {
            return state;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; last state: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gRPC channel to a unix socket (what the kubelet does with the
/// registration socket).
pub async fn uds_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}
