//! What the snapshot-metadata tests and bench share: the server's
//! self-signed TLS files, a backup application's ServiceAccount, the
//! driver's SnapshotMetadataService, the wait for SERVING, and the block
//! records a stream returns.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use csi_sidecar::modules::snapshot_metadata::{
    api::{self, snapshot_metadata_client::SnapshotMetadataClient},
    client,
};
use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, PostParams},
};
use tonic::{Code, transport::Channel};

/// The server's key pair, a self-signed certificate for 127.0.0.1.
pub struct TlsFiles {
    /// `tls.crt`.
    pub cert: PathBuf,
    /// `tls.key`.
    pub key: PathBuf,
    /// The certificate's PEM, what a client trusts.
    pub ca: Vec<u8>,
}

impl TlsFiles {
    /// A new pair written to `dir` (`tls.crt`, `tls.key`).
    pub fn write(dir: &Path) -> Result<TlsFiles, String> {
        let mut files = TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca: Vec::new() };
        files.ca = files.rotate()?;
        Ok(files)
    }

    /// Replaces the pair with a new one (the key first, as a rotated Secret
    /// may land); the new certificate's PEM.
    pub fn rotate(&self) -> Result<Vec<u8>, String> {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).map_err(|e| e.to_string())?;
        std::fs::write(&self.key, made.signing_key.serialize_pem()).map_err(|e| format!("tls.key: {e}"))?;
        std::fs::write(&self.cert, made.cert.pem()).map_err(|e| format!("tls.crt: {e}"))?;
        Ok(made.cert.pem().into_bytes())
    }
}

/// ServiceAccount `name` of namespace `ns` (a backup application's),
/// allowed to get VolumeSnapshots there when `may_read`.
pub async fn backup_account(client: &Client, ns: &str, name: &str, may_read: bool) -> kube::Result<()> {
    let meta = || ObjectMeta { name: Some(name.to_string()), namespace: Some(ns.to_string()), ..Default::default() };
    let pp = PostParams::default();
    let sa = ServiceAccount { metadata: meta(), ..Default::default() };
    Api::<ServiceAccount>::namespaced(client.clone(), ns).create(&pp, &sa).await?;
    if !may_read {
        return Ok(());
    }
    let rule = PolicyRule {
        api_groups: Some(vec!["snapshot.storage.k8s.io".into()]),
        resources: Some(vec!["volumesnapshots".into()]),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &Role { metadata: meta(), rules: Some(vec![rule]) })
        .await?;
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.into() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(ns.to_string()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns).create(&pp, &binding).await?;
    Ok(())
}

/// Creates the SnapshotMetadataService of `driver` (cluster-scoped, named
/// after it): the server's address, the CA a client trusts, the audience.
pub async fn create_service(
    client: &Client,
    driver: &str,
    address: &str,
    ca: &[u8],
    audience: &str,
) -> kube::Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cbt.storage.k8s.io", "v1beta1", "SnapshotMetadataService"),
        "snapshotmetadataservices",
    );
    let services: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let ca = k8s_openapi::ByteString(ca.to_vec());
    let cr = serde_json::json!({"apiVersion": "cbt.storage.k8s.io/v1beta1", "kind": "SnapshotMetadataService",
        "metadata": {"name": driver},
        "spec": {"address": address, "caCert": ca, "audience": audience}});
    let cr: DynamicObject = serde_json::from_value(cr).map_err(kube::Error::SerdeError)?;
    services.create(&PostParams::default(), &cr).await.map(drop)
}

/// Whether the server at `address` (trusting `ca`) says SERVING
/// (grpc.health.v1); the error when it cannot be asked.
pub async fn serving(address: &str, ca: &[u8]) -> Result<bool, String> {
    client::serving(address, ca).await.map_err(|e| e.to_string())
}

/// Waits up to `timeout` until the server at `address` says SERVING.
pub async fn wait_serving(address: &str, ca: &[u8], timeout: Duration) {
    crate::wait_until("the server SERVING", timeout, async || {
        let answer = serving(address, ca).await;
        (answer == Ok(true), format!("{address}: {answer:?}"))
    })
    .await;
}

/// A stream's block records (offset, size), or the status that ended it.
pub type Records = Result<Vec<(i64, i64)>, (Code, String)>;

fn refusal(s: tonic::Status) -> (Code, String) {
    (s.code(), s.message().to_string())
}

/// The records of a `GetMetadataAllocated` call.
pub async fn allocated(c: &mut SnapshotMetadataClient<Channel>, req: api::GetMetadataAllocatedRequest) -> Records {
    records(c.get_metadata_allocated(req).await, |r| &r.block_metadata).await
}

/// The records of a `GetMetadataDelta` call.
pub async fn delta(c: &mut SnapshotMetadataClient<Channel>, req: api::GetMetadataDeltaRequest) -> Records {
    records(c.get_metadata_delta(req).await, |r| &r.block_metadata).await
}

/// Every record of a call's stream of responses (`blocks` of each).
async fn records<T>(
    call: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
    blocks: fn(&T) -> &[api::BlockMetadata],
) -> Records {
    let mut stream = call.map_err(refusal)?.into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.message().await.map_err(refusal)? {
        out.extend(blocks(&r).iter().map(|b| (b.byte_offset, b.size_bytes)));
    }
    Ok(out)
}

/// (offset, size) of each 4 KiB block of `list`.
pub fn blocks(list: &[i64]) -> Vec<(i64, i64)> {
    const BLOCK: i64 = 4096;
    list.iter().map(|b| (b * BLOCK, BLOCK)).collect()
}
