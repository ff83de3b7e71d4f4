//! The registrar against the kubelet's own plugin manager
//! (`k8s.io/kubernetes/pkg/kubelet/pluginmanager`, run by the
//! kubelet-plugin-harness built from the Go module proxy).

use std::{path::PathBuf, time::Duration};

use csi_sidecar_integration::{component_bin, process::Proc, symlinked_bin, wait_until};

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

#[tokio::test]
async fn registered_reregistered_and_deregistered_by_the_real_plugin_manager() {
    let env = Env::new();
    let _driver = env.driver();
    let kubelet = env.kubelet(&[]);
    wait_count(&kubelet, "started", 1).await;
    let mut reg = env.registrar("registrar-1");

    wait_count(&kubelet, "register", 1).await;
    let register = events(&kubelet).into_iter().find(|e| e["event"] == "register").expect("register event");
    assert_eq!(register["name"], DRIVER);
    assert_eq!(register["endpoint"], KUBELET_PATH);
    assert_eq!(register["versions"], serde_json::json!(["1.0.0"]));
    assert_eq!(count(&kubelet, "validate"), 1);

    // SIGTERM removes the socket: the kubelet deregisters the plugin.
    assert_eq!(reg.terminate().await.code(), Some(0));
    wait_count(&kubelet, "deregister", 1).await;

    // A new registrar recreates the socket: registered again.
    let _reg = env.registrar("registrar-2");
    wait_count(&kubelet, "register", 2).await;
    let last = events(&kubelet).into_iter().rfind(|e| e["event"] == "register").expect("register event");
    assert_eq!(last["name"], DRIVER);
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
