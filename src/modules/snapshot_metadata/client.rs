//! A client of the Kubernetes SnapshotMetadata API, as a backup
//! application is one: the VolumeSnapshot's driver, its
//! SnapshotMetadataService (address, CA, audience), a ServiceAccount token
//! for that audience, then the call over TLS trusting the CA. The tests use
//! it, and operators through `csi-sidecar snapshot-metadata allocated|delta`.

use std::sync::Arc;

use hyper_util::rt::TokioIo;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{Api, Client, api::PostParams};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{api::snapshot_metadata_client::SnapshotMetadataClient, cr::SnapshotMetadataService};
use crate::k8s::{
    error_text,
    snapshot_api::{VolumeSnapshot, VolumeSnapshotContent},
};

/// What went wrong on the client's side (each names the object or address).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A Kubernetes read or the token request failed.
    #[error("{what}: {error}")]
    Kube {
        /// What was read or asked.
        what: String,
        /// The API's error.
        error: String,
    },
    /// The SnapshotMetadataService is unusable (no CA, a bad address).
    #[error("SnapshotMetadataService {name}: {problem}")]
    Service {
        /// Its name (the driver's).
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// Connecting to the server failed.
    #[error("connecting to {address}: {error}")]
    Connect {
        /// `spec.address`.
        address: String,
        /// The transport's error.
        error: String,
    },
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClientError {
    let what = what.into();
    move |e| ClientError::Kube { what, error: error_text(&e) }
}

/// The driver of VolumeSnapshot `namespace/name` (its content's).
pub async fn driver_of(client: &Client, namespace: &str, name: &str) -> Result<String, ClientError> {
    let snapshot = Api::<VolumeSnapshot>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(kube_error(format!("VolumeSnapshot {namespace}/{name}")))?;
    let content = snapshot.status.and_then(|s| s.bound_volume_snapshot_content_name).ok_or_else(|| {
        ClientError::Kube { what: format!("VolumeSnapshot {namespace}/{name}"), error: "not bound to a content".into() }
    })?;
    let content = Api::<VolumeSnapshotContent>::all(client.clone())
        .get(&content)
        .await
        .map_err(kube_error(format!("VolumeSnapshotContent {content}")))?;
    Ok(content.spec.driver)
}

/// The SnapshotMetadataService of `driver`.
pub async fn service_of(client: &Client, driver: &str) -> Result<SnapshotMetadataService, ClientError> {
    Api::<SnapshotMetadataService>::all(client.clone())
        .get(driver)
        .await
        .map_err(kube_error(format!("SnapshotMetadataService {driver}")))
}

/// A token of ServiceAccount `namespace/name` for `audience` (TokenRequest).
pub async fn token_for(client: &Client, namespace: &str, name: &str, audience: &str) -> Result<String, ClientError> {
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![audience.to_string()], ..Default::default() },
        ..Default::default()
    };
    let made: TokenRequest = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map_err(kube_error(format!("a token of ServiceAccount {namespace}/{name}")))?;
    Ok(made.status.map(|s| s.token).unwrap_or_default())
}

/// A client of the server at `address` (`host:port`) whose certificate
/// `ca_pem` signed; the TLS name is the address's host.
pub async fn connect(address: &str, ca_pem: &[u8]) -> Result<SnapshotMetadataClient<Channel>, ClientError> {
    channel(address, ca_pem).await.map(SnapshotMetadataClient::new)
}

/// Whether the server at `address` says it serves (`grpc.health.v1`):
/// the driver validated and the caches synced.
pub async fn serving(address: &str, ca_pem: &[u8]) -> Result<bool, ClientError> {
    use super::health::proto::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    let mut health = HealthClient::new(channel(address, ca_pem).await?);
    let answer = health.check(HealthCheckRequest { service: String::new() }).await;
    Ok(answer.is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32))
}

/// A channel to the server at `address` over TLS trusting `ca_pem`.
pub async fn channel(address: &str, ca_pem: &[u8]) -> Result<Channel, ClientError> {
    let connect_error = |e: String| ClientError::Connect { address: address.to_string(), error: e };
    let mut roots = RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem) {
        let cert: rustls_pki_types::CertificateDer<'static> =
            cert.map_err(|e| connect_error(format!("the CA: {e}")))?;
        roots.add(cert).map_err(|e| connect_error(format!("the CA: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| connect_error(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let host = match address.rsplit_once(':') {
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => address.to_string(),
    };
    let name = ServerName::try_from(host).map_err(|e| connect_error(e.to_string()))?;
    let target = address.to_string();
    let endpoint = Endpoint::from_shared(format!("http://{address}")).map_err(|e| connect_error(e.to_string()))?;
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let (connector, name, target) = (connector.clone(), name.clone(), target.clone());
            async move {
                let tcp = TcpStream::connect(&target).await?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| {
            connect_error(format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()))
        })?;
    Ok(channel)
}
