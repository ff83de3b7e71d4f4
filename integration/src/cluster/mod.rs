//! A real Kubernetes control plane on loopback: etcd, kube-apiserver and
//! kube-controller-manager (PV binder, attach-detach, PVC and PV protection).
//!
//! Two halves:
//!
//! * the **launcher** ([`serve`], run as `cluster serve` by the `cluster` binary)
//!   generates the PKI, starts the three components in a fresh run directory, prints
//!   one JSON line ([`ClusterInfo`]) on stdout when everything is ready, and tears
//!   the cluster down (kube-controller-manager, then kube-apiserver, then etcd;
//!   SIGKILL after a grace period) when its stdin reaches EOF or on
//!   SIGTERM/SIGINT/SIGHUP; lines on its stdin are commands ([`LauncherCommand`]:
//!   `restart kube-apiserver`), each answered by one JSON line ([`CommandReply`]);
//! * the **handle** ([`ControlPlane`]) used by tests: it spawns the launcher as a
//!   child process with a pipe on its stdin and parses the JSON line. The cluster's
//!   lifetime therefore never depends on `Drop` running: when the test process
//!   exits or is killed, the kernel closes the pipe and the launcher stops the
//!   cluster by itself.
//!
//! Run directories live under `target/cluster-runs/` of the workspace (or
//! `$CSI_SIDECAR_CLUSTER_DIR`). A run directory is deleted after a clean run and
//! kept (its path printed on stderr) when a test panicked, when a component had to
//! be killed or died, or when `CSI_SIDECAR_KEEP_CLUSTER=1`.
//!
//! Credentials: [`mint_kubeconfig`] issues a client certificate signed by the
//! cluster's client CA for any user/groups or ServiceAccount ([`Identity`]) and
//! writes a self-contained kubeconfig for it, so a process runs under exactly the
//! RBAC bound to that identity.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::{Mutex, Once, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use serde::{Deserialize, Serialize};

use crate::{component_bin, workspace_root};

mod commands;
mod component;
mod handle;
mod launcher;
mod per_module;
mod pki;
mod real_node;
pub mod versions;
mod world;

pub use commands::*;
pub(crate) use component::*;
pub use handle::*;
pub use launcher::*;
pub use pki::*;
pub use real_node::{Footprint, REAL_NODE_NAME, RealNodeInfo};
pub use world::NodeInfo;
use world::{SNAPSHOT_CONTROLLER, install_snapshot_crds, start_snapshot_controller};

/// Keep the run directory even after a clean run (`1`/`true`).
pub const KEEP_ENV: &str = "CSI_SIDECAR_KEEP_CLUSTER";
/// Parent directory for run directories (default: `<workspace>/target/cluster-runs`).
pub const DIR_ENV: &str = "CSI_SIDECAR_CLUSTER_DIR";
/// Path of the `cluster` launcher binary (default: next to the test executable).
pub const BIN_ENV: &str = "CSI_SIDECAR_CLUSTER_BIN";
/// `cluster.json` of an already running cluster for [`ControlPlane::shared`] to use
/// instead of starting one (e.g. one started with `cluster serve` in a terminal).
pub const ATTACH_ENV: &str = "CSI_SIDECAR_CLUSTER_INFO";

/// The file in a run directory that marks the run as failed (the directory is kept).
pub const FAILED_MARKER: &str = "FAILED";
/// The file in a run directory holding the [`ClusterInfo`] as JSON.
pub const INFO_FILE: &str = "cluster.json";

/// The user of the admin kubeconfig (group `system:masters`).
pub const ADMIN_USER: &str = "csi-sidecar-admin";
const SERVER_CA_CN: &str = "csi-sidecar-itest-ca";
const CLIENT_CA_CN: &str = "csi-sidecar-itest-client-ca";
const KCM_CONTROLLERS: &str = "persistentvolume-binder-controller,persistentvolume-attach-detach-controller,\
                               persistentvolumeclaim-protection-controller,persistentvolume-protection-controller,\
                               persistentvolume-expander-controller";
/// What a real node's workloads need besides the volume controllers.
const KCM_WORKLOAD_CONTROLLERS: &str = "deployment-controller,replicaset-controller,daemonset-controller,\
                                        statefulset-controller,namespace-controller,\
                                        garbage-collector-controller,serviceaccount-controller,\
                                        root-ca-certificate-publisher-controller,ephemeral-volume-controller,\
                                        resourcequota-controller";

/// What the launcher reports when the cluster is ready (the JSON line on its
/// stdout, also written to `<run_dir>/cluster.json`). All paths are absolute.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The run directory (PKI, etcd data, logs, kubeconfigs).
    pub run_dir: PathBuf,
    /// Admin kubeconfig (user [`ADMIN_USER`] in `system:masters`), self-contained.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub api_url: String,
    /// CA of the apiserver's (and kube-controller-manager's) serving certificate.
    pub ca_cert: PathBuf,
    /// CA the apiserver trusts for client certificates (`--client-ca-file`).
    pub client_ca_cert: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub etcd_url: String,
    /// `https://127.0.0.1:<port>` (kube-controller-manager's /healthz, /metrics).
    pub kcm_url: String,
    /// Component logs: `etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`, `cluster.log`.
    pub log_dir: PathBuf,
    /// Loopback ports.
    pub ports: Ports,
    /// Process IDs.
    pub pids: Pids,
    /// Milliseconds from the launcher's start until each step was done.
    pub startup_ms: StartupMs,
    /// The hollow nodes (`cluster serve --nodes N`), Ready when reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeInfo>,
    /// kube-apiserver's `/version` (`v1.36.3`; `$CSI_SIDECAR_KUBE_VERSION`
    /// selects the cluster's version, see `build-components.sh`).
    #[serde(default)]
    pub kube_version: String,
    /// The real node (`cluster serve --real-node DIR`), Ready when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_node: Option<RealNodeInfo>,
}

/// Loopback ports of a cluster.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ports {
    /// etcd client port.
    pub etcd: u16,
    /// etcd peer port.
    pub etcd_peer: u16,
    /// kube-apiserver secure port.
    pub apiserver: u16,
    /// kube-controller-manager secure port.
    pub kcm: u16,
}

/// Process IDs of a cluster.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pids {
    /// The launcher (`cluster serve`).
    pub launcher: u32,
    /// etcd.
    pub etcd: u32,
    /// kube-apiserver.
    pub kube_apiserver: u32,
    /// kube-controller-manager.
    pub kube_controller_manager: u32,
    /// The snapshot-controller, when the launcher runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_controller: Option<u32>,
    /// kube-scheduler, when the launcher runs nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_scheduler: Option<u32>,
}

impl Pids {
    /// The three component PIDs (not the launcher).
    pub fn components(&self) -> [u32; 3] {
        [self.etcd, self.kube_apiserver, self.kube_controller_manager]
    }
}

/// Milliseconds since the launcher started, at the end of each startup step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct StartupMs {
    /// PKI and kubeconfig generated.
    pub pki: u64,
    /// etcd `/health` true.
    pub etcd: u64,
    /// kube-apiserver `/readyz` ok.
    pub apiserver: u64,
    /// kube-controller-manager `/healthz` ok (= ready).
    pub kcm: u64,
}

impl ClusterInfo {
    /// Reads a `cluster.json`.
    pub fn read(path: &Path) -> Result<ClusterInfo> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// The PKI directory.
    pub fn pki_dir(&self) -> PathBuf {
        self.run_dir.join("pki")
    }

    /// Writes a kubeconfig for `identity` into `<run_dir>/users/` and returns its path.
    pub fn mint(&self, identity: &Identity) -> Result<PathBuf> {
        let out = self.run_dir.join("users").join(format!("{}.kubeconfig", identity.file_stem()));
        mint_kubeconfig(self, identity, &out)?;
        Ok(out)
    }
}
