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
    cluster::ControlPlane, deref_fault_env, fault_driver::FaultDriver, fault_driver::FaultEnv, fault_driver::Script,
    kube_support::create, process::Proc, snapshots::SnapApis, wait_until,
};
use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{Api, api::ObjectMeta};
use tonic::{Code, transport::Channel};

const T: Duration = Duration::from_secs(60);
const BLOCK: i64 = 4096;
const AUDIENCE: &str = "csi-sidecar-test-backup";

struct Env {
    base: FaultEnv,
    snaps: SnapApis,
    driver: FaultDriver,
    _sidecar: Proc,
    address: String,
    ca: Vec<u8>,
}

deref_fault_env!(Env);

/// A free port on the loopback address (bound, then released for the server).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("address").port()
}

impl Env {
    /// The driver with its SnapshotMetadata service, and csi-sidecar
    /// running provisioner, snapshotter and snapshot-metadata (TLS with a
    /// certificate for 127.0.0.1, `--audience`).
    async fn new(prefix: &str) -> Env {
        let base = FaultEnv::on(ControlPlane::with_snapshots(), prefix).await;
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
        let (cert, key) = (base.dir.path().join("tls.crt"), base.dir.path().join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).expect("tls.crt");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("tls.key");
        let port = free_port();
        let script = Script { snapshots: true, snapshot_metadata: true, ..base.script() };
        let args = [
            "snapshot-metadata".to_string(),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            "--bind-address=127.0.0.1".to_string(),
            format!("--port={port}"),
            format!("--audience={AUDIENCE}"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (driver, sidecar) = base.start_with_provisioner("snapshotter", script, &args);
        let snaps = SnapApis::new(base.ns.client(), base.ns.name());
        let address = format!("127.0.0.1:{port}");
        let ca = made.cert.pem().into_bytes();
        let env = Env { base, snaps, driver, _sidecar: sidecar, address, ca };
        env.service_account("backup", true).await;
        env.service_account("nosy", false).await;
        env
    }

    /// ServiceAccount `name`, allowed to get VolumeSnapshots in the
    /// namespace when `may_read`.
    async fn service_account(&self, name: &str, may_read: bool) {
        let (client, ns) = (self.ns.client().clone(), self.ns.name().to_string());
        let meta =
            |n: &str| ObjectMeta { name: Some(n.to_string()), namespace: Some(ns.clone()), ..Default::default() };
        create(
            &Api::<ServiceAccount>::namespaced(client.clone(), &ns),
            &ServiceAccount { metadata: meta(name), ..Default::default() },
        )
        .await;
        if !may_read {
            return;
        }
        let rule = PolicyRule {
            api_groups: Some(vec!["snapshot.storage.k8s.io".into()]),
            resources: Some(vec!["volumesnapshots".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        };
        create(&Api::<Role>::namespaced(client.clone(), &ns), &Role { metadata: meta(name), rules: Some(vec![rule]) })
            .await;
        let binding = RoleBinding {
            metadata: meta(name),
            role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.into() },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some(ns.clone()),
                ..Default::default()
            }]),
        };
        create(&Api::<RoleBinding>::namespaced(client, &ns), &binding).await;
    }

    async fn token(&self, account: &str, audience: &str) -> String {
        client::token_for(self.ns.client(), self.ns.name(), account, audience).await.expect("token")
    }

    /// A client, once the server answers.
    async fn client(&self) -> SnapshotMetadataClient<Channel> {
        wait_until("the server accepting TLS connections", T, async || {
            let c = client::connect(&self.address, &self.ca).await;
            (c.is_ok(), c.ok())
        })
        .await
        .expect("client")
    }

    /// A bound claim's volume handle, `size` blocks.
    async fn volume(&self, claim: &str, sc: &str, blocks: u64) -> String {
        let handle = format!("fault-{}", self.base.bound_claim(claim, sc, T).await);
        self.driver.set_volume_size(&handle, blocks * BLOCK as u64);
        handle
    }

    /// VolumeSnapshot `name` of `claim`, ready; its content's snapshot handle.
    async fn snapshot(&self, name: &str, class: &str, claim: &str) -> String {
        let content = self.snaps.snapshot_of(name, class, claim).await;
        let ready = self.snaps.wait_content_ready(&content, T).await;
        self.snaps.wait_snapshot_ready(name, T).await;
        ready.data["status"]["snapshotHandle"].as_str().expect("snapshotHandle").to_string()
    }
}

type Records = Result<Vec<(i64, i64)>, (Code, String)>;

async fn allocated(c: &mut SnapshotMetadataClient<Channel>, req: api::GetMetadataAllocatedRequest) -> Records {
    let mut stream = c.get_metadata_allocated(req).await.map_err(|s| (s.code(), s.message().to_string()))?.into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.message().await.map_err(|s| (s.code(), s.message().to_string()))? {
        out.extend(r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)));
    }
    Ok(out)
}

async fn delta(c: &mut SnapshotMetadataClient<Channel>, req: api::GetMetadataDeltaRequest) -> Records {
    let mut stream = c.get_metadata_delta(req).await.map_err(|s| (s.code(), s.message().to_string()))?.into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.message().await.map_err(|s| (s.code(), s.message().to_string()))? {
        out.extend(r.block_metadata.iter().map(|b| (b.byte_offset, b.size_bytes)));
    }
    Ok(out)
}

fn blocks(list: &[i64]) -> Vec<(i64, i64)> {
    list.iter().map(|b| (b * BLOCK, BLOCK)).collect()
}

#[tokio::test]
async fn allocated_and_delta_return_exactly_the_blocks_written_and_refusals_are_upstreams() {
    let env = Env::new("smd").await;
    let sc = env.storage_class("sc", |_| {}).await;
    let class = env.ns.scoped("vsc");
    env.snaps.class(&class, &env.driver_name, "Delete", serde_json::Value::Null).await;
    let volume = env.volume("data", &sc, 64).await;
    for b in [1u64, 2, 3, 10] {
        env.driver.write_volume(&volume, b * BLOCK as u64, b"first");
    }
    let first = env.snapshot("first", &class, "data").await;
    for b in [3u64, 20, 21] {
        env.driver.write_volume(&volume, b * BLOCK as u64, b"second");
    }
    env.snapshot("second", &class, "data").await;

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
    assert_eq!(delta(&mut c, changed(&first, "second")).await, Ok(blocks(&[3, 20, 21])));

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
}
