//! The real node: containerd (Debian's, with runc) and the kubelet built
//! from k8s.io/kubernetes, running pods (host-network ones, and ones of their
//! own network namespace) from images built here
//! (integration/scripts/node-images.sh), and the chart installed on it with
//! helm. Needs root, containerd, runc, the CNI plugins and umoci (.ci/run
//! installs them).

use std::{collections::BTreeSet, path::Path, time::Duration};

use csi_sidecar_integration::{
    chart::*,
    cluster::ControlPlane,
    kube_support::{TestNamespace, create, pvc, wait_deleted, wait_for},
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, ServiceAccount};

/// The node runs a pod for real (its container writes to an emptyDir and
/// reads its projected ServiceAccount token), and a pod of its own network
/// namespace (only its own loopback in it; its log read through the
/// apiserver, which reaches the kubelet); stopping the launcher removes
/// every process, mount, cgroup and directory the node created.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_node_runs_a_pod_and_leaves_nothing_behind() {
    if not_root() {
        return;
    }
    let _one = ONE_NODE.lock().await;
    let cp = real_node_world();
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

    // A pod of its own network namespace: the node's lo-eth0 CNI plugin
    // reports 127.0.0.1 and creates nothing, so the namespace holds only lo.
    let mut isolated = busybox_pod("isolated", "echo devices: $(tail -n +3 /proc/net/dev | cut -d: -f1) && sleep 3600");
    if let Some(spec) = isolated.spec.as_mut() {
        spec.host_network = Some(false);
    }
    create(&ns.api::<Pod>(), &isolated).await;
    let running = wait_for(&ns.api::<Pod>(), "isolated", Duration::from_secs(90), |p| pod_phase(p) == "Running").await;
    assert_eq!(running.status.and_then(|s| s.pod_ip).as_deref(), Some("127.0.0.1"), "the reported pod IP");
    // Through the apiserver: it reaches the kubelet with its client
    // certificate and verifies the kubelet's serving certificate.
    let pods = ns.api::<Pod>();
    let devices = csi_sidecar_integration::wait_until(
        "the pod's log through the apiserver",
        Duration::from_secs(30),
        async || {
            let text = pods.logs("isolated", &Default::default()).await.map_err(|e| e.to_string());
            (text.as_ref().is_ok_and(|t| t.contains("devices:")), text)
        },
    )
    .await;
    assert_eq!(devices.map(|t| t.trim().to_string()), Ok("devices: lo".to_string()), "only its own loopback");

    // A generic ephemeral volume: kube-controller-manager's ephemeral-volume
    // controller makes the pod's claim (the storage e2e specs use them).
    let mut with_ephemeral = busybox_pod("ephemeral", "sleep 3600");
    if let Some(volume) = with_ephemeral.spec.as_mut().and_then(|s| s.volumes.as_mut()).and_then(|v| v.first_mut()) {
        volume.empty_dir = None;
        volume.ephemeral = Some(
            serde_json::from_value(serde_json::json!({"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "no-such-class",
                "resources": {"requests": {"storage": "1Mi"}},
            }}}))
            .expect("an ephemeral volume source"),
        );
    }
    create(&ns.api::<Pod>(), &with_ephemeral).await;
    let claim =
        wait_for(&ns.api::<PersistentVolumeClaim>(), "ephemeral-scratch", Duration::from_secs(60), |_| true).await;
    let owner = claim.metadata.owner_references.unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "Pod" && o.name == "ephemeral"), "the claim's owners: {owner:?}");

    // A ResourceQuota gets its usage counted (the resource-quota controller;
    // the storage e2e expansion specs wait for it).
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "claims"},
        "spec": {"hard": {"persistentvolumeclaims": "10"}},
    }))
    .expect("a quota");
    create(&ns.api::<ResourceQuota>(), &quota).await;
    let counted = wait_for(&ns.api::<ResourceQuota>(), "claims", Duration::from_secs(60), |q| {
        q.status.as_ref().and_then(|s| s.used.as_ref()).is_some_and(|u| u.contains_key("persistentvolumeclaims"))
    })
    .await;
    let used = counted.status.and_then(|s| s.used).unwrap_or_default();
    assert_eq!(used.get("persistentvolumeclaims").map(|q| q.0.as_str()), Some("1"), "the ephemeral pod's claim");

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

/// The chart, installed with helm exactly as its README says, on the real
/// node: both layouts, a workload writing into its volume, the driver's
/// liveness probe restarting a hung driver, the controller pod replaced in a
/// burst, an upgrade from the drop-in to the combined layout with a volume
/// in use, and an uninstall that leaves nothing of the release.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installed_with_helm_serves_a_workload_on_a_real_node() {
    if not_root() {
        return;
    }
    use k8s_openapi::api::{
        coordination::v1::Lease,
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::{CSINode, VolumeAttachment},
    };
    use kube::{
        Api,
        api::{DeleteParams, ListParams},
    };

    let _one = ONE_NODE.lock().await;
    let world = real_node_world();
    let cp = &world;
    let node = cp.info().real_node.clone().expect("the launcher reports the real node");
    let client = cp.client().await;
    let helm = Helm::new(cp);
    let api_port = cp.info().ports.apiserver;
    let minutes = |m: u64| Duration::from_secs(60 * m);

    // 1. The README's line, drop-in layout.
    let mut install = install_args(&node);
    install.extend(world_args(api_port, "drop-in"));
    helm.run(&install);
    wait_rollout(&client, minutes(3)).await;

    // The registrar registered the driver through the chart's hostPath
    // mounts: the kubelet wrote the CSINode.
    wait_for(&Api::<CSINode>::all(client.clone()), &node.name, minutes(1), |n| {
        n.spec.drivers.iter().any(|d| d.name == DRIVER && d.node_id == node.name)
    })
    .await;

    // The image's symlinked names are what the kubelet started, as the
    // chart's users and file systems.
    // (The node pod's containers run as root: the kubelet's registration
    // directory is root's; its prober listens on 9899.)
    for (argv0, only, uid) in [
        ("/csi-provisioner", "", "65532"),
        ("/csi-attacher", "", "65532"),
        ("/livenessprobe", ":9898", "65532"),
        ("/livenessprobe", ":9899", "0"),
        ("/csi-node-driver-registrar", "", "0"),
    ] {
        let started = || -> Vec<(u32, Vec<String>)> {
            host_processes(argv0)
                .into_iter()
                .filter(|(_, a)| a[0] == argv0 && a.iter().any(|w| w.contains(only)))
                .collect()
        };
        // A rolled-out pod's containers may still be starting (one after
        // another): wait for the process, then check there is one.
        wait_until(&format!("a process started as {argv0} {only}"), minutes(1), async || {
            let procs = started();
            if procs.is_empty() { Err("none".into()) } else { Ok(()) }
        })
        .await;
        let procs = started();
        assert_eq!(procs.len(), 1, "processes started as {argv0} {only}: {procs:?}");
        for (pid, args) in procs {
            assert_eq!(uid_of(pid), uid, "{args:?} runs as uid {}", uid_of(pid));
            assert!(root_is_read_only(pid), "{args:?}: the root filesystem is writable");
        }
    }
    // The kubelet's liveness probes pass against csi-sidecar's /healthz.
    let ctrl = pods_of(&client, "controller").await.remove(0);
    let ctrl_name = ctrl.metadata.name.clone().unwrap_or_default();
    let node_pod = pods_of(&client, "node").await.remove(0);
    let node_pod_name = node_pod.metadata.name.clone().unwrap_or_default();
    for (pod, container) in [
        (&ctrl_name, "csi-provisioner"),
        (&ctrl_name, "driver"),
        (&node_pod_name, "node-driver-registrar"),
        (&node_pod_name, "driver"),
    ] {
        // Two passes in a row with no failure between them (a probe that
        // timed out once on a loaded machine is not a failing probe).
        let mut since = liveness_counts(cp, &node, pod, container).await;
        wait_until(&format!("two passing liveness probes in a row of {pod}/{container}"), minutes(1), async || {
            let now = liveness_counts(cp, &node, pod, container).await;
            if now.1 > since.1 {
                since = now;
            }
            match now.0 - since.0 {
                passed if passed >= 2.0 => Ok(()),
                _ => Err(format!("(successful, failed) = {now:?}, counted from {since:?}")),
            }
        })
        .await;
    }

    // 2. A workload writes into its volume; the file is in the directory
    // the kubelet published on the node.
    let ns = TestNamespace::new(&client, "workload").await;
    wait_for(&ns.api::<k8s_openapi::api::core::v1::ServiceAccount>(), "default", minutes(1), |_| true).await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let pods: Api<Pod> = ns.api();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    create(&claims, &pvc("data", Some(STORAGE_CLASS), "1Gi")).await;
    create(
        &pods,
        &volume_pod("writer", "data", "echo hello > /data/hello && until [ -f /data/stop ]; do sleep 0.2; done"),
    )
    .await;
    let running = wait_for(&pods, "writer", minutes(2), |p| pod_phase(p) == "Running").await;
    let uid = running.metadata.uid.clone().unwrap_or_default();
    let pv = claims.get("data").await.expect("claim").spec.and_then(|s| s.volume_name).expect("bound");
    let dir = published_dir(&node, &uid, &pv);
    wait_until("the pod's file in the published directory", minutes(1), async || {
        match std::fs::read_to_string(dir.join("hello")) {
            Ok(t) if t == "hello\n" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    std::fs::write(dir.join("stop"), "").expect("write into the published directory");
    wait_for(&pods, "writer", minutes(1), |p| pod_phase(p) == "Succeeded").await;
    pods.delete("writer", &DeleteParams::default()).await.expect("delete pod");
    claims.delete("data", &DeleteParams::default()).await.expect("delete claim");
    wait_deleted(&pvs, &pv, minutes(2)).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until("no VolumeAttachment of the deleted volume", minutes(1), async || {
        let left: Vec<_> = vas
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()))
            .collect();
        if left.is_empty() { Ok(()) } else { Err(format!("{} left", left.len())) }
    })
    .await;
    assert!(!dir.exists(), "{} is still there after the pod was deleted", dir.display());
    let ctrl_calls = driver_calls(&node, &ctrl_name);
    let count = |calls: &[String], call: &str| calls.iter().filter(|c| c.starts_with(&format!("{call} -> OK"))).count();
    assert_eq!(count(&ctrl_calls, "/csi.v1.Controller/CreateVolume"), 1, "{ctrl_calls:#?}");
    assert_eq!(count(&ctrl_calls, "/csi.v1.Controller/ControllerPublishVolume"), 1, "{ctrl_calls:#?}");
    assert_eq!(count(&ctrl_calls, "/csi.v1.Controller/ControllerUnpublishVolume"), 1, "{ctrl_calls:#?}");
    assert_eq!(count(&ctrl_calls, "/csi.v1.Controller/DeleteVolume"), 1, "{ctrl_calls:#?}");
    let node_calls = driver_calls(&node, &node_pod_name);
    for call in ["NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"] {
        assert_eq!(count(&node_calls, &format!("/csi.v1.Node/{call}")), 1, "{node_calls:#?}");
    }

    // 3. A hung driver: csi-sidecar's /healthz fails, the kubelet's
    // liveness probe restarts the driver container.
    let node_uid = node_pod.metadata.uid.clone().unwrap_or_default();
    let driver_pid = host_processes("/csi-mock-driver")
        .into_iter()
        .filter(|(_, a)| a[0] == "/csi-mock-driver")
        .find(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .unwrap_or_default()
                .contains(&format!("pod{node_uid}"))
        })
        .map(|(pid, _)| pid)
        .expect("the node pod's driver process");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(driver_pid as i32), nix::sys::signal::Signal::SIGSTOP)
        .expect("stop the driver");
    let node_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for(&node_pods, &node_pod_name, minutes(2), |p| {
        let statuses = p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
        statuses.iter().any(|c| c.name == "driver" && c.restart_count >= 1 && c.ready)
    })
    .await;
    let (_, failed) = liveness_counts(cp, &node, &node_pod_name, "driver").await;
    assert!(failed >= 2.0, "the kubelet counted {failed} failed liveness probes of the hung driver");
    assert!(!Path::new(&format!("/proc/{driver_pid}")).exists(), "the hung driver {driver_pid} still runs");

    // 4. The controller pod deleted during a burst of 20 claims: the
    // replacement takes the Lease, every claim is Bound exactly once.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let lease_name = DRIVER.replace('.', "-");
    let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
    let before = holder(&leases.get(&lease_name).await.expect("the provisioner's Lease"));
    let burst: Vec<String> = (0..20).map(|i| format!("burst-{i}")).collect();
    for name in &burst {
        create(&claims, &pvc(name, Some(STORAGE_CLASS), "1Gi")).await;
    }
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(&ctrl_name, &DeleteParams::default())
        .await
        .expect("delete the controller pod");
    for name in &burst {
        wait_for(&claims, name, minutes(3), |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .await;
    }
    let after = wait_for(&leases, &lease_name, minutes(1), |l| !holder(l).is_empty() && holder(l) != before).await;
    assert_ne!(holder(&after), before, "the replacement took the Lease");
    let mine: Vec<PersistentVolume> = pvs
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref()) == Some(ns.name())
        })
        .collect();
    let bound_to: BTreeSet<String> =
        mine.iter().filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.name.clone()).collect();
    assert_eq!(mine.len(), 20, "PVs for the burst: {bound_to:?}");
    assert_eq!(bound_to.len(), 20, "each claim has exactly one PV");
    wait_rollout(&client, minutes(3)).await;

    // 5. helm upgrade to the combined layout with a volume in use.
    create(&claims, &pvc("in-use", Some(STORAGE_CLASS), "1Gi")).await;
    create(&pods, &volume_pod("user", "in-use", "echo kept > /data/kept && sleep 3600")).await;
    let user = wait_for(&pods, "user", minutes(2), |p| pod_phase(p) == "Running").await;
    let in_use_pv = claims.get("in-use").await.expect("claim").spec.and_then(|s| s.volume_name).expect("bound");
    let kept = published_dir(&node, user.metadata.uid.as_deref().unwrap_or(""), &in_use_pv).join("kept");
    wait_until("the in-use file", minutes(1), async || if kept.exists() { Ok(()) } else { Err("missing".into()) })
        .await;
    let pvs_before = pvs.list(&ListParams::default()).await.expect("list PVs").items.len();
    let mut upgrade: Vec<String> =
        install.iter().map(|w| if w == "install" { "upgrade".into() } else { w.clone() }).collect();
    upgrade.retain(|w| w != "--create-namespace");
    upgrade.extend(world_args(api_port, "combined"));
    helm.run(&upgrade);
    wait_rollout(&client, minutes(3)).await;
    let combined = pods_of(&client, "controller").await.remove(0);
    let names: Vec<String> =
        combined.spec.map(|s| s.containers.into_iter().map(|c| c.name).collect()).unwrap_or_default();
    assert_eq!(names, ["driver", "csi-sidecar"], "the combined layout's controller pod");
    let user_now = pods.get("user").await.expect("the pod using the volume");
    assert_eq!(pod_phase(&user_now), "Running");
    assert_eq!(user_now.metadata.uid, user.metadata.uid, "the pod using the volume was not replaced");
    assert_eq!(std::fs::read_to_string(&kept).ok().as_deref(), Some("kept\n"), "the file in the volume in use");
    assert_eq!(
        pvs.list(&ListParams::default()).await.expect("list").items.len(),
        pvs_before,
        "PVs changed by the upgrade"
    );
    create(&claims, &pvc("after-upgrade", Some(STORAGE_CLASS), "1Gi")).await;
    wait_for(&claims, "after-upgrade", minutes(2), |c| {
        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    })
    .await;
    let combined_calls = driver_calls(&node, combined.metadata.name.as_deref().unwrap_or(""));
    assert_eq!(count(&combined_calls, "/csi.v1.Controller/CreateVolume"), 1, "{combined_calls:#?}");

    // 6. Everything deleted: no PV left; helm uninstall leaves nothing.
    pods.delete("user", &DeleteParams::default()).await.expect("delete pod");
    wait_deleted(&pods, "user", minutes(2)).await;
    for c in claims.list(&ListParams::default()).await.expect("list claims").items {
        let name = c.metadata.name.unwrap_or_default();
        claims.delete(&name, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("delete claim {name}: {e}"));
    }
    wait_until("every PV of the test deleted", minutes(3), async || {
        let left = pvs.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.len();
        if left == 0 { Ok(()) } else { Err(format!("{left} PVs left")) }
    })
    .await;
    helm.run(&["uninstall".into(), RELEASE.into(), "--namespace".into(), NAMESPACE.into(), "--wait".into()]);
    wait_until("no object of the release", minutes(2), async || {
        let left = release_objects(&client).await;
        if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
    })
    .await;
    ns.delete().await;
    let footprint = node.footprint.clone();
    let status = world.stop_within(Duration::from_secs(120)).expect("the launcher stops");
    assert!(status.success(), "the launcher reported a failed teardown: {status}");
    let left = footprint.leftovers();
    assert!(left.is_empty(), "the real node left behind after the chart's test: {left:#?}");
}

/// The real node needs root (containerd, cgroups, mounts); CI runs as root.
fn not_root() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root {
        eprintln!("skipped: the real node needs root (containerd, cgroups, mounts); .ci/run runs as root");
    }
    !root
}

/// One real node at a time in this process: nodes share host directories
/// (`/run/containerd`) that the teardown check must see as they were.
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A control plane with a real node of its own, for one test: stopping it
/// (`ControlPlane::stop_within`) tears the node down.
fn real_node_world() -> ControlPlane {
    let images = csi_sidecar_integration::cluster::node_images().expect("the node's images");
    ControlPlane::spawn_launcher(
        &csi_sidecar_integration::cluster::launcher_bin(),
        &["--real-node", &images.display().to_string()],
    )
    .expect("a control plane with a real node")
}
