//! snapshotter failures the mock driver cannot show, with the fault driver
//! and the real snapshot-controller: final and non-final CreateSnapshot
//! errors, timeouts, nonsense answers, ListSnapshots and DeleteSnapshot
//! failures, the secret path, the start-up refusals, and hung snapshot calls
//! beside another module's. The provisioner and the snapshotter run in one
//! csi-sidecar process.

use std::time::Duration;

use csi_sidecar_integration::{
    cluster::ControlPlane,
    deref_fault_env,
    fault_driver::{FaultDriver, FaultEnv, Script, SnapshotMethod, Transport},
    kube_support::{create, csi_node, csi_pv, pvc, storage_class, volume_attachment, wait_deleted, wait_for},
    sidecar_bin,
    snapshots::{SnapApis, being_created, error_message, obj, ready},
    wait_until,
};
use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim, Secret},
        storage::v1::{CSINode, StorageClass, VolumeAttachment},
    },
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use tonic::Code;

const T: Duration = Duration::from_secs(60);

struct Env {
    base: FaultEnv,
    sc: String,
    snaps: SnapApis,
}

deref_fault_env!(Env);

impl Env {
    async fn new(prefix: &str) -> Env {
        let base = FaultEnv::on(ControlPlane::with_snapshots(), prefix).await;
        let sc = base.storage_class("sc", |_| {}).await;
        let snaps = SnapApis::new(base.ns.client(), base.ns.name());
        Env { base, sc, snaps }
    }

    /// A driver that snapshots (after `script`'s changes) and csi-sidecar
    /// running provisioner and snapshotter (`args` after the snapshotter).
    fn start(
        &self,
        script: impl FnOnce(Script) -> Script,
        args: &[&str],
    ) -> (FaultDriver, csi_sidecar_integration::process::Proc) {
        self.start_with_provisioner("snapshotter", script(Script { snapshots: true, ..self.script() }), args)
    }

    async fn bound_claim(&self, name: &str) -> String {
        format!("fault-{}", self.base.bound_claim(name, &self.sc, T).await)
    }

    /// A bound claim, a class (`policy`, `params`) and a VolumeSnapshot of
    /// it; returns (class, content name, volume handle).
    async fn snapshot(&self, policy: &str, params: serde_json::Value) -> (String, String, String) {
        let volume = self.bound_claim("data").await;
        let class = self.ns.scoped("vsc");
        self.snaps.class(&class, &self.driver_name, policy, params).await;
        let content = self.snaps.snapshot_of("snap", &class, "data").await;
        (class, content, volume)
    }

    async fn wait_error(&self, content: &str, want: &str) -> kube::api::DynamicObject {
        wait_for(&self.snaps.contents, content, T, |c| error_message(c).is_some_and(|m| m.contains(want))).await
    }

    async fn cleanup(&self, class: &str, content: &str) {
        let _ = self.snaps.snapshots.delete("snap", &Default::default()).await;
        wait_deleted(&self.snaps.snapshots, "snap", T).await;
        wait_deleted(&self.snaps.contents, content, T).await;
        self.snaps.delete_class(class).await;
    }
}

fn gaps(calls: &[csi_sidecar_integration::fault_driver::SnapshotCall]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1].at - w[0].at).collect()
}

#[tokio::test]
async fn a_final_error_is_recorded_retried_with_backoff_and_then_succeeds() {
    let env = Env::new("snapf-final").await;
    let (driver, sidecar) = env.start(
        |s| Script { create_snapshot_error: Some((Code::InvalidArgument, "no snapshots today".into())), ..s },
        &[],
    );
    let (class, content, volume) = env.snapshot("Delete", serde_json::Value::Null).await;
    let want = format!(
        "failed to take snapshot of the volume {volume}: \"rpc error: code = InvalidArgument desc = no snapshots today\""
    );
    let c = env.wait_error(&content, &want).await;
    assert_eq!(c.data["status"]["readyToUse"], false);
    let first = env.snaps.wait_content_event(&content, "SnapshotCreationFailed", T).await;
    assert_eq!(first[0].1, format!("Failed to create snapshot: {want}"));
    assert_eq!(first[0].0, format!("csi-snapshotter {}", env.driver_name));
    let later = env.snaps.wait_content_event(&content, "SnapshotContentCheckandUpdateFailed", T).await;
    assert_eq!(later[0].1, format!("Failed to check and update snapshot content: {want}"));
    // Retried with a growing delay (200ms, 400ms, 800ms, ...).
    let calls = wait_until("four CreateSnapshot attempts", T, async || {
        let c = driver.snapshot_calls_of(SnapshotMethod::Create);
        (c.len() >= 4, c)
    })
    .await;
    let g = gaps(&calls);
    assert!(g[2] > g[0], "backoff grows: {g:?}");
    assert!(g[0] >= Duration::from_millis(150), "not retried at once: {g:?}");
    // A final error: the driver is not making it, so the annotation goes
    // after each attempt (each retry sets it again before its call; with a
    // non-final code it would never go, see the timeout test).
    wait_for(&env.snaps.contents, &content, T, |c| !being_created(c) && error_message(c).is_some()).await;

    driver.update(|s| s.create_snapshot_error = None);
    // The status (ready) and the annotation's removal are two writes, in
    // that order, as upstream's: wait for both.
    let c = wait_for(&env.snaps.contents, &content, T, |c| ready(c) && !being_created(c)).await;
    assert!(c.data["status"]["error"].is_null(), "ready clears the error: {c:?}");
    assert_eq!(c.data["status"]["restoreSize"].as_i64(), Some(1 << 20), "the driver's size in bytes: {c:?}");
    assert_eq!(c.data["status"]["creationTime"].as_i64(), Some(1_700_000_000_123_456_789), "nanoseconds: {c:?}");
    let snap = env.snaps.wait_snapshot_ready("snap", T).await;
    assert_eq!(snap.data["status"]["restoreSize"], "1Mi", "{snap:?}");
    env.cleanup(&class, &content).await;
    assert_eq!(driver.snapshot_calls_of(SnapshotMethod::Delete).len(), 1);
    assert!(sidecar.logs().contains("CreateSnapshot failed"), "the failure is logged");
}

#[tokio::test]
async fn a_timeout_or_unavailable_keeps_the_being_created_annotation_until_an_answer() {
    let env = Env::new("snapf-timeout").await;
    let (driver, mut sidecar) =
        env.start(|s| Script { create_snapshot_delay: Duration::from_secs(3), ..s }, &["--timeout=500ms"]);
    let (class, content, _) = env.snapshot("Delete", serde_json::Value::Null).await;
    let c = env.wait_error(&content, "code = DeadlineExceeded").await;
    assert!(being_created(&c), "the outcome is unknown: the annotation stays: {c:?}");
    // Deleted meanwhile: the deletion waits for the creation to finish.
    env.snaps.delete_snapshot("snap").await;
    driver.update(|s| {
        s.create_snapshot_delay = Duration::ZERO;
        s.create_snapshot_error = Some((Code::Unavailable, "backend restarting".into()));
    });
    let c = env.wait_error(&content, "code = Unavailable desc = backend restarting").await;
    assert!(being_created(&c), "Unavailable is not final either: {c:?}");
    let c = wait_for(&env.snaps.contents, &content, T, |c| c.metadata.deletion_timestamp.is_some()).await;
    assert!(being_created(&c), "not deleted while the driver may still be creating: {c:?}");
    assert!(driver.snapshot_calls_of(SnapshotMethod::Delete).is_empty(), "nothing deleted before the answer");
    driver.update(|s| s.create_snapshot_error = None);
    // The answer comes: the snapshot is recorded, then deleted.
    wait_deleted(&env.snaps.contents, &content, T).await;
    let names: std::collections::BTreeSet<String> =
        driver.snapshot_calls_of(SnapshotMethod::Create).into_iter().map(|c| c.target).collect();
    assert_eq!(names.len(), 1, "every attempt asked for the same name: {names:?}");
    assert_eq!(driver.snapshot_calls_of(SnapshotMethod::Delete).len(), 1, "the snapshot made is deleted");
    assert!(driver.snapshots.lock().expect("snapshots").is_empty(), "nothing leaked in the backend");
    wait_deleted(&env.snaps.snapshots, "snap", T).await;
    env.snaps.delete_class(&class).await;
    assert!(sidecar.try_exit().is_none());
}

#[tokio::test]
async fn a_nonsense_answer_is_an_error_not_a_crash() {
    let env = Env::new("snapf-empty").await;
    let (driver, mut sidecar) = env.start(|s| Script { create_snapshot_empty: true, ..s }, &[]);
    let (class, content, _) = env.snapshot("Delete", serde_json::Value::Null).await;
    let c = env.wait_error(&content, "CreateSnapshot answered without a snapshot or snapshot_id").await;
    assert!(being_created(&c), "the driver may have made something: {c:?}");
    driver.update(|s| s.create_snapshot_empty = false);
    env.snaps.wait_content_ready(&content, T).await;
    env.cleanup(&class, &content).await;
    assert!(sidecar.try_exit().is_none(), "still running");
}

#[tokio::test]
async fn the_snapshotter_secret_reaches_the_driver_and_never_the_log() {
    let env = Env::new("snapf-secret").await;
    const VALUE: &str = "s3cr3t-snapshot-value";
    let secrets: Api<Secret> = env.ns.api();
    let secret = Secret {
        metadata: ObjectMeta { name: Some("snap-creds".into()), ..Default::default() },
        data: Some([("password".to_string(), ByteString(VALUE.as_bytes().to_vec()))].into()),
        ..Default::default()
    };
    create(&secrets, &secret).await;
    let (driver, sidecar) =
        env.start(|s| Script { required_secret: Some(("password".into(), VALUE.into())), ..s }, &[]);
    // The provisioner needs the secret too (required_secret covers CreateVolume).
    let sc_api = Api::<StorageClass>::all(env.ns.client().clone());
    let sc = env.ns.scoped("sc-secret");
    let mut class = storage_class(&sc, &env.driver_name);
    class.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name".to_string(), "snap-creds".to_string()),
            ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), env.ns.name().to_string()),
        ]
        .into(),
    );
    create(&sc_api, &class).await;
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("data", Some(&sc), "1Mi")).await;
    wait_for(&pvcs, "data", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let vsc = env.ns.scoped("vsc");
    let params = serde_json::json!({
        "csi.storage.k8s.io/snapshotter-secret-name": "${volumesnapshot.name}-creds",
        "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}",
    });
    env.snaps.class(&vsc, &env.driver_name, "Delete", params).await;
    let content = env.snaps.snapshot_of("snap", &vsc, "data").await;
    let c = env.snaps.wait_content_ready(&content, T).await;
    let ann = c.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get("snapshot.storage.kubernetes.io/deletion-secret-name").map(String::as_str), Some("snap-creds"));
    let creates = driver.snapshot_calls_of(SnapshotMethod::Create);
    assert!(creates.iter().all(|c| c.secrets.get("password").map(String::as_str) == Some(VALUE)), "{creates:?}");
    assert!(creates.iter().all(|c| !c.parameters.keys().any(|k| k.starts_with("csi.storage.k8s.io/"))), "{creates:?}");
    env.snaps.delete_snapshot("snap").await;
    wait_deleted(&env.snaps.contents, &content, T).await;
    let deletes = driver.snapshot_calls_of(SnapshotMethod::Delete);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].secrets.get("password").map(String::as_str), Some(VALUE));
    assert!(!sidecar.logs().contains(VALUE), "a secret value reached the log");
    assert!(sidecar.logs().contains("CreateSnapshot"), "requests are logged at -v=5 (redacted)");
    env.snaps.delete_class(&vsc).await;
}

#[tokio::test]
async fn list_snapshots_failures_are_reported_and_retried() {
    let env = Env::new("snapf-list").await;
    let (driver, _sidecar) = env.start(|s| s, &[]);
    let content = env.ns.scoped("static");
    let handle = "fault-snap-preexisting";
    let v = serde_json::json!({"metadata": {"name": content}, "spec": {
        "deletionPolicy": "Delete", "driver": env.driver_name, "source": {"snapshotHandle": handle},
        "volumeSnapshotRef": {"name": "snap", "namespace": env.ns.name()}}});
    env.snaps.contents.create(&PostParams::default(), &obj("VolumeSnapshotContent", v)).await.expect("content");
    let v =
        serde_json::json!({"metadata": {"name": "snap"}, "spec": {"source": {"volumeSnapshotContentName": content}}});
    env.snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await.expect("snapshot");
    let want = format!(
        "Failed to check and update snapshot content: failed to list snapshot for content {content}: \"can not find snapshot for snapshotID {handle}\""
    );
    env.wait_error(&content, &want).await;
    let events = env.snaps.wait_content_event(&content, "SnapshotContentCheckandUpdateFailed", T).await;
    assert_eq!(events[0].1, want);
    driver.update(|s| s.list_snapshots_error = Some((Code::Internal, "list broke".into())));
    env.wait_error(&content, "rpc error: code = Internal desc = list broke").await;
    // The snapshot appears in the backend and the driver recovers.
    driver.snapshots.lock().expect("snapshots").insert("pre".into(), (handle.into(), "vol".into()));
    driver.update(|s| s.list_snapshots_error = None);
    let c = env.snaps.wait_content_ready(&content, T).await;
    assert_eq!(c.data["status"]["snapshotHandle"], handle);
    assert!(c.data["status"]["error"].is_null(), "{c:?}");
    env.snaps.wait_snapshot_ready("snap", T).await;
    assert!(driver.snapshot_calls_of(SnapshotMethod::Create).is_empty());
    // Policy Delete on a pre-provisioned content: deleted in the backend.
    env.snaps.delete_snapshot("snap").await;
    wait_deleted(&env.snaps.contents, &content, T).await;
    let deletes = driver.snapshot_calls_of(SnapshotMethod::Delete);
    assert_eq!(deletes.iter().map(|d| d.target.as_str()).collect::<Vec<_>>(), [handle]);
}

#[tokio::test]
async fn without_list_snapshots_a_pre_provisioned_content_is_ready_at_once() {
    let env = Env::new("snapf-nolist").await;
    let (driver, _sidecar) = env.start(|s| Script { list_snapshots: false, ..s }, &[]);
    let content = env.ns.scoped("static");
    let v = serde_json::json!({"metadata": {"name": content}, "spec": {
        "deletionPolicy": "Retain", "driver": env.driver_name, "source": {"snapshotHandle": "anything"},
        "volumeSnapshotRef": {"name": "snap", "namespace": env.ns.name()}}});
    env.snaps.contents.create(&PostParams::default(), &obj("VolumeSnapshotContent", v)).await.expect("content");
    let c = env.snaps.wait_content_ready(&content, T).await;
    assert!(c.data["status"]["restoreSize"].is_null(), "{c:?}");
    assert!(driver.snapshot_calls().is_empty(), "{:?}", driver.snapshot_calls());
    env.snaps.force_delete_content(&content).await;
}

#[tokio::test]
async fn a_failed_delete_is_retried_with_an_event() {
    let env = Env::new("snapf-delete").await;
    let (driver, _sidecar) =
        env.start(|s| Script { delete_snapshot_error: Some((Code::Internal, "busy".into())), ..s }, &[]);
    let (class, content, _) = env.snapshot("Delete", serde_json::Value::Null).await;
    env.snaps.wait_snapshot_ready("snap", T).await;
    env.snaps.delete_snapshot("snap").await;
    let events = env.snaps.wait_content_event(&content, "SnapshotDeleteError", T).await;
    assert_eq!(events[0].1, "Failed to delete snapshot");
    wait_until("DeleteSnapshot retried", T, async || {
        let n = driver.snapshot_calls_of(SnapshotMethod::Delete).len();
        (n >= 3, n)
    })
    .await;
    assert!(env.snaps.contents.get_opt(&content).await.expect("get").is_some(), "kept while the backend refuses");
    driver.update(|s| s.delete_snapshot_error = None);
    wait_deleted(&env.snaps.contents, &content, T).await;
    assert!(driver.snapshots.lock().expect("snapshots").is_empty());
    env.snaps.delete_class(&class).await;
}

#[tokio::test]
async fn start_up_refusals_exit_1_like_upstream() {
    let env = Env::new("snapf-startup").await;
    let _driver = FaultDriver::start(&env.socket(), Transport::Grpc, env.script());
    let run = |args: &[&str]| {
        let mut p = env.sidecar("csi-snapshotter", &sidecar_bin(), args);
        async move {
            let status = p.wait_exit(T).await.expect("exits");
            (status.code(), p.logs())
        }
    };
    let (code, logs) = run(&["snapshotter", "--snapshot-name-prefix="]).await;
    assert_eq!(code, Some(1), "{logs}");
    assert!(logs.contains("Snapshot name prefix cannot be of length 0"), "{logs}");
    let (code, logs) = run(&["snapshotter", "--node-deployment", "--leader-election"]).await;
    assert_eq!(code, Some(1), "{logs}");
    assert!(logs.contains("Leader election cannot happen when node-deployment is set to true"), "{logs}");
    // The driver does not advertise CREATE_DELETE_SNAPSHOT.
    let (code, logs) = run(&["snapshotter"]).await;
    assert_eq!(code, Some(1), "{logs}");
    assert!(
        logs.contains(&format!("CSI driver {} does not support ControllerCreateSnapshot", env.driver_name)),
        "{logs}"
    );
}

/// Two snapshotter replicas; the leader is killed with SIGKILL while 30
/// snapshots are being created: every VolumeSnapshot ends ready, each with
/// its own backend snapshot, and the backend holds exactly one snapshot per
/// VolumeSnapshot (named after its UID: a retry by the new leader finds the
/// one its predecessor made).
#[tokio::test]
async fn leader_killed_during_30_snapshots_creates_each_exactly_once() {
    let env = Env::new("snapf-kill").await;
    let driver = FaultDriver::start(
        &env.socket(),
        Transport::Grpc,
        Script { snapshots: true, create_snapshot_delay: Duration::from_millis(300), ..env.script() },
    );
    let provisioner = env.sidecar("provisioner", &sidecar_bin(), &["provisioner"]);
    env.bound_claim("data").await;
    let class = env.ns.scoped("vsc");
    env.snaps.class(&class, &env.driver_name, "Delete", serde_json::Value::Null).await;
    let mut args: Vec<String> = csi_sidecar_integration::failover::fast_leader_election(env.ns.name());
    args.extend(
        ["snapshotter", "--worker-threads=3", "--retry-interval-start=200ms", "--retry-interval-max=2s"]
            .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = env.sidecar("snapshotter-a", &sidecar_bin(), &args);
    let mut b = env.sidecar("snapshotter-b", &sidecar_bin(), &args);
    csi_sidecar_integration::failover::wait_one_leader(&a, &b).await;
    let lease = format!("external-snapshotter-leader-{}", env.driver_name.replace('.', "-"));
    csi_sidecar_integration::failover::assert_lease_held(&env.ns, &lease).await;
    const N: usize = 30;
    let mut contents = Vec::new();
    for i in 0..N {
        let name = format!("s{i}");
        let v = serde_json::json!({"metadata": {"name": name},
            "spec": {"volumeSnapshotClassName": class, "source": {"persistentVolumeClaimName": "data"}}});
        let s = env.snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", v)).await.expect("snapshot");
        contents.push(s.metadata.uid.expect("uid"));
    }
    wait_until("some snapshots made", T, async || {
        let n = driver.snapshots.lock().expect("snapshots").len();
        (n >= 5, n)
    })
    .await;
    csi_sidecar_integration::failover::kill_leader(&mut a, &mut b).await;
    let ready = wait_until("every VolumeSnapshot ready", Duration::from_secs(120), async || {
        let list = env.snaps.snapshots.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        let ready: Vec<_> = list.into_iter().filter(csi_sidecar_integration::snapshots::ready).collect();
        (ready.len() == N, ready.len())
    })
    .await;
    assert_eq!(ready, N);
    let backend = driver.snapshots.lock().expect("snapshots").clone();
    assert_eq!(backend.len(), N, "one backend snapshot per VolumeSnapshot: {backend:?}");
    let want: std::collections::BTreeSet<String> = contents.iter().map(|uid| format!("snapshot-{uid}")).collect();
    assert_eq!(backend.keys().cloned().collect::<std::collections::BTreeSet<_>>(), want);
    let mut handles = std::collections::BTreeSet::new();
    for uid in &contents {
        let c = env.snaps.contents.get(&csi_sidecar_integration::snapshots::content_name(uid)).await.expect("content");
        let h = c.data["status"]["snapshotHandle"].as_str().expect("handle").to_string();
        assert_eq!(h, format!("fault-snap-snapshot-{uid}"));
        handles.insert(h);
    }
    assert_eq!(handles.len(), N, "distinct handles");
    drop(provisioner);
}

/// `--node-deployment`: only the contents labelled
/// `snapshot.storage.kubernetes.io/managed-by=$NODE_NAME` are this
/// process's; without `NODE_NAME` it refuses to start, as upstream.
#[tokio::test]
async fn node_deployment_serves_only_its_nodes_contents() {
    let env = Env::new("snapf-node").await;
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, Script { snapshots: true, ..env.script() });
    for (name, handle) in [("mine", "fault-snap-a"), ("theirs", "fault-snap-b")] {
        driver.snapshots.lock().expect("snapshots").insert(name.into(), (handle.into(), "vol".into()));
    }
    let content = |name: &str, node: &str, handle: &str| {
        obj(
            "VolumeSnapshotContent",
            serde_json::json!({"metadata": {"name": env.ns.scoped(name),
                    "labels": {"snapshot.storage.kubernetes.io/managed-by": node}},
                "spec": {"deletionPolicy": "Retain", "driver": env.driver_name, "source": {"snapshotHandle": handle},
                         "volumeSnapshotRef": {"name": name, "namespace": env.ns.name()}}}),
        )
    };
    let pp = PostParams::default();
    env.snaps.contents.create(&pp, &content("mine", "node-a", "fault-snap-a")).await.expect("content");
    env.snaps.contents.create(&pp, &content("theirs", "node-b", "fault-snap-b")).await.expect("content");
    let sidecar_args = |node: Option<&str>| {
        let mut args: Vec<String> = node.map(|n| format!("NODE_NAME={n}")).into_iter().collect();
        args.push(sidecar_bin().display().to_string());
        args.extend([
            format!("--csi-address={}", env.socket().display()),
            format!("--kubeconfig={}", env.kubeconfig.display()),
            "snapshotter".into(),
            "--node-deployment".into(),
        ]);
        args
    };
    let env_bin = std::path::Path::new("env");
    let mut refused =
        csi_sidecar_integration::process::Proc::spawn("no-node", env_bin, &sidecar_args(None), env.dir.path());
    let status = refused.wait_exit(T).await.expect("exits");
    assert_eq!(status.code(), Some(1), "{}", refused.logs());
    assert!(refused.logs().contains("The NODE_NAME environment variable must be set"), "{}", refused.logs());

    let _node_a =
        csi_sidecar_integration::process::Proc::spawn("node-a", env_bin, &sidecar_args(Some("node-a")), env.dir.path());
    env.snaps.wait_content_ready(&env.ns.scoped("mine"), T).await;
    let lists: Vec<String> = driver.snapshot_calls_of(SnapshotMethod::List).into_iter().map(|c| c.target).collect();
    assert!(lists.iter().all(|t| t == "fault-snap-a"), "only this node's content was checked: {lists:?}");
    let theirs = env.snaps.contents.get(&env.ns.scoped("theirs")).await.expect("content");
    assert!(theirs.data["status"].is_null(), "another node's content is left alone: {theirs:?}");
    for name in ["mine", "theirs"] {
        env.snaps.force_delete_content(&env.ns.scoped(name)).await;
    }
}

/// A driver that hangs every CreateSnapshot does not delay another module's
/// calls on the shared connection, nor does one module's worker count take
/// the process from another's (issue 38, item 5): while each of the
/// snapshotter's 100 workers waits on its CreateSnapshot, the attacher's
/// default 10 attach ten volumes (each ControllerPublishVolume answered)
/// before any CreateSnapshot has returned.
#[tokio::test]
async fn hanging_snapshot_calls_do_not_delay_another_modules_calls() {
    const HUNG: usize = 100; // the snapshotter's --worker-threads below
    const ATTACHMENTS: usize = 10;
    let env = Env::new("snapf-hang").await;
    let hang = |s| Script { publish: true, create_snapshot_delay: Duration::from_secs(600), ..s };
    let (driver, _sidecar) = env.start(hang, &["--timeout=600s", "--worker-threads=100", "attacher"]);
    env.bound_claim("data").await;
    let class = env.ns.scoped("vsc");
    env.snaps.class(&class, &env.driver_name, "Delete", serde_json::Value::Null).await;
    for i in 0..HUNG {
        env.snaps.snapshot_of(&format!("s{i}"), &class, "data").await;
    }
    wait_until("every snapshotter worker waits on the driver", T, async || {
        let n = driver.snapshot_calls_of(SnapshotMethod::Create).len();
        (n >= HUNG, n)
    })
    .await;

    let node = format!("{}-node", env.ns.name());
    create(&Api::<CSINode>::all(env.ns.client().clone()), &csi_node(&node, &env.driver_name, "node-id", &[])).await;
    let (pvs, vas): (Api<PersistentVolume>, Api<VolumeAttachment>) =
        (Api::all(env.ns.client().clone()), Api::all(env.ns.client().clone()));
    let names: Vec<String> = (0..ATTACHMENTS).map(|i| env.ns.scoped(&format!("va{i}"))).collect();
    for n in &names {
        create(&pvs, &csi_pv(n, &env.driver_name, &format!("vol-{n}"), "1Mi")).await;
        create(&vas, &volume_attachment(n, &env.driver_name, &node, n)).await;
    }
    for n in &names {
        wait_for(&vas, n, T, |v| v.status.as_ref().is_some_and(|s| s.attached)).await;
    }
    assert_eq!(driver.publish_calls().len(), ATTACHMENTS);
    assert!(driver.snapshots.lock().expect("snapshots").is_empty(), "no CreateSnapshot has returned yet");
}
