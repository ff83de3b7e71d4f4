//! The one gRPC connection of the process to the CSI driver.
//!
//! - The channel connects lazily and reconnects by itself: the connector
//!   runs on every (re)connect and bumps a generation counter.
//! - [`Connection::maintain`] waits for the socket for as long as it takes
//!   (logging every 10 s), discovers the driver (name, capabilities) and
//!   discovers it again after every reconnect.
//! - Every call has a deadline, is recorded in `csi_sidecar_operations_seconds`
//!   and, at `-v=5`, logged with its secrets stripped.

use std::{
    fmt::Debug,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, sync::watch};
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint, Uri},
};
use tracing::Instrument;

use super::{
    address::{AddressError, CsiAddress},
    dial_error::dial_error,
    driver::{DriverInfo, validate_plugin_info},
    proto::csi::v1::{self as csi, plugin_capability},
    redact::{Redact, redacted_debug},
};
use crate::compat::{self, metrics as m};

/// How often a missing or silent driver is reported.
pub const STILL_CONNECTING_EVERY: Duration = Duration::from_secs(10);
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// `text` cut to `max` characters (none when `max` < 0), saying how much was cut.
pub fn truncated(text: String, max: i64) -> String {
    let Ok(max) = usize::try_from(max) else {
        return text;
    };
    match text.char_indices().nth(max) {
        None => text,
        Some((cut, _)) => {
            let dropped = text[cut..].chars().count();
            format!("{} [response truncated, {dropped} more characters]", &text[..cut])
        }
    }
}

/// The driver answered under another name after a reconnect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the CSI driver at the socket changed its name from {old:?} to {new:?} after a reconnect; exiting so that the modules start again for the new driver"
)]
pub struct DriverRenamed {
    /// The name the modules started with.
    pub old: String,
    /// The name the driver gives now.
    pub new: String,
}

struct Inner {
    address: CsiAddress,
    channel: Channel,
    connects: watch::Sender<u64>,
    driver: watch::Sender<Option<Arc<DriverInfo>>>,
    /// `--max-grpc-log-length`: characters of a logged response; < 0 means all.
    max_response_log: std::sync::atomic::AtomicI64,
}

/// A cheap-to-clone handle on the driver connection.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

tokio::task_local! {
    /// Whether the CSI calls of the current task are for a migrated in-tree volume.
    static MIGRATED: bool;
}

/// Runs `f` with its CSI calls labelled `migrated="true"` (or "false") in
/// `csi_sidecar_operations_seconds`, when the driver is a CSI migration target.
pub async fn migrated_scope<F: Future>(migrated: bool, f: F) -> F::Output {
    MIGRATED.scope(migrated, f).await
}

impl Connection {
    /// Creates the connection; nothing is dialled until the first call.
    pub fn new(address: &str) -> Result<Self, AddressError> {
        let address = CsiAddress::parse(address)?;
        let (connects, _) = watch::channel(0u64);
        let path = address.path().to_path_buf();
        let counter = connects.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            let counter = counter.clone();
            async move {
                // The error names the path, its mode and owner and the
                // process's user (dial_error), for every module's log and
                // the prober's /healthz body.
                let stream = UnixStream::connect(&path).await.map_err(|e| dial_error(&path, e))?;
                counter.send_modify(|n| *n += 1);
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        let channel = Endpoint::from_static("http://localhost").connect_with_connector_lazy(connector);
        let (driver, _) = watch::channel(None);
        Ok(Connection {
            inner: Arc::new(Inner {
                address,
                channel,
                connects,
                driver,
                max_response_log: std::sync::atomic::AtomicI64::new(-1),
            }),
        })
    }

    /// The driver socket.
    pub fn address(&self) -> &CsiAddress {
        &self.inner.address
    }

    /// The driver as last discovered, if it was.
    pub fn driver(&self) -> Option<Arc<DriverInfo>> {
        self.inner.driver.borrow().clone()
    }

    /// Waits until the driver has been discovered; `None` on shutdown.
    pub async fn wait_for_driver(&self, shutdown: &CancellationToken) -> Option<Arc<DriverInfo>> {
        let mut rx = self.inner.driver.subscribe();
        tokio::select! {
            _ = shutdown.cancelled() => None,
            r = rx.wait_for(Option::is_some) => r.ok().and_then(|d| d.clone()),
        }
    }

    /// Caps the length of logged responses (`--max-grpc-log-length`; < 0: no cap).
    pub fn set_max_response_log_length(&self, chars: i64) {
        self.inner.max_response_log.store(chars, std::sync::atomic::Ordering::Relaxed);
    }

    /// Successful (re)connects so far.
    pub fn connect_count(&self) -> u64 {
        *self.inner.connects.borrow()
    }

    /// Runs one unary call with a deadline, metrics and redacted logging
    /// (the typed methods of `calls.rs` are the only callers).
    pub(super) async fn call<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        timeout: Duration,
        req: Req,
        send: F,
    ) -> Result<Resp, Status>
    where
        Req: Redact + Clone + Debug,
        Resp: Redact + Clone + Debug,
        F: FnOnce(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(method, request = %redacted_debug(&req), "GRPC call");
        }
        let start = Instant::now();
        let _in_flight = crate::debug::csi_call(method);
        let mut request = Request::new(req);
        request.set_timeout(timeout);
        let result = match tokio::time::timeout(timeout, send(self.inner.channel.clone(), request)).await {
            // tonic enforces the grpc-timeout itself and calls it Cancelled;
            // Go (and upstream's texts and metrics) call it DeadlineExceeded.
            Ok(Err(s)) if s.code() == tonic::Code::Cancelled && start.elapsed() >= timeout => {
                Err(Status::deadline_exceeded(compat::DEADLINE_EXCEEDED_MESSAGE))
            }
            Ok(r) => r.map(Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(compat::DEADLINE_EXCEEDED_MESSAGE)),
        };
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.record(method, code, start.elapsed());
        match &result {
            Ok(resp) if tracing::enabled!(tracing::Level::TRACE) => {
                let max = self.inner.max_response_log.load(std::sync::atomic::Ordering::Relaxed);
                tracing::trace!(method, response = %truncated(redacted_debug(resp), max), "GRPC response")
            }
            Ok(_) => {}
            Err(status) => tracing::trace!(method, error = %compat::grpc_error_text(status), "GRPC error"),
        }
        result
    }

    fn record(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        let driver: metrics::SharedString = match self.inner.driver.borrow().as_ref() {
            Some(d) => metrics::SharedString::from(d.name.clone()),
            None => metrics::SharedString::const_str(m::UNKNOWN_DRIVER),
        };
        // A CSI migration target labels every sample `migrated` (upstream's
        // metrics manager `WithMigration`): "true" inside `migrated_scope(true, ..)`.
        let migration_target = self
            .inner
            .driver
            .borrow()
            .as_ref()
            .is_some_and(|d| crate::migration::Plugin::for_driver(&d.name).is_some());
        if migration_target {
            let migrated = if MIGRATED.try_with(|m| *m).unwrap_or(false) { "true" } else { "false" };
            metrics::histogram!(
                m::OPERATIONS_SECONDS,
                m::LABEL_DRIVER_NAME => driver,
                m::LABEL_METHOD_NAME => method,
                m::LABEL_GRPC_STATUS_CODE => compat::grpc_code_name(code),
                m::LABEL_MIGRATED => migrated,
            )
            .record(elapsed.as_secs_f64());
            return;
        }
        metrics::histogram!(
            m::OPERATIONS_SECONDS,
            m::LABEL_DRIVER_NAME => driver,
            m::LABEL_METHOD_NAME => method,
            m::LABEL_GRPC_STATUS_CODE => compat::grpc_code_name(code),
        )
        .record(elapsed.as_secs_f64());
    }

    /// One discovery attempt: (with `probe`) `Probe` until ready, then the
    /// name, then capabilities. A driver that fails the capability calls is
    /// still usable by name.
    async fn discover_once(&self, timeout: Duration, probe: bool) -> Result<DriverInfo, String> {
        if probe {
            match probe_verdict(&self.probe(timeout).await) {
                ProbeVerdict::Ready => {}
                ProbeVerdict::NotReady(why) | ProbeVerdict::Failed(why) => return Err(why),
            }
        }
        let info = self.get_plugin_info(timeout).await.map_err(|s| compat::grpc_error_text(&s))?;
        validate_plugin_info(&info).map_err(|e| e.to_string())?;
        let plugin_capabilities = match self.get_plugin_capabilities(timeout).await {
            Ok(r) => r.capabilities,
            Err(s) => {
                tracing::warn!(error = %compat::grpc_error_text(&s), "GetPluginCapabilities failed; assuming none");
                Vec::new()
            }
        };
        let mut driver = DriverInfo {
            name: Arc::from(info.name.as_str()),
            vendor_version: info.vendor_version,
            plugin_capabilities,
            controller_capabilities: Vec::new(),
        };
        if driver.has_plugin_service(plugin_capability::service::Type::ControllerService) {
            match self.controller_get_capabilities(timeout).await {
                Ok(r) => driver.controller_capabilities = r.capabilities,
                Err(s) => {
                    tracing::warn!(error = %compat::grpc_error_text(&s), "ControllerGetCapabilities failed; assuming none")
                }
            }
        }
        Ok(driver)
    }

    /// Discovers the driver, retrying until it answers or shutdown.
    async fn discover(&self, timeout: Duration, probe: bool, shutdown: &CancellationToken) -> Option<DriverInfo> {
        let mut delay = RETRY_MIN;
        let mut last_report = Instant::now();
        loop {
            // No call (and no sample in the call metrics) before the socket
            // can be seen; the error says why it cannot.
            let path = self.inner.address.path();
            let attempt = match std::fs::metadata(path) {
                Ok(_) => self.discover_once(timeout, probe).await,
                Err(e) => Err(dial_error(path, e).to_string()),
            };
            match attempt {
                Ok(info) => return Some(info),
                Err(e) if last_report.elapsed() >= STILL_CONNECTING_EVERY => {
                    tracing::warn!(address = %self.inner.address, error = %e, "Still connecting to the CSI driver");
                    last_report = Instant::now();
                }
                Err(e) => tracing::debug!(address = %self.inner.address, error = %e, "CSI driver not ready yet"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RETRY_MAX);
        }
    }

    /// Keeps the driver information current until shutdown: discovers it,
    /// then discovers it again after every reconnect.
    ///
    /// Err when the driver comes back under another name: every module's
    /// objects, Leases and finalizers are keyed by the name they started
    /// with, so the process must stop (upstream's sidecars exit on any
    /// connection loss; csi-sidecar reconnects, but never serves a second
    /// driver under the first one's identity).
    pub async fn maintain(self, timeout: Duration, shutdown: CancellationToken) -> Result<(), DriverRenamed> {
        self.maintain_with(timeout, false, shutdown).await
    }

    /// [`maintain`](Self::maintain); with `probe`, each discovery first
    /// calls `Probe` until the driver says it is ready, as upstream's
    /// controller sidecars do before `GetPluginInfo` (csi-lib-utils
    /// `ProbeForever`): no module sees the driver before that.
    pub async fn maintain_with(
        self,
        timeout: Duration,
        probe: bool,
        shutdown: CancellationToken,
    ) -> Result<(), DriverRenamed> {
        let span = tracing::info_span!("csi", address = %self.inner.address);
        async move {
            let mut connects = self.inner.connects.subscribe();
            loop {
                let Some(info) = self.discover(timeout, probe, &shutdown).await else { return Ok(()) };
                // Everything up to and including this discovery's own connect is seen.
                connects.borrow_and_update();
                let previous = self.inner.driver.borrow().clone();
                match previous {
                    None => {
                        tracing::info!(driver = %info.name, version = %info.vendor_version, "CSI driver discovered")
                    }
                    Some(p) if p.name != info.name => {
                        return Err(DriverRenamed { old: p.name.to_string(), new: info.name.to_string() });
                    }
                    Some(_) => tracing::info!(driver = %info.name, "CSI driver rediscovered after reconnect"),
                }
                self.inner.driver.send_replace(Some(Arc::new(info)));
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    r = connects.changed() => if r.is_err() { return Ok(()) },
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// What a `Probe` at start means (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// `ready` true or absent: go on with discovery.
    Ready,
    /// `ready: false` or a deadline: ask again (upstream retries these forever).
    NotReady(String),
    /// Any other error (upstream exits; here asked again, logged).
    Failed(String),
}

/// The verdict on one `Probe` answer.
pub fn probe_verdict(result: &Result<csi::ProbeResponse, Status>) -> ProbeVerdict {
    match result {
        Ok(r) if r.ready == Some(false) => ProbeVerdict::NotReady("CSI driver is not ready".to_string()),
        Ok(_) => ProbeVerdict::Ready,
        Err(s) if s.code() == tonic::Code::DeadlineExceeded => ProbeVerdict::NotReady(compat::grpc_error_text(s)),
        Err(s) => ProbeVerdict::Failed(compat::grpc_error_text(s)),
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn probe_verdicts_follow_probe_forever() {
        let ok = |ready| Ok(csi::ProbeResponse { ready });
        assert_eq!(probe_verdict(&ok(Some(true))), ProbeVerdict::Ready);
        assert_eq!(probe_verdict(&ok(None)), ProbeVerdict::Ready, "absent means ready");
        assert!(matches!(probe_verdict(&ok(Some(false))), ProbeVerdict::NotReady(_)));
        assert!(matches!(probe_verdict(&Err(Status::deadline_exceeded("slow"))), ProbeVerdict::NotReady(_)));
        assert!(matches!(probe_verdict(&Err(Status::unavailable("down"))), ProbeVerdict::Failed(_)));
        assert!(matches!(probe_verdict(&Err(Status::unimplemented("no"))), ProbeVerdict::Failed(_)));
    }
}

#[cfg(test)]
mod dial_tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn owner(path: &std::path::Path) -> String {
        let m = std::fs::metadata(path).expect("stat");
        format!("{}:{}", m.uid(), m.gid())
    }

    /// A failed connect reaches the caller's `Status` with the path, the
    /// file's mode and owner.
    #[tokio::test]
    async fn a_failed_connect_explains_itself_in_the_status() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("file.sock");
        std::fs::write(&file, "").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let stale = tmp.path().join("stale.sock");
        tokio::net::UnixSocket::new_stream().expect("socket").bind(&stale).expect("bind");
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let table = [
            (file.clone(), format!("it is a regular file (-rw-r----- owned by {}), not a socket", owner(&file))),
            (
                stale.clone(),
                format!(
                    "connection refused: the socket file exists (srwxr-xr-x owned by {}) but nothing listens on it (the driver exited or has not started serving yet)",
                    owner(&stale)
                ),
            ),
        ];
        for (path, why) in table {
            let conn = Connection::new(&path.display().to_string()).expect("address");
            let status = conn.probe(Duration::from_secs(10)).await.expect_err("no driver");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert_eq!(status.message(), format!("cannot connect to the CSI driver socket {}: {why}", path.display()));
        }
    }
}
