//! The launcher (`cluster serve`): starts the components in order, reports the
//! cluster, supervises it, answers commands on stdin, tears it down.

#[allow(unused_imports)]
use super::*;

/// Options of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Use this (new or empty) run directory instead of a fresh one under [`runs_dir`].
    pub run_dir: Option<PathBuf>,
    /// Keep the run directory after a clean run.
    pub keep: bool,
    /// Also write the JSON line to this file (atomically) when ready.
    pub info_file: Option<PathBuf>,
    /// Stop when stdin reaches EOF (false: only on a signal).
    pub watch_stdin: bool,
    /// Only errors and the "kept" notice on stderr (everything still goes to `cluster.log`).
    pub quiet: bool,
    /// How long each component gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Extra kube-apiserver flags (e.g. `--feature-gates=WatchList=false`).
    pub apiserver_args: Vec<String>,
    /// Install the snapshot CRDs and run the common snapshot-controller
    /// (both from the component cache: `snapshot-controller` and the `crd/`
    /// directory next to it).
    pub snapshots: bool,
    /// Run kube-scheduler and this many hollow kubelets (kubemark's kubelet
    /// with a fake runtime and mounter; `hollow-node` in the component
    /// cache); kube-controller-manager then also runs the node lifecycle
    /// controller, which lifts the not-ready taint of a new node.
    pub nodes: u32,
    /// Run a real node (containerd and the kubelet, `cluster serve
    /// --real-node DIR`) with the image archives of this directory
    /// (`integration/scripts/node-images.sh --out DIR`); kube-scheduler and
    /// the controllers that run workloads (Deployments, DaemonSets, the
    /// garbage collector, ServiceAccounts, the root CA ConfigMap) come with it.
    pub real_node_images: Option<PathBuf>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            run_dir: None,
            keep: false,
            info_file: None,
            watch_stdin: true,
            quiet: false,
            grace: Duration::from_secs(10),
            apiserver_args: Vec::new(),
            snapshots: false,
            nodes: 0,
            real_node_images: None,
        }
    }
}

/// The parent of run directories: `$CSI_SIDECAR_CLUSTER_DIR`, else
/// `<workspace>/target/cluster-runs`.
pub fn runs_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => workspace_root().join("target").join("cluster-runs"),
    }
}

pub(super) fn env_flag(name: &str) -> bool {
    std::env::var(name).map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on")).unwrap_or(false)
}

pub(super) fn new_run_dir() -> Result<PathBuf> {
    let base = runs_dir();
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("run-{}-", std::process::id()))
        .tempdir_in(&base)
        .with_context(|| format!("create a run dir in {}", base.display()))?;
    Ok(std::fs::canonicalize(dir.keep())?)
}

pub(super) async fn start_components(
    run_dir: &Path,
    log: &Log,
    running: &mut Running,
    t0: Instant,
    opts: &ServeOptions,
    nodes_base: Option<PathBuf>,
) -> Result<ClusterInfo> {
    let apiserver_args = &opts.apiserver_args;
    let real_node = opts.real_node_images.is_some();
    let pki = run_dir.join("pki");
    let log_dir = run_dir.join("logs");
    std::fs::create_dir_all(&log_dir)?;
    let [etcd_port, etcd_peer, api_port, kcm_port] = free_ports::<4>()?;
    let api_url = format!("https://127.0.0.1:{api_port}");
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let kcm_url = format!("https://127.0.0.1:{kcm_port}");

    generate_pki(&pki)?;
    let kubeconfig = run_dir.join("admin.kubeconfig");
    write_kubeconfig(&pki, &api_url, &Identity::user(ADMIN_USER, &["system:masters"]), &kubeconfig)?;
    let pki_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("PKI and admin kubeconfig in {pki_ms} ms"));

    let etcd_bin = component_bin("etcd");
    let api_bin = component_bin("kube-apiserver");
    let kcm_bin = component_bin("kube-controller-manager");
    let p = |name: &str| pki.join(name).display().to_string();
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    let version = versions::binary_version(&api_bin)?;
    let version_flags = versions::flags_for(versions::Component::KubeApiserver, version);
    for f in &version_flags {
        log.info(&format!("kube-apiserver {}.{}: {} ({})", version.0, version.1, f.flag, f.reason));
    }

    // etcd
    let args: Vec<String> = vec![
        "--name=itest".into(),
        format!("--data-dir={}", run_dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=itest={peer_url}"),
        "--unsafe-no-fsync".into(),
        // One member on loopback: elect it quickly.
        "--heartbeat-interval=20".into(),
        "--election-timeout=200".into(),
        "--log-level=warn".into(),
    ];
    running.comps.push(Component::spawn("etcd", &etcd_bin, &args, &log_dir)?);
    let etcd_addr = format!("127.0.0.1:{etcd_port}");
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no etcd"))?;
    wait_ready(comp, "/health", Duration::from_secs(30), async || {
        let r = crate::http::get(&etcd_addr, "/health").await.map_err(|e| anyhow!(e))?;
        Ok(r.status == 200 && r.body.contains("\"health\":\"true\""))
    })
    .await?;
    let etcd_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("etcd ready on {etcd_url} at {etcd_ms} ms"));

    // kube-apiserver
    let args: Vec<String> = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--client-ca-file={}", p("client-ca.crt")),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer={api_url}"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        // Pods get their ServiceAccount token volume only on a real node
        // (elsewhere no pod runs, and the admission would want the
        // ServiceAccount controller).
        if real_node {
            "--enable-admission-plugins=ServiceAccount".into()
        } else {
            "--disable-admission-plugins=ServiceAccount".into()
        },
        "--endpoint-reconciler-type=none".into(),
        "--allow-privileged=true".into(),
        // Logs, exec and port-forward through the kubelet (a real node):
        // the apiserver's client certificate, and the kubelet's serving
        // certificate checked against the server CA.
        format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
        format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
        format!("--kubelet-certificate-authority={}", p("ca.crt")),
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        "-v=1".into(),
    ]
    .into_iter()
    .chain(version_flags.iter().map(|f| f.flag.to_string()))
    .chain(apiserver_args.iter().cloned())
    .collect();
    running.comps.push(Component::spawn("kube-apiserver", &api_bin, &args, &log_dir)?);
    let admin = client_from_kubeconfig(&kubeconfig).await?;
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no apiserver"))?;
    wait_ready(comp, "/readyz", Duration::from_secs(90), async || Ok(get_text(&admin, "/readyz").await? == "ok"))
        .await?;
    let api_ms = t0.elapsed().as_millis() as u64;
    let version: serde_json::Value = serde_json::from_str(&get_text(&admin, "/version").await?)?;
    let kube_version = version["gitVersion"].as_str().unwrap_or_default().to_string();
    log.info(&format!("kube-apiserver {kube_version} ready on {api_url} at {api_ms} ms"));

    // kube-controller-manager
    let kc = kubeconfig.display().to_string();
    let args: Vec<String> = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        if real_node {
            format!("--controllers={KCM_CONTROLLERS},node-lifecycle-controller,{KCM_WORKLOAD_CONTROLLERS}")
        } else if opts.nodes > 0 {
            format!("--controllers={KCM_CONTROLLERS},node-lifecycle-controller")
        } else {
            format!("--controllers={KCM_CONTROLLERS}")
        },
        format!("--root-ca-file={}", p("ca.crt")),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={kcm_port}"),
        format!("--tls-cert-file={}", p("kube-controller-manager.crt")),
        format!("--tls-private-key-file={}", p("kube-controller-manager.key")),
        "--use-service-account-credentials=false".into(),
        "-v=2".into(),
    ];
    running.comps.push(Component::spawn("kube-controller-manager", &kcm_bin, &args, &log_dir)?);
    let mut kcm_config = kube::Config::new(kcm_url.parse()?);
    kcm_config.root_cert = Some(vec![pem_to_der(&std::fs::read_to_string(pki.join("ca.crt"))?)?]);
    kcm_config.connect_timeout = Some(Duration::from_secs(5));
    kcm_config.read_timeout = Some(Duration::from_secs(10));
    let kcm = kube::Client::try_from(kcm_config)?;
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no kcm"))?;
    wait_ready(comp, "/healthz", Duration::from_secs(60), async || Ok(get_text(&kcm, "/healthz").await? == "ok"))
        .await?;
    let kcm_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("kube-controller-manager ready on {kcm_url} at {kcm_ms} ms"));

    if opts.snapshots {
        install_snapshot_crds(&admin, log).await?;
        start_snapshot_controller(&kubeconfig, &log_dir, running).await?;
        log.info(&format!("snapshot CRDs and snapshot-controller ready at {} ms", t0.elapsed().as_millis()));
    }
    let mut nodes = Vec::new();
    let mut real = None;
    if opts.nodes > 0 || real_node {
        world::start_scheduler(&kubeconfig, &log_dir, running).await?;
        log.info(&format!("kube-scheduler ready at {} ms", t0.elapsed().as_millis()));
    }
    if opts.nodes > 0 {
        let base = nodes_base.as_deref().ok_or_else(|| anyhow!("no directory for the nodes"))?;
        nodes = world::start_nodes(opts.nodes, base, &kubeconfig, &admin, &log_dir, running).await?;
        log.info(&format!("{} hollow nodes Ready at {} ms", nodes.len(), t0.elapsed().as_millis()));
    }
    if let Some(images) = &opts.real_node_images {
        let base = nodes_base.as_deref().ok_or_else(|| anyhow!("no directory for the nodes"))?;
        let client_ca = pki.join("client-ca.crt");
        let (cert, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
        let inputs = super::real_node::NodeInputs {
            base,
            images,
            client_ca: &client_ca,
            serving: (&cert, &key),
            kubeconfig: &kubeconfig,
        };
        let node = super::real_node::start_real_node(inputs, &admin, &log_dir, running, log).await?;
        log.info(&format!("real node {} Ready at {} ms", node.name, t0.elapsed().as_millis()));
        real = Some(node);
    }

    let pid = |name: &str| running.comps.iter().find(|c| c.name == name).map(Component::pid).unwrap_or(0);
    Ok(ClusterInfo {
        run_dir: run_dir.to_path_buf(),
        kubeconfig,
        api_url,
        ca_cert: pki.join("ca.crt"),
        client_ca_cert: pki.join("client-ca.crt"),
        etcd_url,
        kcm_url,
        log_dir,
        ports: Ports { etcd: etcd_port, etcd_peer, apiserver: api_port, kcm: kcm_port },
        pids: Pids {
            launcher: std::process::id(),
            etcd: pid("etcd"),
            kube_apiserver: pid("kube-apiserver"),
            kube_controller_manager: pid("kube-controller-manager"),
            snapshot_controller: Some(pid(SNAPSHOT_CONTROLLER)).filter(|p| *p != 0),
            kube_scheduler: Some(pid(world::SCHEDULER)).filter(|p| *p != 0),
        },
        startup_ms: StartupMs { pki: pki_ms, etcd: etcd_ms, apiserver: api_ms, kcm: kcm_ms },
        nodes,
        kube_version,
        real_node: real,
    })
}

pub(super) fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(b64.trim())?)
}

/// Why the launcher stopped waiting.
pub(super) enum StopReason {
    Requested(&'static str),
    ComponentExited(&'static str, ExitStatus),
}

/// Runs the launcher: starts the cluster, prints the [`ClusterInfo`] JSON line on
/// stdout (or `{"error": ..., "run_dir": ...}` and exit code 1 on failure), waits
/// for stdin EOF or a signal, stops the cluster and deletes or keeps the run
/// directory. Returns the process exit code.
pub async fn serve(opts: ServeOptions) -> Result<i32> {
    let t0 = Instant::now();
    let run_dir = match &opts.run_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            std::fs::canonicalize(d)?
        }
        None => new_run_dir()?,
    };
    std::fs::create_dir_all(run_dir.join("logs"))?;
    let log = Log {
        file: Mutex::new(
            std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join("logs").join("cluster.log")).ok(),
        ),
        quiet: opts.quiet,
    };
    log.info(&format!("run dir {}", run_dir.display()));

    // Signals first, so that a SIGTERM during startup is not lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;

    // stdin: a plain thread (a blocking read must not keep the runtime alive)
    // forwarding command lines, then EOF.
    let (stdin_tx, mut stdin_rx) = tokio::sync::oneshot::channel::<()>();
    let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Without stdin watching, the senders stay here so the receivers never fire.
    let _unused_senders = if opts.watch_stdin {
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut line = Vec::new();
            while let Ok(n) = stdin.read_until(b'\n', &mut line) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&line).trim().to_string();
                if !text.is_empty() {
                    let _ = cmd_tx.send(text);
                }
                line.clear();
            }
            let _ = stdin_tx.send(());
        });
        None
    } else {
        Some((stdin_tx, cmd_tx))
    };

    let mut running = Running::default();
    // The nodes' root directories hold sockets: a short path outside the run
    // directory, removed at every teardown (the kubelet leaves them behind).
    let nodes_base = if opts.nodes > 0 || opts.real_node_images.is_some() { Some(world::nodes_base()?) } else { None };
    let remove_nodes_base = || {
        if let Some(b) = &nodes_base {
            let _ = std::fs::remove_dir_all(b);
        }
    };
    let started = tokio::select! {
        r = start_components(&run_dir, &log, &mut running, t0, &opts, nodes_base.clone()) => Ok(r),
        _ = sigterm.recv() => Err("SIGTERM"),
        _ = sigint.recv() => Err("SIGINT"),
        _ = sighup.recv() => Err("SIGHUP"),
        _ = &mut stdin_rx => Err("stdin closed"),
    };
    let started = match started {
        Ok(Ok(info)) => Ok(info),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(why) => Err(format!("interrupted during startup ({why})")),
    };
    let mut info = match started {
        Ok(info) => info,
        Err(msg) => {
            log.error(&format!("startup failed: {msg}"));
            running.stop(opts.grace, &log).await;
            remove_nodes_base();
            let _ = write_file(&run_dir.join(FAILED_MARKER), &format!("startup failed: {msg}\n"), false);
            let line = serde_json::json!({"error": msg, "run_dir": run_dir});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            log.error(&format!("run dir kept: {}", run_dir.display()));
            return Ok(1);
        }
    };

    // From here on the components run: no early return, every failure ends in the
    // ordered teardown below.
    let line = serde_json::to_string(&info).unwrap_or_default();
    let mut report_failed = None;
    for f in std::iter::once(run_dir.join(INFO_FILE)).chain(opts.info_file.clone()) {
        if let Err(e) = write_file(&f, &format!("{line}\n"), false) {
            report_failed = Some(format!("cannot write {}: {e:#}", f.display()));
        }
    }
    {
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            report_failed = Some(format!("cannot write to stdout: {e}"));
        }
    }
    log.info(&format!(
        "ready in {} ms: KUBECONFIG={} ({})",
        info.startup_ms.kcm,
        info.kubeconfig.display(),
        info.api_url
    ));
    if let Some(msg) = &report_failed {
        log.error(msg);
    }

    let mut check = tokio::time::interval(Duration::from_millis(250));
    let reason = loop {
        if report_failed.is_some() {
            break StopReason::Requested("reporting failed");
        }
        tokio::select! {
            _ = &mut stdin_rx => break StopReason::Requested("stdin closed"),
            _ = sigterm.recv() => break StopReason::Requested("SIGTERM"),
            _ = sigint.recv() => break StopReason::Requested("SIGINT"),
            _ = sighup.recv() => break StopReason::Requested("SIGHUP"),
            Some(line) = cmd_rx.recv() => {
                // Supervision pauses while a command runs: a component it
                // restarts on purpose is not a failure.
                let reply = run_command(&line, &mut running, &mut info, &opts, &log).await;
                let text = serde_json::to_string(&reply).unwrap_or_default();
                let mut out = std::io::stdout().lock();
                if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
                    report_failed = Some(format!("cannot write to stdout: {e}"));
                }
            }
            _ = check.tick() => {
                if let Some((name, status)) = running.first_exited() {
                    break StopReason::ComponentExited(name, status);
                }
            }
        }
    };
    let mut failed = false;
    match &reason {
        StopReason::ComponentExited(name, status) => {
            failed = true;
            let msg = format!("{name} exited unexpectedly ({status}); stopping the cluster");
            log.error(&msg);
            let _ = write_file(&run_dir.join(FAILED_MARKER), &format!("{msg}\n"), false);
        }
        StopReason::Requested(why) => log.info(&format!("stopping ({why})")),
    }
    let t_stop = Instant::now();
    let clean = running.stop(opts.grace, &log).await;
    remove_nodes_base();
    log.info(&format!("stopped in {} ms", t_stop.elapsed().as_millis()));
    failed |= !clean;

    let marked = run_dir.join(FAILED_MARKER).exists();
    if failed || marked || opts.keep || env_flag(KEEP_ENV) {
        let why = if failed {
            "a component failed"
        } else if marked {
            "a test failed"
        } else {
            "keep requested"
        };
        log.error(&format!("run dir kept ({why}): {} (logs in {})", run_dir.display(), info.log_dir.display()));
    } else {
        drop(log);
        if let Err(e) = std::fs::remove_dir_all(&run_dir) {
            let _ = writeln!(std::io::stderr(), "cluster: could not delete {}: {e}", run_dir.display());
        }
    }
    Ok(if failed { 1 } else { 0 })
}
