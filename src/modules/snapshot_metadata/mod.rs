//! snapshot-metadata (external-snapshot-metadata, Changed Block Tracking):
//! serves the Kubernetes SnapshotMetadata API over TLS on the listener the
//! host bound, checks each request (`decide`, `request`), and passes the
//! driver's CSI SnapshotMetadata stream on (`forward`, `server`). Every
//! replica serves (no Lease). The gRPC health service (`health`) says
//! NOT_SERVING until the driver is validated, and again once shutdown
//! begins; `/health` on the shared HTTP server answers the same.

pub mod api;
pub mod client;
pub mod config;
pub mod cr;
pub mod decide;
pub mod forward;
pub mod health;
pub mod lister;
pub mod request;
pub mod serve;
pub mod server;
pub mod tls;

use std::{path::Path, sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use tokio::sync::OnceCell;

use crate::{
    compat::snapshot_metadata as upstream,
    csi::proto::csi::v1::plugin_capability::service::Type as Service,
    healthz::{HealthCheck, HealthReport},
    k8s::{informers::Informers, snapshot_api},
    modules::contract::{Module, ModuleContext, ModuleError},
};
use config::SnapshotMetadataFlags;
use cr::SnapshotMetadataService;

const MODULE: &str = "snapshot-metadata";

/// The health check of the gRPC server (`/healthz/<this>`; in `/health` and
/// `/healthz` with the others).
pub const SERVER_CHECK: &str = "snapshot-metadata-server";

impl Module for SnapshotMetadataFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        let config = |message: String| ModuleError::Config { module: MODULE, message };
        self.tls_min().map_err(config)?;
        match self.tls_files(|v| std::env::var(v).ok()) {
            (Some(_), Some(_)) => Ok(()),
            _ => Err(config("--tls-cert and --tls-key (or $TLS_CERT_PATH and $TLS_KEY_PATH) are required".into())),
        }
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn listen_address(&self) -> Option<String> {
        Some(SnapshotMetadataFlags::listen_address(self))
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// `/health`: 200 `ok` while the gRPC side serves, 503 `not ready` before
/// (upstream's).
struct ServingCheck(health::Serving);

impl HealthCheck for ServingCheck {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let report =
            if self.0.is_serving() { HealthReport::ok() } else { HealthReport::failed(503, upstream::NOT_READY_BODY) };
        futures::future::ready(report).boxed()
    }
}

/// The server's TLS configuration from the flags (an error names the file
/// or the flag).
fn tls_config(cfg: &SnapshotMetadataFlags) -> Result<Arc<rustls::ServerConfig>, String> {
    let (Some(cert), Some(key)) = cfg.tls_files(|v| std::env::var(v).ok()) else {
        return Err("no TLS certificate and key".into());
    };
    let choice = tls::TlsChoice {
        min: cfg.tls_min()?,
        cipher_suites: tls::split_names(&cfg.tls_cipher_suites),
        curves: tls::split_names(&cfg.tls_curve_preferences),
    };
    let provider = Arc::new(tls::provider(&choice).map_err(|e| e.to_string())?);
    let pair = tls::ReloadingCert::load(Path::new(&cert), Path::new(&key), provider).map_err(|e| e.to_string())?;
    tls::server_config(&choice, Arc::new(pair)).map(Arc::new).map_err(|e| e.to_string())
}

/// Serves until shutdown: the server at once (NOT_SERVING), the driver
/// validated, the caches synced, then SERVING.
pub async fn run(cfg: SnapshotMetadataFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let config = |message: String| ModuleError::Config { module: MODULE, message };
    let fatal = |message: String| ModuleError::Fatal { module: MODULE, message };
    let tls = tls_config(&cfg).map_err(config)?;
    let kube = ctx.kube.clone().ok_or_else(|| fatal("no Kubernetes client".into()))?;
    let listener = ctx.listener.clone().ok_or_else(|| fatal("no listener".into()))?;
    let serving = health::Serving::default();
    // Beside the host's check of the module under its own name.
    ctx.health.register(SERVER_CHECK, Arc::new(ServingCheck(serving.clone())));
    let checks = Arc::new(OnceCell::new());
    let service = server::SnapshotMetadataService {
        checks: checks.clone(),
        csi: ctx.csi.clone(),
        max_streaming: cfg.max_streaming(),
    };
    let router = tonic::transport::Server::builder()
        .add_service(serving.service())
        .add_service(api::snapshot_metadata_server::SnapshotMetadataServer::new(service));
    let stopping = ctx.shutdown.child_token();
    let server = {
        let stopping = stopping.clone();
        tokio::spawn(async move { serve::serve(&listener, tls, router, stopping).await })
    };
    tracing::info!(address = %cfg.listen_address(), "SnapshotMetadata server listening");

    let ready = async {
        let Some(driver) = ctx.csi.wait_for_driver(&ctx.shutdown).await else { return Ok(()) };
        if !driver.has_plugin_service(Service::SnapshotMetadataService) {
            return Err(config(upstream::unsupported(&driver.name)));
        }
        let (made, synced) = request_checks(&cfg, &kube, driver.name.clone()).await.map_err(fatal)?;
        kube.informers.start(&ctx.process);
        futures::future::join_all(synced).await;
        let _ = checks.set(made);
        serving.set(true);
        tracing::info!(driver = %driver.name, "Driver validated; serving SnapshotMetadata");
        Ok(())
    };
    let outcome = tokio::select! {
        r = ready => r,
        _ = ctx.shutdown.cancelled() => Ok(()),
    };
    if outcome.is_ok() {
        ctx.shutdown.cancelled().await;
    }
    serving.set(false);
    stopping.cancel();
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "SnapshotMetadata server failed"),
        Err(e) => tracing::error!(error = %e, "SnapshotMetadata server task failed"),
    }
    outcome
}

/// The checks, and the caches' syncs to wait for before serving.
async fn request_checks(
    cfg: &SnapshotMetadataFlags,
    kube: &crate::k8s::KubeContext,
    driver: Arc<str>,
) -> Result<(request::Checks, Vec<BoxFuture<'static, ()>>), String> {
    let informers: &Informers = &kube.informers;
    let mut waits: Vec<BoxFuture<'static, ()>> = Vec::new();
    let snapshots = snapshot_api::installed(&kube.client, "volumesnapshotcontents")
        .await
        .map_err(|e| format!("cannot read the snapshot API: {}", crate::k8s::error_text(&e)))?;
    let (contents, classes) = if snapshots {
        let contents = crate::modules::views::driver_snapshot_contents(informers, &driver);
        let classes = crate::modules::views::snapshot_classes(informers);
        let (c, k) = (contents.clone(), classes.clone());
        waits.push(async move { c.synced().await }.boxed());
        waits.push(async move { k.synced().await }.boxed());
        (Some(contents), Some(classes))
    } else {
        (None, None)
    };
    let services = if cfg.audience.is_empty() {
        let gv = format!("{}/{}", cr::GROUP, cr::VERSION);
        let served = snapshot_api::serves(&kube.client, &gv, &[cr::PLURAL])
            .await
            .map_err(|e| format!("cannot read the {gv} API: {}", crate::k8s::error_text(&e)))?;
        served.then(|| {
            let inf = informers.get::<SnapshotMetadataService>();
            let i = inf.clone();
            waits.push(async move { i.synced().await }.boxed());
            inf
        })
    } else {
        None
    };
    let checks = request::Checks {
        client: kube.client.clone(),
        driver,
        audience: cfg.audience.clone(),
        services,
        contents,
        classes,
    };
    Ok((checks, waits))
}
