//! The real node: containerd (Debian's, with runc) and the kubelet built
//! from k8s.io/kubernetes, running host-network pods from images built here
//! (integration/scripts/node-images.sh). Needs root, containerd, runc, the
//! CNI plugins and umoci (.ci/run installs them).

use std::time::Duration;

use csi_sidecar_integration::{
    cluster::ControlPlane,
    kube_support::{TestNamespace, create, wait_for},
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount, Volume};
use kube::api::ObjectMeta;

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
                volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
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

fn pod_phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// The node runs a pod for real (its container writes to an emptyDir and
/// reads its projected ServiceAccount token), and stopping the launcher
/// removes every process, mount, cgroup and directory the node created.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_node_runs_a_pod_and_leaves_nothing_behind() {
    let images = csi_sidecar_integration::cluster::node_images().expect("the node's images");
    let cp = ControlPlane::spawn_launcher(
        &csi_sidecar_integration::cluster::launcher_bin(),
        &["--real-node", &images.display().to_string()],
    )
    .expect("a control plane with a real node");
    let node = cp.info().real_node.clone().expect("the launcher reports the real node");
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "real-node").await;
    // The ServiceAccount admission needs the namespace's default account,
    // which kube-controller-manager creates.
    wait_for(&ns.api::<ServiceAccount>(), "default", Duration::from_secs(60), |_| true).await;
    let script = "echo written > /scratch/f && cat /scratch/f && \
                  test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token && sleep 3600";
    create(&ns.api::<Pod>(), &busybox_pod("sleeper", script)).await;
    let running = wait_for(&ns.api::<Pod>(), "sleeper", Duration::from_secs(90), |p| pod_phase(p) == "Running").await;
    let ip = running.status.and_then(|s| s.pod_ip).unwrap_or_default();
    assert_eq!(ip, "127.0.0.1", "a host-network pod's IP is the node's loopback address");
    // The container's own output, from the log file the kubelet keeps.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let log = loop {
        let text = container_logs(&node.pod_logs_dir, ns.name(), "sleeper", "main");
        if text.contains("token") || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(log.contains("written") && log.contains("token"), "container log: {log:?}");

    // While the pod runs, the node has a footprint: what the teardown must remove.
    let footprint = node.footprint.clone();
    let during = footprint.leftovers();
    assert!(during.iter().any(|l| l.starts_with("mount ")), "no mount while a pod runs: {during:#?}");
    assert!(during.iter().any(|l| l.starts_with("process ")), "no container process while a pod runs: {during:#?}");

    let status = cp.stop_within(Duration::from_secs(120)).expect("the launcher stops");
    assert!(status.success(), "the launcher reported a failed teardown: {status}");
    let left = footprint.leftovers();
    assert!(left.is_empty(), "the real node left behind: {left:#?}");
    for pid in [node.kubelet_pid, node.containerd_pid] {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "process {pid} still runs");
    }
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
