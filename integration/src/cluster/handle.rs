//! The test handle: [`ControlPlane`] runs a launcher as a child process and
//! talks to the cluster it reports.

use super::per_module::PerModule;
#[allow(unused_imports)]
use super::*;
use std::panic::Location;

/// The `cluster` launcher binary: `$CSI_SIDECAR_CLUSTER_BIN`, else `cluster` next to
/// the running executable (tests run from `target/<profile>/deps/`; cargo builds
/// the package's binaries before its integration tests). The error is one line
/// naming what to build or set (the benchmarks and the demo print it and exit).
pub fn try_launcher_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let candidates: Vec<PathBuf> = exe.ancestors().skip(1).take(2).map(|d| d.join("cluster")).collect();
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        anyhow::anyhow!(
            "the `cluster` launcher is not built next to {}: run `cargo build -p csi-sidecar-integration` \
             (or set {BIN_ENV} to its path)",
            exe.display()
        )
    })
}

/// [`try_launcher_bin`] for tests, which fail with its error.
pub fn launcher_bin() -> PathBuf {
    try_launcher_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// A thread forwarding the launcher's remaining stdout lines (it ends with the
/// launcher).
pub(super) fn forward_lines(stdout: BufReader<std::process::ChildStdout>) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Run directories of live clusters in this process, marked failed by the panic hook.
pub(super) static LIVE_RUNS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
pub(super) static HOOK: Once = Once::new();

pub(super) fn mark_failed(run_dir: &Path, why: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join(FAILED_MARKER)) {
        let _ = writeln!(f, "{why}");
    }
}

/// Installs (once) a panic hook that marks every live run directory failed and
/// prints where its logs are, then calls the previous hook.
pub(super) fn install_panic_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("<unnamed>").to_string();
            let runs = LIVE_RUNS.lock().map(|r| r.clone()).unwrap_or_default();
            for run in &runs {
                mark_failed(run, &format!("thread '{thread}' panicked: {info}"));
                eprintln!("cluster logs (run dir kept): {}", run.join("logs").display());
            }
            prev(info);
        }));
    });
}

/// A running control plane owned by this process (see the module docs).
///
/// Dropping it (or [`ControlPlane::stop`]) closes the launcher's stdin and waits for
/// it to tear the cluster down; if the process dies instead, the kernel closes the
/// pipe and the launcher does the same.
pub struct ControlPlane {
    info: ClusterInfo,
    launcher: Mutex<Option<(Child, ChildStdin)>>,
    /// The launcher's stdout lines after the first (answers to commands).
    replies: Mutex<Option<std::sync::mpsc::Receiver<String>>>,
    /// One command at a time.
    commands: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("info", &self.info).finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts a dedicated control plane (panics on failure, with the reason).
    pub fn start() -> ControlPlane {
        Self::try_start().unwrap_or_else(|e| panic!("starting the control plane failed: {e:#}"))
    }

    /// Starts a dedicated control plane: spawns `cluster serve --quiet` and waits for
    /// its JSON line (several seconds).
    pub fn try_start() -> Result<ControlPlane> {
        Self::spawn_launcher(&try_launcher_bin()?, &[])
    }

    /// Starts `program serve --quiet <extra>` as the launcher.
    pub fn spawn_launcher(program: &Path, extra: &[&str]) -> Result<ControlPlane> {
        install_panic_hook();
        let mut child = Command::new(program)
            .args(["serve", "--quiet"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {}", program.display()))?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout pipe"))?;
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        let read = stdout.read_line(&mut line);
        let parsed: Result<ClusterInfo> = match read {
            Ok(0) | Err(_) => Err(anyhow!("the launcher exited without reporting (see its stderr above)")),
            Ok(_) => match serde_json::from_str::<ClusterInfo>(&line) {
                Ok(info) => Ok(info),
                Err(_) => {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    Err(anyhow!(
                        "the launcher failed: {} (run dir kept: {})",
                        v["error"].as_str().unwrap_or(line.trim()),
                        v["run_dir"].as_str().unwrap_or("?")
                    ))
                }
            },
        };
        match parsed {
            Ok(info) => {
                if let Ok(mut runs) = LIVE_RUNS.lock() {
                    runs.push(info.run_dir.clone());
                }
                Ok(ControlPlane {
                    info,
                    launcher: Mutex::new(Some((child, stdin))),
                    replies: Mutex::new(Some(forward_lines(stdout))),
                    commands: tokio::sync::Mutex::new(()),
                })
            }
            Err(e) => {
                drop(stdin);
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// One control plane per test module (cluster/per_module.rs), started on
    /// first use and stopped when the process exits (through the stdin pipe,
    /// since statics are never dropped).
    ///
    /// With `$CSI_SIDECAR_CLUSTER_INFO` pointing at the `cluster.json` of a running
    /// cluster, that one is used instead (and left running).
    #[track_caller]
    pub fn shared() -> &'static ControlPlane {
        // A failed start is remembered: the module's other tests fail fast with the same reason.
        static SHARED: PerModule = PerModule::new();
        let shared = SHARED.get(Location::caller().file(), || match std::env::var_os(ATTACH_ENV) {
            Some(path) if !path.is_empty() => match ClusterInfo::read(Path::new(&path)) {
                Ok(info) => Ok(ControlPlane {
                    info,
                    launcher: Mutex::new(None),
                    replies: Mutex::new(None),
                    commands: tokio::sync::Mutex::new(()),
                }),
                Err(e) => Err(format!("{ATTACH_ENV}: {e:#}")),
            },
            _ => ControlPlane::try_start().map_err(|e| format!("{e:#}")),
        });
        match shared {
            Ok(cp) => cp,
            Err(e) => panic!("starting the shared control plane failed: {e}"),
        }
    }

    /// One control plane per test module with the snapshot CRDs installed
    /// and the real snapshot-controller running (`cluster serve
    /// --snapshots`), started on first use. [`ControlPlane::shared`] has
    /// neither: there, the snapshot API is not installed.
    #[track_caller]
    pub fn with_snapshots() -> &'static ControlPlane {
        static SNAPSHOTS: PerModule = PerModule::new();
        let cp = SNAPSHOTS.get(Location::caller().file(), || {
            ControlPlane::spawn_launcher(&launcher_bin(), &["--snapshots"]).map_err(|e| format!("{e:#}"))
        });
        match cp {
            Ok(cp) => cp,
            Err(e) => panic!("starting the control plane with snapshots failed: {e}"),
        }
    }

    /// One control plane per test module with kube-scheduler and one hollow
    /// kubelet (`cluster serve --nodes 1`, the node in `info().nodes[0]`),
    /// started on first use.
    #[track_caller]
    pub fn with_node() -> &'static ControlPlane {
        static NODE: PerModule = PerModule::new();
        let cp = NODE.get(Location::caller().file(), || {
            ControlPlane::spawn_launcher(&launcher_bin(), &["--nodes", "1"]).map_err(|e| format!("{e:#}"))
        });
        match cp {
            Ok(cp) => cp,
            Err(e) => panic!("starting the control plane with a node failed: {e}"),
        }
    }

    /// One control plane per process with kube-scheduler, the workload
    /// controllers and a real node (containerd and the kubelet, `cluster
    /// serve --real-node DIR`, the node in `info().real_node`), started on
    /// first use, with the images of [`node_images`]: a host has one real
    /// node, so every module shares it.
    pub fn with_real_node() -> &'static ControlPlane {
        static REAL: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let cp = REAL.get_or_init(|| {
            let images = node_images().map_err(|e| format!("{e:#}"))?;
            ControlPlane::spawn_launcher(&launcher_bin(), &["--real-node", &images.display().to_string()])
                .map_err(|e| format!("{e:#}"))
        });
        match cp {
            Ok(cp) => cp,
            Err(e) => panic!("starting the control plane with a real node failed: {e}"),
        }
    }

    /// What the launcher reported.
    pub fn info(&self) -> &ClusterInfo {
        &self.info
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.info.kubeconfig
    }

    /// An admin client (a new one per call: clients are bound to the tokio runtime
    /// that created them, and every `#[tokio::test]` has its own).
    pub async fn client(&self) -> kube::Client {
        client_from_kubeconfig(&self.info.kubeconfig).await.expect("admin client")
    }

    /// Mints a kubeconfig for `identity` under `<run_dir>/users/` (see [`mint_kubeconfig`]).
    pub fn mint(&self, identity: &Identity) -> PathBuf {
        self.info.mint(identity).unwrap_or_else(|e| panic!("minting a kubeconfig for {identity:?}: {e:#}"))
    }

    /// A client authenticated as `identity`.
    pub async fn client_as(&self, identity: &Identity) -> kube::Client {
        client_from_kubeconfig(&self.mint(identity)).await.expect("client")
    }

    /// Marks the run failed, so that its directory is kept.
    pub fn mark_failed(&self, why: &str) {
        mark_failed(&self.info.run_dir, why);
    }

    /// Restarts kube-apiserver (same flags, port and etcd) through the launcher
    /// and returns once it answers `/readyz` again. The launcher does not count
    /// this as a component failure. Clients keep working after reconnecting;
    /// watches end and are resumed or relisted by their clients. Not available
    /// for an attached cluster (`$CSI_SIDECAR_CLUSTER_INFO`).
    pub async fn restart_apiserver(&self) -> Result<Restarted> {
        let _one = self.commands.lock().await;
        self.send_command(LauncherCommand::RestartApiserver)?;
        match self.next_reply(Duration::from_secs(180)).await? {
            CommandReply::Restarted(r) => Ok(r),
            CommandReply::Error(e) => bail!("the launcher could not restart kube-apiserver: {e}"),
        }
    }

    pub(crate) fn send_command(&self, cmd: LauncherCommand) -> Result<()> {
        let mut guard = self.launcher.lock().map_err(|_| anyhow!("launcher lock poisoned"))?;
        let (_, stdin) = guard.as_mut().ok_or_else(|| anyhow!("no launcher owned by this process"))?;
        writeln!(stdin, "{}", cmd.line()).and_then(|()| stdin.flush()).context("write to the launcher's stdin")
    }

    /// Polls for the launcher's next stdout line without blocking the runtime.
    pub(crate) async fn next_reply(&self, timeout: Duration) -> Result<CommandReply> {
        use std::sync::mpsc::TryRecvError;
        let start = Instant::now();
        loop {
            let got = {
                let guard = self.replies.lock().map_err(|_| anyhow!("replies lock poisoned"))?;
                let rx = guard.as_ref().ok_or_else(|| anyhow!("no launcher owned by this process"))?;
                rx.try_recv()
            };
            match got {
                Ok(line) => {
                    return serde_json::from_str(&line).with_context(|| format!("the launcher answered {line:?}"));
                }
                Err(TryRecvError::Disconnected) => bail!("the launcher closed its stdout"),
                Err(TryRecvError::Empty) if start.elapsed() > timeout => {
                    bail!("the launcher did not answer within {timeout:?}")
                }
                Err(TryRecvError::Empty) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The launcher's PID (None for an attached cluster).
    pub fn launcher_pid(&self) -> Option<u32> {
        self.launcher.lock().ok()?.as_ref().map(|(c, _)| c.id())
    }

    /// Closes the launcher's stdin and waits up to `timeout` for it to stop the
    /// cluster; SIGKILLs it after that. Returns its exit status (None if it had to
    /// be killed, or for an attached cluster).
    pub fn stop_within(&self, timeout: Duration) -> Option<ExitStatus> {
        let (mut child, stdin) = self.launcher.lock().ok()?.take()?;
        if let Ok(mut runs) = LIVE_RUNS.lock() {
            runs.retain(|r| r != &self.info.run_dir);
        }
        drop(stdin);
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("cluster: launcher {} did not stop within {timeout:?}; SIGKILL", child.id());
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// [`ControlPlane::stop_within`] 60 s.
    pub fn stop(self) -> Option<ExitStatus> {
        self.stop_within(Duration::from_secs(60))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.mark_failed("dropped while panicking");
        }
        self.stop_within(Duration::from_secs(60));
    }
}

/// Builds the real node's images (`integration/scripts/node-images.sh`)
/// once per test process, with the csi-sidecar binary the tests run, into
/// `target/node-images/<pid>` (those of exited processes are removed);
/// returns the directory.
pub fn node_images() -> Result<PathBuf> {
    static IMAGES: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    IMAGES
        .get_or_init(|| {
            let parent = workspace_root().join("target").join("node-images");
            // Directories of test processes that are gone.
            for old in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                let pid = old.file_name().to_string_lossy().into_owned();
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(&pid).exists() {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
            let dir = parent.join(std::process::id().to_string());
            let out = Command::new("bash")
                .arg(workspace_root().join("integration/scripts/node-images.sh"))
                .arg("--out")
                .arg(&dir)
                .arg("--sidecar-binary")
                .arg(crate::sidecar_bin())
                .output()
                .map_err(|e| format!("run node-images.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "node-images.sh failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(dir)
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn identities() {
        let sa = Identity::service_account("ns1", "reader");
        assert_eq!(sa.username(), "system:serviceaccount:ns1:reader");
        assert_eq!(sa.groups(), ["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"]);
        assert_eq!(Identity::parse_service_account("ns1/reader").unwrap(), sa);
        assert_eq!(Identity::parse_service_account("system:serviceaccount:ns1:reader").unwrap(), sa);
        assert!(Identity::parse_service_account("reader").is_err());
        assert_eq!(sa.file_stem(), "sa-ns1-reader");
        assert_eq!(Identity::user("a:b", &["g"]).file_stem(), "user-a_b");
    }

    #[test]
    pub(crate) fn launcher_commands_parse_and_round_trip() {
        let cmd = LauncherCommand::RestartApiserver;
        assert_eq!(LauncherCommand::parse(cmd.line()), Ok(cmd));
        assert_eq!(LauncherCommand::parse("  restart   kube-apiserver "), Ok(cmd));
        assert!(LauncherCommand::parse("restart etcd").unwrap_err().contains("only kube-apiserver"));
        assert!(LauncherCommand::parse("stop").unwrap_err().contains("unknown command"));
        let reply = CommandReply::Restarted(Restarted { component: "kube-apiserver".into(), pid: 7, ms: 9 });
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(text, r#"{"restarted":{"component":"kube-apiserver","pid":7,"ms":9}}"#);
        assert_eq!(serde_json::from_str::<CommandReply>(&text).unwrap(), reply);
        assert_eq!(serde_json::to_string(&CommandReply::Error("x".into())).unwrap(), r#"{"error":"x"}"#);
    }

    #[test]
    pub(crate) fn pki_and_minted_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        generate_pki(dir.path()).unwrap();
        for f in ["ca.crt", "ca.key", "client-ca.crt", "client-ca.key", "apiserver.crt", "sa.key"] {
            assert!(dir.path().join(f).is_file(), "{f}");
        }
        let out = dir.path().join("u.kubeconfig");
        write_kubeconfig(dir.path(), "https://127.0.0.1:1", &Identity::user("u", &["g1", "g2"]), &out).unwrap();
        let kc = kube::config::Kubeconfig::read_from(&out).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("csi-sidecar-itest"));
        assert_eq!(kc.auth_infos[0].name, "u");
        assert_eq!(pem_to_der(&std::fs::read_to_string(dir.path().join("ca.crt")).unwrap()).unwrap()[0], 0x30);
    }

    #[test]
    pub(crate) fn client_cert_carries_every_group() {
        let dir = tempfile::tempdir().unwrap();
        generate_pki(dir.path()).unwrap();
        let (pem, _) = issue_client_cert(dir.path(), &Identity::service_account("ns1", "x")).unwrap();
        let der = pem_to_der(&pem).unwrap();
        let has = |s: &str| der.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has("system:serviceaccount:ns1:x"));
        assert!(has("system:serviceaccounts:ns1") && has("system:authenticated"));
        // One O= RDN per group: OID 2.5.4.10 three times.
        assert_eq!(der.windows(5).filter(|w| *w == [0x06, 0x03, 0x55, 0x04, 0x0a]).count(), 3);
    }
}
