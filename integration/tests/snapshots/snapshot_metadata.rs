//! The snapshot-metadata module against the real control plane, the real
//! snapshot-controller and the fault driver's SnapshotMetadata service: a
//! backup client (the module's own `client`) takes a ServiceAccount token
//! for the audience, dials the server over TLS trusting its certificate and
//! reads the allocated and changed blocks of real snapshots; every refusal
//! answers upstream's code and message.

use std::time::Duration;

use csi_sidecar::modules::snapshot_metadata::{
    api::{self, snapshot_metadata_client::SnapshotMetadataClient},
    client,
};
use csi_sidecar_integration::{
    cluster::{ControlPlane, Identity},
    deref_fault_env,
    fault_driver::{FaultDriver, FaultEnv, Script},
    kube_support::{create, pvc, wait_for},
    process::Proc,
    sidecar_bin,
    snapshot_metadata::{TlsFiles, allocated, backup_account, blocks, create_service, delta, wait_serving},
    snapshots::{SnapApis, obj},
    workspace_root,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolumeClaim, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use tonic::{Code, transport::Channel};

const T: Duration = Duration::from_secs(60);
const BLOCK: i64 = 4096;
const AUDIENCE: &str = "csi-sidecar-test-backup";

struct Env {
    base: FaultEnv,
    snaps: SnapApis,
    driver: FaultDriver,
    /// The snapshot-metadata process.
    sidecar: Proc,
    /// The provisioner and snapshotter.
    _controllers: Proc,
    address: String,
    /// The module process's HTTP endpoint.
    http: String,
    tls: TlsFiles,
    sc: String,
    class: String,
}

deref_fault_env!(Env);

/// A ServiceAccount of the test namespace bound to exactly the
/// ClusterRole of `manifests/rbac/snapshot-metadata.yaml` (named after the
/// namespace); its kubeconfig.
async fn module_identity(cp: &ControlPlane, base: &FaultEnv) -> std::path::PathBuf {
    let (client, ns) = (base.ns.client().clone(), base.ns.name().to_string());
    let file = workspace_root().join("manifests/rbac/snapshot-metadata.yaml");
    let docs = csi_sidecar_integration::yaml::documents(&file);
    let role = docs.iter().find(|d| csi_sidecar_integration::yaml::kind(d) == "ClusterRole").expect("the ClusterRole");
    let mut role: ClusterRole = serde_json::from_value(role.clone()).expect("ClusterRole");
    let role_name = format!("{ns}-snapshot-metadata");
    role.metadata.name = Some(role_name.clone());
    create(&Api::<ClusterRole>::all(client.clone()), &role).await;
    let account = "csi-sidecar-controller";
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(account.into()), namespace: Some(ns.clone()), ..Default::default() },
        ..Default::default()
    };
    create(&Api::<ServiceAccount>::namespaced(client.clone(), &ns), &sa).await;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(role_name.clone()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role_name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    create(&Api::<ClusterRoleBinding>::all(client), &binding).await;
    cp.mint(&Identity::service_account(&ns, account))
}

/// A free loopback port no other test process picks meanwhile.
fn free_port() -> u16 {
    let [port] = csi_sidecar_integration::ports::free_ports::<1>().expect("a free port");
    port
}

impl Env {
    /// The driver with its SnapshotMetadata service, csi-sidecar running
    /// provisioner and snapshotter, and a second csi-sidecar running
    /// snapshot-metadata under exactly `manifests/rbac/snapshot-metadata.yaml`
    /// (TLS with a certificate for 127.0.0.1, `--audience` unless `audience`
    /// is None: then the SnapshotMetadataService's).
    async fn new(prefix: &str, audience: Option<&str>) -> Env {
        let cp = ControlPlane::with_snapshots();
        let base = FaultEnv::on(cp, prefix).await;
        let module_kubeconfig = module_identity(cp, &base).await;
        let tls = TlsFiles::write(base.dir.path()).expect("TLS files");
        let port = free_port();
        let script = Script { snapshots: true, snapshot_metadata: true, ..base.script() };
        let mut args = vec![
            "snapshot-metadata".to_string(),
            format!("--tls-cert={}", tls.cert.display()),
            format!("--tls-key={}", tls.key.display()),
            "--bind-address=127.0.0.1".to_string(),
            format!("--port={port}"),
        ];
        args.extend(audience.map(|a| format!("--audience={a}")));
        let http = format!("127.0.0.1:{}", free_port());
        args.extend(["-v=5".to_string(), format!("--csi-address={}", base.socket().display())]);
        args.push(format!("--http-endpoint={http}"));
        args.push(format!("--kubeconfig={}", module_kubeconfig.display()));
        let (driver, _controllers) = base.start_with_provisioner("snapshotter", script, &[]);
        let sidecar = Proc::spawn_env("snapshot-metadata", &sidecar_bin(), &args, &[], base.dir.path());
        let snaps = SnapApis::new(base.ns.client(), base.ns.name());
        let address = format!("127.0.0.1:{port}");
        let sc = base.storage_class("sc", |_| {}).await;
        let class = base.ns.scoped("vsc");
        snaps.class(&class, &base.driver_name, "Delete", serde_json::Value::Null).await;
        let env = Env { base, snaps, driver, sidecar, _controllers, address, http, tls, sc, class };
        let (client, ns) = (env.ns.client(), env.ns.name());
        backup_account(client, ns, "backup", true).await.expect("ServiceAccount backup");
        backup_account(client, ns, "nosy", false).await.expect("ServiceAccount nosy");
        env
    }

    async fn token(&self, account: &str, audience: &str) -> String {
        client::token_for(self.ns.client(), self.ns.name(), account, audience).await.expect("token")
    }

    /// A client, once the server says it serves (driver validated, caches
    /// synced).
    async fn client(&self) -> SnapshotMetadataClient<Channel> {
        wait_serving(&self.address, &self.tls.ca, T).await;
        client::connect(&self.address, &self.tls.ca).await.expect("client")
    }

    /// A bound claim's volume handle (`block`: volumeMode Block), `blocks`
    /// blocks.
    async fn volume(&self, claim: &str, block: bool, blocks: u64) -> String {
        let mut c = pvc(claim, Some(&self.sc), "1Mi");
        if block && let Some(spec) = c.spec.as_mut() {
            spec.volume_mode = Some("Block".into());
        }
        let pvcs: Api<PersistentVolumeClaim> = self.ns.api();
        create(&pvcs, &c).await;
        let bound =
            wait_for(&pvcs, claim, T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
        let handle = format!("fault-{}", bound.spec.and_then(|s| s.volume_name).expect("volumeName"));
        self.driver.set_volume_size(&handle, blocks * BLOCK as u64);
        handle
    }

    /// VolumeSnapshot `name` of `claim`, ready; its content's snapshot handle.
    async fn snapshot(&self, name: &str, claim: &str) -> String {
        let content = self.snaps.snapshot_of(name, &self.class, claim).await;
        let ready = self.snaps.wait_content_ready(&content, T).await;
        self.snaps.wait_snapshot_ready(name, T).await;
        ready.data["status"]["snapshotHandle"].as_str().expect("snapshotHandle").to_string()
    }
}

#[tokio::test]
async fn allocated_and_delta_return_exactly_the_blocks_written_and_refusals_are_upstreams() {
    let env = Env::new("smd", Some(AUDIENCE)).await;
    let volume = env.volume("data", true, 64).await;
    for b in [1u64, 2, 3, 10] {
        env.driver.write_volume(&volume, b * BLOCK as u64, b"first");
    }
    let first = env.snapshot("first", "data").await;
    for b in [3u64, 20, 21] {
        env.driver.write_volume(&volume, b * BLOCK as u64, b"second");
    }
    env.snapshot("second", "data").await;

    let token = env.token("backup", AUDIENCE).await;
    let ns = env.ns.name().to_string();
    let mut c = env.client().await;
    let ask = |snapshot: &str, offset: i64, max: i32| api::GetMetadataAllocatedRequest {
        security_token: token.clone(),
        namespace: ns.clone(),
        snapshot_name: snapshot.to_string(),
        starting_offset: offset,
        max_results: max,
    };
    assert_eq!(allocated(&mut c, ask("first", 0, 0)).await, Ok(blocks(&[1, 2, 3, 10])));
    assert_eq!(allocated(&mut c, ask("second", 0, 2)).await, Ok(blocks(&[1, 2, 3, 10, 20, 21])), "two per response");
    assert_eq!(allocated(&mut c, ask("second", 10 * BLOCK, 0)).await, Ok(blocks(&[10, 20, 21])), "from an offset");
    let changed = |base: &str, target: &str| api::GetMetadataDeltaRequest {
        security_token: token.clone(),
        namespace: ns.clone(),
        base_snapshot_id: base.to_string(),
        target_snapshot_name: target.to_string(),
        starting_offset: 0,
        max_results: 0,
    };
    assert_eq!(delta(&mut c, changed(&first, "second")).await, Ok(blocks(&[3, 20, 21])), "base by handle");
    assert_eq!(delta(&mut c, changed("first", "second")).await, Ok(blocks(&[3, 20, 21])), "base by name");

    // Refusals, each with upstream's code and message.
    let refused = |code: Code, message: &str| Err((code, message.to_string()));
    let no_token = api::GetMetadataAllocatedRequest { security_token: String::new(), ..ask("first", 0, 0) };
    assert_eq!(allocated(&mut c, no_token).await, refused(Code::InvalidArgument, "securityToken is missing"));
    let no_ns = api::GetMetadataAllocatedRequest { namespace: String::new(), ..ask("first", 0, 0) };
    assert_eq!(allocated(&mut c, no_ns).await, refused(Code::InvalidArgument, "namespace parameter cannot be empty"));
    let other_audience = env.token("backup", "someone-else").await;
    let wrong = api::GetMetadataAllocatedRequest { security_token: other_audience, ..ask("first", 0, 0) };
    assert_eq!(allocated(&mut c, wrong).await, refused(Code::Unauthenticated, "unauthenticated user"));
    let nosy = env.token("nosy", AUDIENCE).await;
    let denied =
        allocated(&mut c, api::GetMetadataAllocatedRequest { security_token: nosy, ..ask("first", 0, 0) }).await;
    assert!(
        matches!(&denied, Err((Code::PermissionDenied, m)) if m.starts_with("user does not have permissions to perform the operation: ")),
        "{denied:?}"
    );
    let missing = allocated(&mut c, ask("missing", 0, 0)).await;
    assert!(
        matches!(&missing, Err((Code::Unavailable, m)) if m.starts_with(&format!("failed to get VolumeSnapshot '{ns}/missing': "))),
        "{missing:?}"
    );

    // A snapshot that cannot become ready (its claim does not exist).
    let unready = serde_json::json!({"metadata": {"name": "unready"},
        "spec": {"volumeSnapshotClassName": env.class, "source": {"persistentVolumeClaimName": "no-such-claim"}}});
    env.snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", unready)).await.expect("snapshot");
    assert_eq!(
        allocated(&mut c, ask("unready", 0, 0)).await,
        refused(Code::Unavailable, "the VolumeSnapshot is not yet ready, name: unready")
    );

    // A filesystem volume's snapshot: the driver's refusal passes through.
    env.volume("files", false, 16).await;
    env.snapshot("files-snap", "files").await;
    assert_eq!(
        allocated(&mut c, ask("files-snap", 0, 0)).await,
        refused(Code::InvalidArgument, "source volume does not have block mode access type")
    );
    // A base of another volume.
    let other = env.volume("other", true, 16).await;
    env.driver.write_volume(&other, 0, b"other");
    let other_base = env.snapshot("other-snap", "other").await;
    let across = delta(&mut c, changed(&other_base, "second")).await;
    assert!(matches!(&across, Err((Code::InvalidArgument, m)) if m.contains("different volumes")), "{across:?}");

    // Another driver's snapshot, bound and ready (pre-provisioned).
    let foreign = env.ns.scoped("foreign");
    let content = serde_json::json!({"metadata": {"name": foreign},
        "spec": {"deletionPolicy": "Retain", "driver": "other.example.com", "source": {"snapshotHandle": "h-other"},
                 "volumeSnapshotRef": {"name": "foreign", "namespace": ns}}});
    env.snaps.contents.create(&PostParams::default(), &obj("VolumeSnapshotContent", content)).await.expect("content");
    let status = serde_json::json!({"status": {"readyToUse": true, "snapshotHandle": "h-other"}});
    env.snaps.contents.patch_status(&foreign, &PatchParams::default(), &Patch::Merge(&status)).await.expect("status");
    let snap = serde_json::json!({"metadata": {"name": "foreign"}, "spec": {"source": {"volumeSnapshotContentName": foreign}}});
    env.snaps.snapshots.create(&PostParams::default(), &obj("VolumeSnapshot", snap)).await.expect("snapshot");
    env.snaps.wait_snapshot_ready("foreign", T).await;
    let theirs = format!("VolumeSnapshot 'foreign' does not belong to the CSI driver '{}'", env.driver_name);
    assert_eq!(allocated(&mut c, ask("foreign", 0, 0)).await, refused(Code::InvalidArgument, &theirs));

    // A class naming a snapshotter secret: read for each call (with the
    // module's `get secrets`); gone, the call is refused naming it.
    let secured = env.ns.scoped("vsc-secret");
    let params = serde_json::json!({"csi.storage.k8s.io/snapshotter-secret-name": "smd-creds",
        "csi.storage.k8s.io/snapshotter-secret-namespace": ns});
    env.snaps.class(&secured, &env.driver_name, "Delete", params).await;
    let secrets: Api<Secret> = env.ns.api();
    let secret = Secret {
        metadata: ObjectMeta { name: Some("smd-creds".into()), ..Default::default() },
        string_data: Some([("token".to_string(), "hunter2".to_string())].into()),
        ..Default::default()
    };
    create(&secrets, &secret).await;
    let content = env.snaps.snapshot_of("secured", &secured, "data").await;
    env.snaps.wait_content_ready(&content, T).await;
    env.snaps.wait_snapshot_ready("secured", T).await;
    assert_eq!(allocated(&mut c, ask("secured", 0, 0)).await, Ok(blocks(&[1, 2, 3, 10, 20, 21])));
    secrets.delete("smd-creds", &Default::default()).await.expect("delete the secret");
    let gone = allocated(&mut c, ask("secured", 0, 0)).await;
    assert!(
        matches!(&gone, Err((Code::Unavailable, m)) if m.starts_with("failed to get credentials: ") && m.contains("smd-creds")),
        "{gone:?}"
    );
    let logs = env.sidecar.logs();
    assert!(!logs.contains("hunter2"), "a secret's value never reaches the log");
    assert!(!logs.contains(&token), "a client's token never reaches the log (at -v=5)");
}

/// Without `--audience`, the audience is the driver's
/// SnapshotMetadataService's, and a client finds the server as a backup
/// application does: from the snapshot, through its driver's CR.
#[tokio::test]
async fn the_audience_and_the_address_come_from_the_snapshot_metadata_service() {
    let env = Env::new("smd-cr", None).await;
    let client = env.ns.client();
    create_service(client, &env.driver_name, &env.address, &env.tls.ca, "from-the-cr").await.expect("CR");
    let volume = env.volume("data", true, 16).await;
    env.driver.write_volume(&volume, 5 * BLOCK as u64, b"five");
    env.snapshot("snap", "data").await;

    let (client, ns) = (env.ns.client(), env.ns.name());
    let driver = client::driver_of(client, ns, "snap").await.expect("driver");
    assert_eq!(driver, env.driver_name);
    let service = client::service_of(client, &driver).await.expect("SnapshotMetadataService");
    let token = client::token_for(client, ns, "backup", &service.spec.audience).await.expect("token");
    let ca = service.spec.ca_cert.expect("caCert").0;
    wait_serving(&service.spec.address, &ca, T).await;
    // Upstream's `/health` on the HTTP endpoint, and the host's check of
    // the module beside the server's.
    for path in ["/health", "/healthz/snapshot-metadata", "/healthz/snapshot-metadata-server"] {
        let reply = csi_sidecar_integration::http::get(&env.http, path).await.expect("HTTP endpoint");
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok"), "{path}");
    }
    let mut c = client::connect(&service.spec.address, &ca).await.expect("client");
    let ask = api::GetMetadataAllocatedRequest {
        security_token: token,
        namespace: ns.to_string(),
        snapshot_name: "snap".into(),
        starting_offset: 0,
        max_results: 0,
    };
    assert_eq!(allocated(&mut c, ask.clone()).await, Ok(blocks(&[5])));
    let flag_audience = env.token("backup", AUDIENCE).await;
    let wrong = api::GetMetadataAllocatedRequest { security_token: flag_audience, ..ask };
    assert_eq!(allocated(&mut c, wrong).await, Err((Code::Unauthenticated, "unauthenticated user".to_string())));
}

/// A certificate rotated while a stream runs: the stream completes, the
/// next connection gets the new certificate. SIGTERM while a stream runs:
/// the stream completes (the server stops gracefully) and the process
/// exits within the grace.
#[tokio::test]
async fn a_rotated_certificate_and_sigterm_leave_streams_in_flight_complete() {
    let mut env = Env::new("smd-rotate", Some(AUDIENCE)).await;
    let volume = env.volume("data", true, 64).await;
    for b in 0..8u64 {
        env.driver.write_volume(&volume, b * BLOCK as u64, b"x");
    }
    env.snapshot("snap", "data").await;
    let token = env.token("backup", AUDIENCE).await;
    let ask = api::GetMetadataAllocatedRequest {
        security_token: token,
        namespace: env.ns.name().to_string(),
        snapshot_name: "snap".into(),
        starting_offset: 0,
        max_results: 1,
    };
    // Eight responses, 300 ms apart.
    env.driver.update(|s| s.metadata_response_delay = Duration::from_millis(300));
    let mut c = env.client().await;
    let mut stream = c.get_metadata_allocated(ask.clone()).await.expect("stream").into_inner();
    let first = stream.message().await.expect("first response").expect("a response");
    assert_eq!(first.block_metadata.len(), 1);

    let new_ca = env.tls.rotate().expect("the rotated pair");
    let mut responses = 1;
    while stream.message().await.expect("the stream goes on").is_some() {
        responses += 1;
    }
    assert_eq!(responses, 8, "every block of the stream begun before the rotation");
    let old_refused = match client::connect(&env.address, &env.tls.ca).await {
        Err(_) => true,
        Ok(mut c) => allocated(&mut c, ask.clone()).await.is_err(),
    };
    assert!(old_refused, "a new connection trusting only the old certificate is refused");
    let mut c = client::connect(&env.address, &new_ca).await.expect("the rotated certificate");
    let mut stream = c.get_metadata_allocated(ask).await.expect("stream").into_inner();
    stream.message().await.expect("first response").expect("a response");

    env.sidecar.signal(nix::sys::signal::Signal::SIGTERM);
    let mut got = 1;
    let end = loop {
        match stream.message().await {
            Ok(Some(_)) => got += 1,
            Ok(None) => break Ok(()),
            Err(s) => break Err(s.code()),
        }
    };
    assert_eq!((end, got), (Ok(()), 8), "the stream in flight completes");
    let exit = env.sidecar.wait_exit(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "the process exits 0 within the grace: {exit:?}");
}
