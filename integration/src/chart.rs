//! The csi-sidecar chart on the real node (`cluster serve --real-node`):
//! helm as a user runs it, the test world's additions to the user's line,
//! and what the end-to-end test and the demo read from the node (processes,
//! container logs, the kubelet's probe counts, published directories).

use std::{collections::BTreeSet, path::PathBuf, process::Command, time::Duration};

use crate::{
    cluster::{ControlPlane, RealNodeInfo},
    component_bin,
    kube_support::wait_for,
    workspace_root,
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::{Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, ServiceAccount, Volume, VolumeMount},
};
use kube::{
    Api,
    api::{ListParams, ObjectMeta},
};

pub const RELEASE: &str = "mock";
pub const NAMESPACE: &str = "csi-mock";
pub const DRIVER: &str = "io.kubernetes.storage.mock";
pub const STORAGE_CLASS: &str = "csi-mock";
const CHART_README: &str = "manifests/helm/csi-sidecar/README.md";
const INSTALL_MARKER: &str = "<!-- helm-install: run by integration/tests/nodes/real_node.rs -->";

/// The `helm install` line of the chart's README (the fenced block after
/// [`INSTALL_MARKER`]), as words.
pub fn readme_install_line() -> Vec<String> {
    let text = std::fs::read_to_string(workspace_root().join(CHART_README)).expect("the chart's README");
    let after = text.split(INSTALL_MARKER).nth(1).unwrap_or_else(|| panic!("{CHART_README} has no {INSTALL_MARKER}"));
    let block = after.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("a ```sh block");
    let line = block.replace("\\\n", " ");
    let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    assert_eq!(words.first().map(String::as_str), Some("helm"), "{CHART_README}: {line}");
    words
}

/// helm, run from the workspace root against the cluster.
pub struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    pub fn new(cp: &ControlPlane) -> Helm {
        Helm {
            bin: component_bin("helm"),
            kubeconfig: cp.kubeconfig().to_path_buf(),
            home: tempfile::tempdir().expect("a helm home"),
        }
    }

    /// Runs `helm <args>`; panics with its output unless it succeeds.
    pub fn run(&self, args: &[String]) -> String {
        let h = self.home.path();
        let out = Command::new(&self.bin)
            .args(args)
            .current_dir(workspace_root())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .output()
            .expect("run helm");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "helm {} failed ({}):\n{text}", args.join(" "), out.status);
        text
    }
}

/// What only this test world adds to a user's line (besides its kubelet
/// directory, see [`install_args`]): the loopback API server for
/// host-network pods, the layout, quick driver liveness checks.
pub fn world_args(api_port: u16, layout: &str) -> Vec<String> {
    let env = serde_json::json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": api_port.to_string()},
    ]);
    [
        "--set-json".to_string(),
        format!("extraEnv={env}"),
        "--set".into(),
        format!("layout={layout}"),
        "--set".into(),
        "driver.livenessProbe.initialDelaySeconds=1,driver.livenessProbe.periodSeconds=2,\
         driver.livenessProbe.timeoutSeconds=2,driver.livenessProbe.failureThreshold=2"
            .into(),
    ]
    .into()
}

/// The README's line with the world's kubelet directory.
pub fn install_args(node: &RealNodeInfo) -> Vec<String> {
    readme_install_line()
        .into_iter()
        .skip(1)
        .map(|w| w.replace("/var/lib/kubelet", &node.root_dir.display().to_string()))
        .collect()
}

pub async fn wait_rollout(client: &kube::Client, within: Duration) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let name = format!("{RELEASE}-csi-sidecar-controller");
    wait_for(&deployments, &name, within, |d| {
        let (spec, status) = (d.spec.as_ref(), d.status.clone().unwrap_or_default());
        let want = spec.and_then(|s| s.replicas).unwrap_or(1);
        status.observed_generation == d.metadata.generation
            && status.updated_replicas == Some(want)
            && status.available_replicas == Some(want)
            && status.replicas == Some(want)
            && status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Available" && c.status == "True")
    })
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let name = format!("{RELEASE}-csi-sidecar-node");
    wait_for(&daemonsets, &name, within, |d| {
        let s = d.status.clone().unwrap_or_default();
        s.observed_generation == d.metadata.generation
            && s.desired_number_scheduled == 1
            && s.number_ready == 1
            && s.updated_number_scheduled == Some(1)
            && s.number_available == Some(1)
    })
    .await;
}

/// The running pods of a component (`controller` or `node`).
pub async fn pods_of(client: &kube::Client, component: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let lp = ListParams::default()
        .labels(&format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"));
    pods.list(&lp)
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_phase(p) == "Running")
        .collect()
}

/// The node's processes whose command line contains `needle`, with their
/// command lines.
pub fn host_processes(needle: &str) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> =
            raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into()).collect();
        if args.iter().any(|a| a.contains(needle)) {
            found.push((pid, args));
        }
    }
    found
}

/// `Uid:` of /proc/<pid>/status (real, effective, ...).
pub fn uid_of(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap_or("").split_whitespace().next().unwrap_or("").into()
}

/// Whether the process's root filesystem is mounted read-only.
pub fn root_is_read_only(pid: u32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.get(4) == Some(&"/") && f.get(5).is_some_and(|o| o.split(',').any(|x| x == "ro"))
    })
}

/// Liveness probe results the kubelet counted for `container`
/// (`/metrics/probes`), as (successful, failed).
pub async fn liveness_counts(cp: &ControlPlane, node: &RealNodeInfo, pod: &str, container: &str) -> (f64, f64) {
    let kc = kube::config::Kubeconfig::read_from(cp.kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
    config.cluster_url = format!("https://127.0.0.1:{}", node.kubelet_port).parse().expect("url");
    // The kubelet serves a self-signed certificate of its own.
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config).expect("kubelet client");
    let req = http::Request::get("/metrics/probes").body(Vec::new()).expect("request");
    let text = client.request_text(req).await.expect("the kubelet's /metrics/probes");
    let mut counts = (0.0, 0.0);
    for line in text.lines().filter(|l| l.starts_with("prober_probe_total{")) {
        let has = |k: &str, v: &str| line.contains(&format!("{k}=\"{v}\""));
        if has("pod", pod) && has("container", container) && has("probe_type", "Liveness") {
            let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            if has("result", "successful") {
                counts.0 += n;
            } else {
                counts.1 += n;
            }
        }
    }
    counts
}

/// The CSI calls a driver container logged (`<method> -> <code>` lines).
pub fn driver_calls(node: &RealNodeInfo, pod: &str) -> Vec<String> {
    container_logs(&node.pod_logs_dir, NAMESPACE, pod, "driver")
        .lines()
        .filter_map(|l| l.split("csi-mock-driver: ").nth(1))
        .map(str::to_string)
        .collect()
}

/// Names of every object of the release the API still has.
pub async fn release_objects(client: &kube::Client) -> BTreeSet<String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let mut names = BTreeSet::new();
    macro_rules! collect {
        ($($k:ty),*) => {$(
            for o in Api::<$k>::all(client.clone()).list(&lp).await.expect("list").items {
                names.insert(format!("{} {}", stringify!($k), o.metadata.name.unwrap_or_default()));
            }
        )*};
    }
    use k8s_openapi::api::{
        apps::v1::ReplicaSet,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
        storage::v1::{CSIDriver, StorageClass},
    };
    collect!(
        Deployment,
        DaemonSet,
        ReplicaSet,
        Pod,
        ServiceAccount,
        ClusterRole,
        ClusterRoleBinding,
        Role,
        RoleBinding,
        CSIDriver,
        StorageClass
    );
    names
}

pub async fn wait_until(what: &str, within: Duration, mut check: impl AsyncFnMut() -> Result<(), String>) {
    // The project's one polling loop, with `Err` as the state it reports;
    // it returns only once the check is `Ok`.
    let _ok = crate::wait_until(what, within, async || {
        let r = check().await;
        (r.is_ok(), r)
    })
    .await;
}

pub fn published_dir(node: &RealNodeInfo, pod_uid: &str, pv: &str) -> PathBuf {
    node.root_dir.join("pods").join(pod_uid).join("volumes").join("kubernetes.io~csi").join(pv).join("mount")
}

/// A host-network pod on the real node running `script` in the busybox
/// image, with an emptyDir and (automatically) its ServiceAccount token.
pub fn busybox_pod(name: &str, script: &str) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(PodSpec {
            host_network: Some(true),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(1),
            containers: vec![Container {
                name: "main".into(),
                image: Some("localhost/busybox:local".into()),
                image_pull_policy: Some("Never".into()),
                command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "scratch".into(),
                    mount_path: "/scratch".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "scratch".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's phase (`""` before it has one).
pub fn pod_phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// All lines the kubelet logged for `container` of pod `pod` in `namespace`
/// (`<pod-logs>/<namespace>_<pod>_<uid>/<container>/<n>.log`).
pub fn container_logs(pod_logs: &std::path::Path, namespace: &str, pod: &str, container: &str) -> String {
    let prefix = format!("{namespace}_{pod}_");
    let mut out = String::new();
    for dir in std::fs::read_dir(pod_logs).into_iter().flatten().flatten() {
        if !dir.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let mut files: Vec<_> =
            std::fs::read_dir(dir.path().join(container)).into_iter().flatten().flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            out.push_str(&std::fs::read_to_string(f).unwrap_or_default());
        }
    }
    out
}

/// A host-network pod on the real node running `script` with claim
/// `claim` mounted at /data.
pub fn volume_pod(name: &str, claim: &str, script: &str) -> Pod {
    let mut pod = busybox_pod(name, script);
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts =
            Some(vec![VolumeMount { name: "data".into(), mount_path: "/data".into(), ..Default::default() }]);
    }
    pod
}
