//! The real control plane of `csi_sidecar_integration::cluster`: the PV binder
//! and protection controllers, the attach-detach controller, minted credentials
//! under RBAC, and teardown without leftovers.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use csi_sidecar_integration::{
    cluster::{ClusterInfo, ControlPlane, Identity, launcher_bin},
    kube_support::{
        TestNamespace, client_from_kubeconfig, create, csi_node, csi_pv, is_status, node, pod, pvc, storage_class,
        wait_deleted, wait_for,
    },
    process::run_to_end,
};
use k8s_openapi::api::{
    authentication::v1::SelfSubjectReview,
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};

const T: Duration = Duration::from_secs(30);
const DRIVER: &str = "fake.csi.example.com";

fn alive(pid: u32) -> bool {
    // Zombies count as gone: they hold no resources but the PID.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

fn assert_all_gone(info: &ClusterInfo, within: Duration) {
    let start = Instant::now();
    let pids = info.pids.components();
    while pids.iter().any(|&p| alive(p)) {
        assert!(start.elapsed() < within, "still alive after {within:?}: {:?}", info.pids);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn pv_binder_binds_and_protection_finalizers_are_released() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "binder").await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = ns.api();

    // A class that nothing provisions: binding to the pre-created PV only.
    let class = ns.scoped("class");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&class, DRIVER)).await;
    let pv_name = ns.scoped("pv");
    let mut pv = csi_pv(&pv_name, DRIVER, &format!("handle-{pv_name}"), "1Mi");
    pv.spec.as_mut().unwrap().storage_class_name = Some(class.clone());
    create(&pvs, &pv).await;
    let claim = create(&pvcs, &pvc("claim", Some(&class), "1Mi")).await;

    let bound = wait_for(&pvcs, "claim", T, |c| {
        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv_name.as_str())
    })
    .await;
    let pv = wait_for(&pvs, &pv_name, T, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            && p.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref())
                == claim.metadata.uid.as_deref()
    })
    .await;
    let finalizers = |f: &Option<Vec<String>>| f.clone().unwrap_or_default();
    assert!(
        finalizers(&bound.metadata.finalizers).contains(&"kubernetes.io/pvc-protection".to_string()),
        "{:?}",
        bound.metadata
    );
    assert!(
        finalizers(&pv.metadata.finalizers).contains(&"kubernetes.io/pv-protection".to_string()),
        "{:?}",
        pv.metadata
    );

    // Deletion completes only if the real protection controllers release the finalizers.
    pvcs.delete("claim", &DeleteParams::default()).await.unwrap();
    wait_deleted(&pvcs, "claim", T).await;
    wait_for(&pvs, &pv_name, T, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")).await;
    pvs.delete(&pv_name, &DeleteParams::default()).await.unwrap();
    wait_deleted(&pvs, &pv_name, T).await;
    ns.delete().await;
}

#[tokio::test]
async fn attach_detach_controller_creates_and_deletes_volume_attachments() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "adc").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let pods: Api<Pod> = ns.api();

    // Node first: the ADC skips pods on nodes it does not manage yet.
    let node_name = ns.scoped("node");
    create(&nodes, &node(&node_name, &[("topology.example.com/node", &node_name)])).await;
    create(
        &Api::<CSINode>::all(client.clone()),
        &csi_node(&node_name, DRIVER, &format!("id-{node_name}"), &["topology.example.com/node"]),
    )
    .await;
    // Pre-bound pair: PVC with volumeName, storage class "".
    let pv_name = ns.scoped("pv");
    let handle = format!("handle-{pv_name}");
    create(&pvs, &csi_pv(&pv_name, DRIVER, &handle, "1Mi")).await;
    let mut claim = pvc("claim", None, "1Mi");
    claim.spec.as_mut().unwrap().volume_name = Some(pv_name.clone());
    create(&pvcs, &claim).await;
    wait_for(&pvcs, "claim", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;

    create(&pods, &pod("consumer", &node_name, "claim")).await;
    let ours = |va: &VolumeAttachment| {
        va.spec.node_name == node_name && va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
    };
    let start = Instant::now();
    let va = loop {
        let list = vas.list(&ListParams::default()).await.unwrap();
        if let Some(va) = list.items.into_iter().find(|v| ours(v)) {
            break va;
        }
        assert!(start.elapsed() < T, "no VolumeAttachment for {pv_name} on {node_name} after {T:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let va_name = va.metadata.name.clone().unwrap();
    assert!(va_name.starts_with("csi-"), "{va_name}");
    assert_eq!(va.spec.attacher, DRIVER);

    // Play the external attacher: report it attached; the ADC records it on the Node.
    let status = serde_json::json!({"status": {"attached": true}});
    vas.patch_status(&va_name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    wait_for(&nodes, &node_name, T, |n| {
        n.status.as_ref().and_then(|s| s.volumes_attached.as_ref()).is_some_and(|v| v.iter().any(|a| a.name == unique))
    })
    .await;

    // Force-delete the pod (no kubelet would ever finish a graceful delete): detach.
    pods.delete("consumer", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    wait_deleted(&vas, &va_name, T).await;
    ns.delete().await;
}

#[tokio::test]
async fn minted_credentials_obey_rbac() {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    let ns = TestNamespace::new(&admin, "rbac").await;
    let sa = Identity::service_account(ns.name(), "reader");
    let group = ns.scoped("readers");
    let user = Identity::user(&ns.scoped("alice"), &[&group, "another-group"]);

    for who in [&sa, &user] {
        let client = cp.client_as(who).await;
        // The apiserver sees exactly the minted user and groups.
        let review = Api::<SelfSubjectReview>::all(client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .unwrap();
        let seen = review.status.and_then(|s| s.user_info).unwrap();
        assert_eq!(seen.username.as_deref(), Some(who.username().as_str()));
        let mut groups = who.groups();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_string());
        }
        assert_eq!(seen.groups.unwrap_or_default(), groups, "{who:?}");

        let err = Api::<PersistentVolume>::all(client).list(&ListParams::default()).await.unwrap_err();
        assert!(is_status(&err, 403), "{who:?} without bindings: {err}");
    }

    let role = ns.scoped("pv-lister");
    let cr = ClusterRole {
        metadata: kube::api::ObjectMeta { name: Some(role.clone()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["persistentvolumes".to_string()]),
            verbs: vec!["list".to_string()],
            ..Default::default()
        }]),
        ..Default::default()
    };
    create(&Api::<ClusterRole>::all(admin.clone()), &cr).await;
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(role.clone()), ..Default::default() },
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "ClusterRole".into(), name: role },
        subjects: Some(vec![
            Subject {
                kind: "ServiceAccount".into(),
                name: "reader".into(),
                namespace: Some(ns.name().to_string()),
                ..Default::default()
            },
            Subject {
                kind: "Group".into(),
                name: group,
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Default::default()
            },
        ]),
    };
    create(&Api::<ClusterRoleBinding>::all(admin.clone()), &binding).await;

    for who in [&sa, &user] {
        let pvs = Api::<PersistentVolume>::all(cp.client_as(who).await);
        // The RBAC authorizer learns about the binding through its informer: poll.
        let start = Instant::now();
        loop {
            match pvs.list(&ListParams::default()).await {
                Ok(_) => break,
                Err(e) if is_status(&e, 403) && start.elapsed() < T => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{who:?} with a binding: {e}"),
            }
        }
        // Only what was granted.
        let err = pvs.get("anything").await.unwrap_err();
        assert!(is_status(&err, 403), "{who:?} get: {err}");
    }
    ns.delete().await;
}

#[tokio::test]
async fn cluster_mint_writes_a_kubeconfig_for_the_identity() {
    let cp = ControlPlane::shared();
    let run_dir = cp.info().run_dir.display().to_string();
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("bob.kubeconfig");
    let (code, stdout, stderr) = run_to_end(
        &launcher_bin(),
        &[
            "mint",
            "--run-dir",
            &run_dir,
            "--user",
            "bob",
            "--group",
            "g1",
            "--group",
            "g2",
            "--out",
            path.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), path.to_str().unwrap());
    let client = client_from_kubeconfig(&path).await;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let seen = review.status.and_then(|s| s.user_info).unwrap();
    assert_eq!(seen.username.as_deref(), Some("bob"));
    assert_eq!(seen.groups.unwrap_or_default(), ["g1", "g2", "system:authenticated"]);

    let (code, stdout, stderr) = run_to_end(
        &launcher_bin(),
        &["mint", "--run-dir", &run_dir, "--service-account", "ns1/sa1"],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.trim().ends_with("users/sa-ns1-sa1.kubeconfig"), "{stdout}");
    let (code, _, stderr) = run_to_end(&launcher_bin(), &["mint", "--run-dir", &run_dir], Duration::from_secs(10));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("exactly one of --user and --service-account"), "{stderr}");
}

#[test]
fn stopping_a_control_plane_leaves_no_process_or_run_dir() {
    let cp = ControlPlane::start();
    let info = cp.info().clone();
    assert!(info.pids.components().iter().all(|&p| p > 0 && alive(p)), "{:?}", info.pids);
    assert!(info.kubeconfig.is_file() && info.log_dir.join("kube-apiserver.log").is_file());
    assert!(info.startup_ms.kcm > 0, "{:?}", info.startup_ms);
    let launcher = cp.launcher_pid().unwrap();

    // Closing stdin (what dropping does) stops the cluster.
    let start = Instant::now();
    let status = cp.stop().expect("the launcher exits by itself");
    assert!(status.success(), "launcher exit status {status}");
    assert!(!alive(launcher));
    assert_all_gone(&info, Duration::from_secs(5));
    eprintln!("stopped in {:?}", start.elapsed());
    if std::env::var_os(csi_sidecar_integration::cluster::KEEP_ENV).is_none() {
        // (Kept only if marked failed, e.g. by a concurrent test's panic.)
        let marked = info.run_dir.join(csi_sidecar_integration::cluster::FAILED_MARKER).exists();
        assert!(!info.run_dir.exists() || marked, "a clean run's dir is deleted: {}", info.run_dir.display());
    }
}

/// `cluster serve --nodes 2`: two hollow kubelets, each Ready as its own
/// Node with its own root directory, and none of their processes or
/// directories (sockets, pods, plugin registrations) left after the stop.
#[tokio::test]
async fn nodes_are_ready_and_leave_nothing_behind() {
    let cp = ControlPlane::spawn_launcher(&launcher_bin(), &["--nodes", "2"]).expect("a cluster with 2 nodes");
    let info = cp.info().clone();
    let names: Vec<&str> = info.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-1", "node-2"], "{:?}", info.nodes);
    let scheduler = info.pids.kube_scheduler.expect("the scheduler runs with nodes");
    assert!(alive(scheduler));
    let client = cp.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in &info.nodes {
        assert!(alive(n.pid), "{n:?}");
        assert!(n.registration_dir.is_dir() && n.plugins_dir.is_dir(), "{n:?}");
        let node = nodes.get(&n.name).await.expect("node");
        let ready = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(ready.iter().any(|c| c.type_ == "Ready" && c.status == "True"), "{ready:?}");
        // The node lifecycle controller lifted the not-ready taint: pods can land here.
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(taints.iter().all(|t| t.key != "node.kubernetes.io/not-ready"), "{taints:?}");
    }
    assert_ne!(info.nodes[0].root_dir, info.nodes[1].root_dir);
    let status = cp.stop().expect("the launcher exits by itself");
    assert!(status.success(), "launcher exit status {status}");
    let start = Instant::now();
    let pids: Vec<u32> = info.nodes.iter().map(|n| n.pid).chain([scheduler]).collect();
    while pids.iter().any(|&p| alive(p)) {
        assert!(start.elapsed() < Duration::from_secs(5), "still alive: {pids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for n in &info.nodes {
        assert!(!n.root_dir.exists(), "left behind: {}", n.root_dir.display());
    }
}

#[test]
fn killing_the_parent_tears_the_cluster_down() {
    // The launcher's parent is a bash holding the write end of its stdin (a
    // coproc, as documented for shell use); SIGKILL the bash.
    let script = r#"coproc CLUSTER { "$0" serve --quiet; }
read -r line <&"${CLUSTER[0]}" || exit 1
printf '%s\n' "$line"
read -r _"#;
    let mut bash = Command::new("bash")
        .args(["-c", script])
        .arg(launcher_bin())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(bash.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let info: ClusterInfo = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(info.pids.components().iter().all(|&p| alive(p)));

    bash.kill().unwrap();
    bash.wait().unwrap();
    // The launcher is reparented; it notices EOF and stops everything in order.
    let start = Instant::now();
    while alive(info.pids.launcher) {
        assert!(start.elapsed() < Duration::from_secs(30), "launcher still running");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_all_gone(&info, Duration::from_secs(5));
}

/// `cluster serve --snapshots`: the snapshot CRDs of the pinned release are
/// served, and the real snapshot-controller binds a VolumeSnapshot of a bound
/// claim to a VolumeSnapshotContent it creates for the driver (the part a
/// CSI snapshotter sidecar then acts on).
#[tokio::test]
async fn snapshot_controller_creates_the_content_of_a_volume_snapshot() {
    use kube::{
        api::{ApiResource, DynamicObject},
        core::GroupVersionKind,
    };
    let cp = ControlPlane::with_snapshots();
    assert!(cp.info().pids.snapshot_controller.is_some_and(alive), "{:?}", cp.info().pids);
    let client = cp.client().await;
    let ns = TestNamespace::new(&client, "snap").await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let class = ns.scoped("class");
    create(&Api::<StorageClass>::all(client.clone()), &storage_class(&class, DRIVER)).await;
    let pv_name = ns.scoped("pv");
    let handle = format!("handle-{pv_name}");
    let mut pv = csi_pv(&pv_name, DRIVER, &handle, "1Mi");
    pv.spec.as_mut().unwrap().storage_class_name = Some(class.clone());
    create(&pvs, &pv).await;
    create(&pvcs, &pvc("claim", Some(&class), "1Mi")).await;
    wait_for(&pvcs, "claim", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;

    let kind = |k: &str| ApiResource::from_gvk(&GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", k));
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &kind("VolumeSnapshotClass"));
    let snapshots: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &kind("VolumeSnapshot"));
    let contents: Api<DynamicObject> = Api::all_with(client.clone(), &kind("VolumeSnapshotContent"));
    let snap_class = ns.scoped("snapclass");
    let obj = |k: &str, v: serde_json::Value| -> DynamicObject {
        let mut v = v;
        v["apiVersion"] = "snapshot.storage.k8s.io/v1".into();
        v["kind"] = k.into();
        serde_json::from_value(v).expect("object")
    };
    classes
        .create(
            &PostParams::default(),
            &obj(
                "VolumeSnapshotClass",
                serde_json::json!({"metadata": {"name": snap_class}, "driver": DRIVER, "deletionPolicy": "Retain"}),
            ),
        )
        .await
        .expect("class");
    let snap = snapshots
        .create(
            &PostParams::default(),
            &obj(
                "VolumeSnapshot",
                serde_json::json!({"metadata": {"name": "snap"},
                    "spec": {"volumeSnapshotClassName": snap_class, "source": {"persistentVolumeClaimName": "claim"}}}),
            ),
        )
        .await
        .expect("snapshot");
    let uid = snap.metadata.uid.clone().expect("uid");
    let content_name = format!("snapcontent-{uid}");
    let content = wait_for(&contents, &content_name, T, |_| true).await;
    let spec = &content.data["spec"];
    assert_eq!(spec["driver"], DRIVER, "{content:?}");
    assert_eq!(spec["source"]["volumeHandle"], handle.as_str(), "{content:?}");
    assert_eq!(spec["deletionPolicy"], "Retain", "{content:?}");
    assert_eq!(spec["volumeSnapshotRef"]["uid"], uid.as_str(), "{content:?}");
    assert!(content.data.get("status").is_none_or(|s| s.is_null()), "nobody created it yet: {content:?}");
    wait_for(&snapshots, "snap", T, |s| {
        s.data["status"]["boundVolumeSnapshotContentName"].as_str() == Some(content_name.as_str())
    })
    .await;

    // Clean up as far as the controller can without a CSI snapshotter: the
    // content's bound-protection finalizer is the sidecar's to remove.
    snapshots.delete("snap", &DeleteParams::default()).await.expect("delete snapshot");
    wait_deleted(&snapshots, "snap", T).await;
    // (Deleted first: the controller re-adds the finalizer to a content
    // that is not being deleted.)
    contents.delete(&content_name, &DeleteParams::default()).await.expect("delete content");
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    contents.patch(&content_name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("finalizers");
    wait_deleted(&contents, &content_name, T).await;
    classes.delete(&snap_class, &DeleteParams::default()).await.expect("delete class");
    ns.delete().await;
}
