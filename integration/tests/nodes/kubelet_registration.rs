//! The registrar against the real kubelet (the launcher's hollow node), and
//! against the kubelet's own plugin manager alone
//! (`k8s.io/kubernetes/pkg/kubelet/pluginmanager`, run by the
//! kubelet-plugin-harness) for what a real kubelet cannot be made to show: a
//! rejected registration.

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{
    cluster::ControlPlane,
    component_bin,
    kube_support::{unique_name, wait_for},
    process::Proc,
    symlinked_bin, wait_until,
};

const DRIVER: &str = "mock.csi.example.com";
const KUBELET_PATH: &str = "/var/lib/kubelet/plugins/mock.csi.example.com/csi.sock";

struct Env {
    dir: tempfile::TempDir,
    csi: PathBuf,
    registry: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = dir.path().join("plugins_registry");
        std::fs::create_dir(&registry).expect("registry");
        Env { csi: dir.path().join("csi.sock"), registry, dir }
    }

    fn driver(&self) -> Proc {
        let args = vec![format!("--endpoint=unix://{}", self.csi.display()), format!("--name={DRIVER}")];
        Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, self.dir.path())
    }

    fn kubelet(&self, extra: &[&str]) -> Proc {
        let mut args = vec![format!("--dir={}", self.registry.display())];
        args.extend(extra.iter().map(|s| s.to_string()));
        Proc::spawn("kubelet-plugin-harness", &component_bin("kubelet-plugin-harness"), &args, self.dir.path())
    }

    fn registrar(&self, name: &str) -> Proc {
        let bin = symlinked_bin(self.dir.path(), "csi-node-driver-registrar");
        let args = vec![
            format!("--csi-address={}", self.csi.display()),
            format!("--kubelet-registration-path={KUBELET_PATH}"),
            format!("--plugin-registration-path={}", self.registry.display()),
        ];
        Proc::spawn(name, &bin, &args, self.dir.path())
    }
}

/// The kubelet's JSON event lines.
fn events(kubelet: &Proc) -> Vec<serde_json::Value> {
    kubelet
        .logs()
        .lines()
        .filter(|l| l.starts_with("{\"event\""))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn count(kubelet: &Proc, event: &str) -> usize {
    events(kubelet).iter().filter(|e| e["event"] == event).count()
}

async fn wait_count(kubelet: &Proc, event: &str, n: usize) {
    wait_until(&format!("{n} kubelet {event} event(s)"), Duration::from_secs(30), async || {
        let c = count(kubelet, event);
        (c >= n, events(kubelet))
    })
    .await;
}

/// The real kubelet (the launcher's hollow node): its plugin manager finds
/// the registrar's socket, its CSI plugin calls NodeGetInfo and writes the
/// driver into the CSINode; SIGTERM removes the socket and the kubelet takes
/// the driver out again; a new registrar registers it again.
#[tokio::test]
async fn the_real_kubelet_registers_deregisters_and_registers_again() {
    use k8s_openapi::api::storage::v1::CSINode;
    let cp = ControlPlane::with_node();
    let node = cp.info().nodes.first().cloned().expect("a node");
    let client = cp.client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = format!("{}.csi.example.com", unique_name("reg"));
    let sock_dir = node.plugins_dir.join(&driver);
    std::fs::create_dir_all(&sock_dir).expect("driver dir");
    let sock = sock_dir.join("csi.sock");
    let args = vec![
        format!("--endpoint=unix://{}", sock.display()),
        format!("--name={driver}"),
        format!("--node-id={}", node.name),
    ];
    let _driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &args, dir.path());
    let registrar = |name: &str| {
        let bin = symlinked_bin(dir.path(), "csi-node-driver-registrar");
        let args = vec![
            format!("--csi-address={}", sock.display()),
            format!("--kubelet-registration-path={}", sock.display()),
            format!("--plugin-registration-path={}", node.registration_dir.display()),
        ];
        Proc::spawn(name, &bin, &args, dir.path())
    };
    let csinodes: kube::Api<CSINode> = kube::Api::all(client);
    let has_driver = |c: &CSINode| c.spec.drivers.iter().any(|d| d.name == driver && d.node_id == node.name);

    let mut reg = registrar("registrar-1");
    wait_for(&csinodes, &node.name, Duration::from_secs(30), has_driver).await;
    // The kubelet writes the CSINode before it tells the registrar
    // (NotifyRegistrationStatus): the log line may come a moment later.
    wait_registered(&reg).await;

    // SIGTERM removes the socket: the kubelet deregisters the driver.
    assert_eq!(reg.terminate().await.code(), Some(0));
    wait_for(&csinodes, &node.name, Duration::from_secs(30), |c| !has_driver(c)).await;

    // A new registrar recreates the socket: registered again.
    let reg2 = registrar("registrar-2");
    wait_for(&csinodes, &node.name, Duration::from_secs(30), has_driver).await;
    wait_registered(&reg2).await;
}

/// Waits until the registrar logged the kubelet's accepted registration.
async fn wait_registered(reg: &Proc) {
    wait_until("the registrar told of its registration", Duration::from_secs(30), async || {
        (reg.logs().contains("Plugin registered with the kubelet"), reg.logs())
    })
    .await;
}

#[tokio::test]
async fn a_rejected_registration_is_retried_without_restarting_the_process() {
    let env = Env::new();
    let _driver = env.driver();
    let kubelet = env.kubelet(&["--reject-registration"]);
    wait_count(&kubelet, "started", 1).await;
    let mut reg = env.registrar("registrar");
    // The plugin manager rejects; the registrar recreates its socket with
    // backoff (1 s, 2 s, ...) and the plugin manager tries again.
    wait_count(&kubelet, "register", 2).await;
    assert!(reg.try_exit().is_none(), "upstream exits on rejection; csi-sidecar keeps running:\n{}", reg.logs());
    assert!(reg.logs().contains("rejected the registration"), "{}", reg.logs());
    assert!(events(&kubelet).iter().filter(|e| e["event"] == "register").all(|e| e["rejected"] == true));
}
