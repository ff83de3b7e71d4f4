//! registrar: node-driver-registrar parity.
//!
//! Serves the kubelet plugin-registration API on
//! `<plugin-registration-path>/<driver>-reg.sock`. Beyond upstream: a slow
//! driver is waited for (discovery retries instead of one 1 s try), and a
//! registration the kubelet rejects is retried by recreating the socket with
//! backoff instead of exiting and taking the modules beside it down.

pub mod config;
pub mod decide;
pub mod socket;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, sync::mpsc};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint, Server, Uri},
};

use crate::{
    compat::{self, registrar as upstream},
    csi::proto::pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_client::RegistrationClient,
        registration_server::{self, RegistrationServer},
    },
    healthz::{HealthCheck, HealthReport},
    modules::contract::{Module, ModuleContext, ModuleError},
};
use config::RegistrarFlags;
use decide::Registration;

const NAME: &str = "registrar";
/// How long a stopping registration server may take to finish in-flight calls.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(2);

/// Upstream exits 1 without `--kubelet-registration-path`.
pub fn validate(cfg: &RegistrarFlags) -> Result<(), ModuleError> {
    match cfg.kubelet_registration_path.as_deref() {
        Some(p) if !p.is_empty() => Ok(()),
        _ => Err(ModuleError::Config {
            module: NAME,
            message: "kubelet-registration-path is a required parameter".into(),
        }),
    }
}

/// `--mode=kubelet-registration-probe` exits 0 at once (upstream made it a no-op).
pub fn early_exit(cfg: &RegistrarFlags) -> Option<u8> {
    (cfg.mode.as_deref() == Some(upstream::MODE_REGISTRATION_PROBE)).then_some(0)
}

struct RegistrationService {
    info: PluginInfo,
    events: mpsc::UnboundedSender<Registration>,
}

#[tonic::async_trait]
impl registration_server::Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        // Every health check asks this: upstream logs it at -v=4.
        tracing::debug!("Received GetInfo call");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        tracing::info!(registered = status.plugin_registered, error = %status.error, "Received NotifyRegistrationStatus call");
        let _ = self.events.send(decide::registration(status.plugin_registered, &status.error));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// `/healthz` for the registrar: the socket exists and answers `GetInfo`
/// with the driver's name. Upstream dials the socket for every request; this
/// keeps one lazily (re)connecting channel to it.
struct RegistrarHealth {
    socket: PathBuf,
    driver: Arc<str>,
    timeout: Duration,
    channel: Channel,
}

impl RegistrarHealth {
    fn new(socket: PathBuf, driver: Arc<str>, timeout: Duration) -> Self {
        let path = socket.clone();
        let channel = Endpoint::from_static("http://localhost").connect_timeout(timeout).connect_with_connector_lazy(
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }),
        );
        RegistrarHealth { socket, driver, timeout, channel }
    }
}

impl HealthCheck for RegistrarHealth {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let (socket, driver, timeout, channel) =
            (self.socket.clone(), self.driver.clone(), self.timeout, self.channel.clone());
        async move {
            let shown = socket.display().to_string();
            if let Some(r) = decide::socket_health(&socket::state(&socket), &shown) {
                return r;
            }
            let answer =
                match tokio::time::timeout(timeout, RegistrationClient::new(channel).get_info(InfoRequest {})).await {
                    Ok(r) => r,
                    Err(_) => Err(Status::deadline_exceeded(compat::DEADLINE_EXCEEDED_MESSAGE)),
                };
            match answer {
                Ok(info) => decide::self_check_health(&info.into_inner().name, &driver),
                Err(s) => HealthReport::failed(500, upstream::body_get_info_failed(&compat::grpc_error_text(&s))),
            }
        }
        .boxed()
    }
}

/// Why one incarnation of the registration socket ended.
enum Ended {
    Shutdown,
    /// The kubelet rejected the registration; `after_accept` if it had
    /// accepted one on this socket before (the backoff starts over).
    Rejected {
        after_accept: bool,
    },
    ServerFailed(String),
}

async fn serve_once(socket_path: &Path, info: PluginInfo, shutdown: &CancellationToken) -> Result<Ended, ModuleError> {
    let listener =
        socket::listen(socket_path).map_err(|e| ModuleError::Config { module: NAME, message: e.to_string() })?;
    tracing::info!(socket = %socket_path.display(), "Registration Server started");
    let (events, mut rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let server = Server::builder()
        .add_service(RegistrationServer::new(RegistrationService { info, events }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned());
    tokio::pin!(server);
    let mut accepted = false;
    let ended = loop {
        tokio::select! {
            r = &mut server => break Ended::ServerFailed(match r { Ok(()) => "server stopped".into(), Err(e) => e.to_string() }),
            Some(ev) = rx.recv() => match ev {
                Registration::Accepted => {
                    accepted = true;
                    tracing::info!("Plugin registered with the kubelet");
                }
                Registration::Rejected(e) => {
                    tracing::error!(error = %e, "The kubelet rejected the registration; recreating the socket");
                    break Ended::Rejected { after_accept: accepted };
                }
            },
            _ = shutdown.cancelled() => break Ended::Shutdown,
        }
    };
    if !matches!(ended, Ended::ServerFailed(_)) {
        stop.cancel();
        let _ = tokio::time::timeout(SERVER_STOP_GRACE, &mut server).await;
    }
    if let Err(e) = socket::remove(socket_path) {
        tracing::error!(error = %e, "Failed to remove the registration socket");
    }
    Ok(ended)
}

/// The module's entry points for the host.
impl Module for RegistrarFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        validate(self)
    }

    fn early_exit(&self) -> Option<u8> {
        early_exit(self)
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

/// Discovers the driver, then keeps its registration socket served until shutdown.
pub async fn run(cfg: RegistrarFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    validate(&cfg)?;
    let endpoint = cfg.kubelet_registration_path.clone().unwrap_or_default();
    tracing::info!(address = %ctx.csi.address(), "Waiting for the CSI driver to tell its name");
    let Some(driver) = ctx.csi.wait_for_driver(&ctx.shutdown).await else { return Ok(()) };
    let socket_path = Path::new(&cfg.plugin_registration_path).join(upstream::socket_file_name(&driver.name));
    ctx.health.register(NAME, Arc::new(RegistrarHealth::new(socket_path.clone(), driver.name.clone(), cfg.timeout)));
    let info = decide::plugin_info(&driver.name, &endpoint);
    let mut consecutive_failures = 0u32;
    loop {
        match serve_once(&socket_path, info.clone(), &ctx.shutdown).await? {
            Ended::Shutdown => return Ok(()),
            Ended::Rejected { after_accept } => {
                consecutive_failures = if after_accept { 1 } else { consecutive_failures + 1 }
            }
            Ended::ServerFailed(e) => {
                consecutive_failures += 1;
                tracing::error!(error = %e, "Registration server failed; restarting it");
            }
        }
        let delay = decide::recreate_delay(consecutive_failures);
        tracing::info!(delay = ?delay, "Recreating the registration socket after a delay");
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
