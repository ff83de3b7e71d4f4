//! The optional parts of the test world the launcher starts after the
//! control plane: the snapshot CRDs and the common snapshot-controller
//! (`--snapshots`), and real nodes: kube-scheduler plus N hollow kubelets
//! (`--nodes N`, kubemark's kubelet in `integration/go/kube/cmd/hollow-node`).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use super::{Component, Log, Running, free_ports, wait_ready};
use crate::component_bin;

/// The component name (and log file) of the common snapshot controller.
pub(super) const SNAPSHOT_CONTROLLER: &str = "snapshot-controller";

/// Creates the snapshot CRDs shipped with the snapshot-controller's release
/// (`crd/*.yaml` next to its binary in the component cache) and waits until
/// each is Established.
pub(super) async fn install_snapshot_crds(admin: &kube::Client, log: &Log) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let bin = component_bin(SNAPSHOT_CONTROLLER);
    let dir = bin.parent().ok_or_else(|| anyhow!("{} has no parent", bin.display()))?.join("crd");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| {
            format!("the snapshot CRDs: read {} (run build-components.sh snapshot-controller)", dir.display())
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no CRDs in {}", dir.display());
    }
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(admin.clone());
    let mut names = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| anyhow!("{}: not a CRD: {e}", f.display()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        match api.create(&kube::api::PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(anyhow!("create CRD {name}: {e}")),
        }
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in &names {
        loop {
            let crd = api.get(name).await.with_context(|| format!("get CRD {name}"))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                bail!("CRD {name} not Established within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    log.info(&format!("{} snapshot CRDs Established", names.len()));
    Ok(())
}

/// Starts the common snapshot-controller (as the admin, on loopback, without
/// leader election) and waits until it serves its metrics.
pub(super) async fn start_snapshot_controller(kubeconfig: &Path, log_dir: &Path, running: &mut Running) -> Result<()> {
    let [port] = free_ports::<1>()?;
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--http-endpoint={addr}"),
        "--leader-election=false".into(),
        // Tests retry quickly; the defaults (1 s .. 5 min) stay for production.
        "--retry-interval-start=100ms".into(),
        "--retry-interval-max=5s".into(),
        "--kube-api-qps=100".into(),
        "--kube-api-burst=200".into(),
        // Group snapshots (GA in v8.7.0, so on by default; said explicitly:
        // the group snapshot tests need the controller's group handling).
        "--feature-gates=CSIVolumeGroupSnapshot=true".into(),
        "-v=4".into(),
    ];
    running.comps.push(Component::spawn(SNAPSHOT_CONTROLLER, &component_bin(SNAPSHOT_CONTROLLER), &args, log_dir)?);
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no snapshot-controller"))?;
    wait_ready(comp, "/metrics", Duration::from_secs(60), async || {
        let r = crate::http::get(&addr, "/metrics").await.map_err(|e| anyhow!(e))?;
        Ok(r.status == 200)
    })
    .await
}

/// A hollow node the launcher runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name (`node-1`, `node-2`, ...).
    pub name: String,
    /// The kubelet's root directory (outside the run directory: unix socket
    /// paths inside it must stay short).
    pub root_dir: PathBuf,
    /// Where a node-driver-registrar puts its socket (`<root>/plugins_registry`).
    pub registration_dir: PathBuf,
    /// Where a CSI driver of this node may put its socket (`<root>/plugins`).
    pub plugins_dir: PathBuf,
    /// The hollow kubelet's PID.
    pub pid: u32,
}

/// The component name (and log file) of the scheduler.
pub(super) const SCHEDULER: &str = "kube-scheduler";

/// Starts kube-scheduler as the admin on loopback (no leader election) and
/// waits until `/readyz` answers ok.
pub(super) async fn start_scheduler(kubeconfig: &Path, log_dir: &Path, running: &mut Running) -> Result<()> {
    let [port] = free_ports::<1>()?;
    let kc = kubeconfig.display().to_string();
    let args: Vec<String> = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "-v=2".into(),
    ];
    running.comps.push(Component::spawn(SCHEDULER, &component_bin(SCHEDULER), &args, log_dir)?);
    // Its serving certificate is self-signed in memory: readiness only.
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config)?;
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no scheduler"))?;
    wait_ready(
        comp,
        "/readyz",
        Duration::from_secs(60),
        async || Ok(super::get_text(&client, "/readyz").await? == "ok"),
    )
    .await
}

/// The parent of the nodes' root directories: short (unix socket paths of
/// the registrar and the CRI live inside), outside the run directory, and
/// removed by the launcher at teardown.
pub(super) fn nodes_base() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("csn-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    Ok(base)
}

/// Starts `count` hollow kubelets (as the admin, controller-managed attach)
/// and waits until every Node is Ready.
pub(super) async fn start_nodes(
    count: u32,
    base: &Path,
    kubeconfig: &Path,
    admin: &kube::Client,
    log_dir: &Path,
    running: &mut Running,
) -> Result<Vec<NodeInfo>> {
    let bin = component_bin("hollow-node");
    let mut nodes = Vec::new();
    for i in 1..=count {
        let name = format!("node-{i}");
        let root = base.join(&name);
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--name={name}"),
            format!("--root-dir={}", root.display()),
            "-v=2".into(),
        ];
        // Component names are 'static; a launcher runs a handful of nodes once.
        let comp_name: &'static str = Box::leak(format!("hollow-{name}").into_boxed_str());
        running.comps.push(Component::spawn(comp_name, &bin, &args, log_dir)?);
        let pid = running.comps.last().map(Component::pid).unwrap_or(0);
        nodes.push(NodeInfo {
            registration_dir: root.join("plugins_registry"),
            plugins_dir: root.join("plugins"),
            root_dir: root,
            name,
            pid,
        });
    }
    let api: kube::Api<Node> = kube::Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    for n in &nodes {
        loop {
            if let Some(c) = running.comps.iter_mut().find(|c| c.pid() == n.pid)
                && let Some(status) = c.exited()
            {
                bail!("hollow kubelet {} exited ({status}); last lines:\n{}", n.name, c.log_tail(30));
            }
            let ready = api.get_opt(&n.name).await.ok().flatten().is_some_and(|node| {
                let status = node.status.unwrap_or_default();
                status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("node {} not Ready within 90 s", n.name);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(nodes)
}
