//! A real node (`cluster serve --real-node`): Debian's containerd with runc
//! and the kubelet built from `k8s.io/kubernetes` (`cmd/kubelet`), running
//! host-network pods from images imported from local archives (see
//! `integration/scripts/node-images.sh`). Everything the node creates is
//! recorded in a [`Footprint`] and removed when the launcher stops.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use super::{Component, Log, Running, free_ports, wait_ready};
use crate::component_bin;

mod config;
mod host;

pub use config::{KubeletSettings, NodeDirs, PAUSE_IMAGE, containerd_toml, kubelet_yaml};
pub use host::Footprint;

/// The real node's name, which is also its address: a kubelet whose
/// hostname override is an IP reports it as the node's InternalIP, so
/// host-network pods get 127.0.0.1 as their IP and the kubelet's probes stay
/// on loopback.
pub const REAL_NODE_NAME: &str = "127.0.0.1";

/// The component names (and log files) of the node's processes.
pub(crate) const CONTAINERD: &str = "containerd";
pub(crate) const KUBELET: &str = "kubelet";

/// The real node the launcher runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RealNodeInfo {
    /// The Node's name ([`REAL_NODE_NAME`]).
    pub name: String,
    /// The kubelet's root directory (the chart's `node.kubeletDir`).
    pub root_dir: PathBuf,
    /// Where a node-driver-registrar puts its socket (`<root>/plugins_registry`).
    pub registration_dir: PathBuf,
    /// The containers' log files (`<pod-logs>/<namespace>_<pod>_<uid>/<container>/N.log`).
    pub pod_logs_dir: PathBuf,
    /// containerd's socket (`ctr -a <socket> -n k8s.io ...`).
    pub containerd_socket: PathBuf,
    /// The images imported into containerd (full references).
    pub images: Vec<String>,
    /// The kubelet's HTTPS port on 127.0.0.1 (client certificates of the
    /// cluster's client CA; `/metrics/probes`, `/pods`).
    pub kubelet_port: u16,
    /// The kubelet's `/healthz` on 127.0.0.1.
    pub kubelet_healthz_port: u16,
    /// PIDs.
    pub kubelet_pid: u32,
    /// containerd's PID.
    pub containerd_pid: u32,
    /// What the node owns on the host (removed at teardown).
    pub footprint: Footprint,
}

/// What the real node needs from the host, checked before anything starts.
fn preflight(images: &Path) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("the real node needs root (containerd, cgroups, mounts)");
    }
    for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"] {
        if which(tool).is_none() {
            bail!(
                "the real node needs {tool}: apt-get install -y containerd runc containernetworking-plugins \
                 (.ci/run installs them)"
            );
        }
    }
    let loopback = Path::new(config::CNI_BIN_DIR).join("loopback");
    if !loopback.exists() {
        bail!("the real node needs {}: apt-get install -y containernetworking-plugins", loopback.display());
    }
    let pause = images.join("pause.tar");
    if !pause.exists() {
        bail!("no {} (build the node's images with integration/scripts/node-images.sh --out DIR)", pause.display());
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
}

/// `ctr` against the node's containerd, in the CRI's namespace.
fn ctr(socket: &Path, args: &[&str]) -> Result<String> {
    let out =
        Command::new("ctr").arg("-a").arg(socket).args(["-n", "k8s.io"]).args(args).output().context("run ctr")?;
    if !out.status.success() {
        bail!(
            "ctr {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until no other real node is on this host and returns the lock that
/// keeps it so (held until the node's footprint is removed; the kernel drops
/// it when the process ends). Two nodes at once would share /run/containerd
/// and the kernel tunables, and each footprint would see the other's
/// leftovers: test processes that run at the same time take turns here.
async fn one_node_per_host(log: &Log) -> Result<std::fs::File> {
    let path = std::env::temp_dir().join("csi-sidecar-real-node.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    if file.try_lock().is_ok() {
        return Ok(file);
    }
    log.info("another real node runs on this host; waiting for it to stop");
    let waited = Instant::now();
    let file = tokio::task::spawn_blocking(move || file.lock().map(|()| file)).await??;
    log.info(&format!("the other real node stopped after {} s", waited.elapsed().as_secs()));
    Ok(file)
}

/// What a real node is started from.
pub(super) struct NodeInputs<'a> {
    /// The parent of the node's directory.
    pub base: &'a Path,
    /// The image archives to import (`pause.tar` among them).
    pub images: &'a Path,
    /// The CA of the client certificates the kubelet accepts.
    pub client_ca: &'a Path,
    /// The kubelet's serving certificate and key.
    pub serving: (&'a Path, &'a Path),
    /// The kubelet's kubeconfig.
    pub kubeconfig: &'a Path,
}

/// The CNI plugins containerd runs, in `dir`: Debian's `loopback` (a link)
/// and `lo-eth0` ([`config::CNI_LO_ETH0_PLUGIN`]).
fn install_cni_plugins(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let loopback = Path::new(config::CNI_BIN_DIR).join("loopback");
    std::os::unix::fs::symlink(&loopback, dir.join("loopback"))
        .with_context(|| format!("link {}", loopback.display()))?;
    let plugin = dir.join("lo-eth0");
    std::fs::write(&plugin, config::CNI_LO_ETH0_PLUGIN).with_context(|| format!("write {}", plugin.display()))?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Starts containerd and the kubelet in `base/r1`, imports every `*.tar` of
/// `images`, and waits until the Node is Ready. The footprint is handed to
/// `running` first, so a failed start is cleaned up like a stopped node.
pub(super) async fn start_real_node(
    inputs: NodeInputs<'_>,
    admin: &kube::Client,
    log_dir: &Path,
    running: &mut Running,
    log: &Log,
) -> Result<RealNodeInfo> {
    let NodeInputs { base, images, client_ca, serving, kubeconfig } = inputs;
    preflight(images)?;
    running.host_locks.push(one_node_per_host(log).await?);
    let dirs = NodeDirs { base: base.join("r1") };
    let cgroup_root = format!("/csn-{}-r1", std::process::id());
    let footprint = Footprint::record(&dirs.base, &dirs.containerd_socket(), &cgroup_root, &log_dir.join("pods"));
    running.footprints.push(footprint.clone());
    std::fs::create_dir_all(dirs.cni_conf()).with_context(|| format!("create {}", dirs.cni_conf().display()))?;
    std::fs::write(dirs.cni_conf().join("10-loopback.conflist"), config::CNI_LOOPBACK_CONFLIST)?;
    install_cni_plugins(&dirs.cni_bin())?;
    std::fs::write(dirs.containerd_config(), containerd_toml(&dirs))?;
    footprint.create_cgroups().context("create the node's cgroup root")?;

    // containerd
    let containerd = which("containerd").ok_or_else(|| anyhow!("no containerd"))?;
    let args = vec!["--config".to_string(), dirs.containerd_config().display().to_string()];
    running.comps.push(Component::spawn(CONTAINERD, &containerd, &args, log_dir)?);
    let socket = dirs.containerd_socket();
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no containerd"))?;
    wait_ready(comp, "its socket", Duration::from_secs(30), async || {
        Ok(socket.exists() && ctr(&socket, &["version"]).is_ok())
    })
    .await?;
    let containerd_pid = comp.pid();
    let mut archives: Vec<PathBuf> = std::fs::read_dir(images)
        .with_context(|| format!("read {}", images.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    archives.sort();
    for a in &archives {
        ctr(&socket, &["images", "import", &a.display().to_string()])?;
    }
    let images_now: Vec<String> = ctr(&socket, &["images", "ls", "-q"])?
        .lines()
        .filter(|l| !l.starts_with("sha256:"))
        .map(str::to_string)
        .collect();
    if !images_now.iter().any(|i| i == PAUSE_IMAGE) {
        bail!("{PAUSE_IMAGE} is not among the imported images {images_now:?}");
    }
    log.info(&format!("containerd ready with {} images: {}", images_now.len(), images_now.join(" ")));

    // kubelet
    let [port, healthz_port] = free_ports::<2>()?;
    let settings = KubeletSettings {
        port,
        healthz_port,
        client_ca: client_ca.to_path_buf(),
        serving: (serving.0.to_path_buf(), serving.1.to_path_buf()),
        cgroup_root: cgroup_root.clone(),
    };
    std::fs::write(dirs.kubelet_config(), kubelet_yaml(&dirs, &settings))?;
    let root = dirs.kubelet_root();
    std::fs::create_dir_all(&root)?;
    let args: Vec<String> = vec![
        format!("--config={}", dirs.kubelet_config().display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--root-dir={}", root.display()),
        format!("--cert-dir={}", dirs.base.join("kubelet-pki").display()),
        format!("--hostname-override={REAL_NODE_NAME}"),
        "-v=2".into(),
    ];
    running.comps.push(Component::spawn(KUBELET, &component_bin(KUBELET), &args, log_dir)?);
    let kubelet_pid = running.comps.last().map(Component::pid).unwrap_or(0);
    wait_node_ready(admin, running, kubelet_pid, Duration::from_secs(120)).await?;
    Ok(RealNodeInfo {
        name: REAL_NODE_NAME.into(),
        registration_dir: root.join("plugins_registry"),
        root_dir: root,
        pod_logs_dir: dirs.pod_logs(),
        containerd_socket: socket,
        images: images_now,
        kubelet_port: port,
        kubelet_healthz_port: healthz_port,
        kubelet_pid,
        containerd_pid,
        footprint,
    })
}

async fn wait_node_ready(
    admin: &kube::Client,
    running: &mut Running,
    kubelet_pid: u32,
    within: Duration,
) -> Result<()> {
    let api: kube::Api<Node> = kube::Api::all(admin.clone());
    let deadline = Instant::now() + within;
    let mut last = String::from("no Node yet");
    loop {
        for c in running.comps.iter_mut().filter(|c| c.name == KUBELET || c.name == CONTAINERD) {
            if let Some(status) = c.exited() {
                bail!("{} exited ({status}) before the node was Ready; last lines:\n{}", c.name, c.log_tail(40));
            }
        }
        if let Some(node) = api.get_opt(REAL_NODE_NAME).await.ok().flatten() {
            let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
            if let Some(ready) = conditions.iter().find(|c| c.type_ == "Ready") {
                if ready.status == "True" {
                    return Ok(());
                }
                last = format!("Ready={}: {}", ready.status, ready.message.clone().unwrap_or_default());
            }
        }
        if Instant::now() > deadline {
            let tail =
                running.comps.iter().find(|c| c.pid() == kubelet_pid).map(|c| c.log_tail(40)).unwrap_or_default();
            bail!("node {REAL_NODE_NAME} not Ready within {within:?} ({last}); kubelet's last lines:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
