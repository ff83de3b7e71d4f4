//! The one gRPC connection of the process to the CSI driver.
//!
//! - The channel connects lazily and reconnects by itself: the connector
//!   runs on every (re)connect and bumps a generation counter.
//! - [`Connection::maintain`] waits for the socket for as long as it takes
//!   (logging every 10 s), discovers the driver (name, capabilities) and
//!   discovers it again after every reconnect, and after a lost connection
//!   at once (the channel itself would reconnect only on the next call).
//! - The connector counts the open connections (each is dropped when it
//!   ends: the driver closed it or exited), so the connection knows it is
//!   up: [`Connection::connected`], and the gauge `csi_sidecar_driver_connected`.
//! - Every call has a deadline, is recorded in `csi_sidecar_operations_seconds`
//!   and, at `-v=5`, logged with its secrets stripped.

use std::{
    fmt::Debug,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UnixStream,
    sync::watch,
};
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

/// 1 while the driver is connected and discovered (csi-sidecar's own).
pub const DRIVER_CONNECTED: &str = "csi_sidecar_driver_connected";
const DRIVER_CONNECTED_HELP: &str = "1 while the connection to the CSI driver is up and the driver discovered (and, for the controller modules, ready); 0 while the socket is missing, the driver not ready or the connection lost.";

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
    /// Connections to the driver open now (see [`Counted`]).
    open: watch::Sender<usize>,
    /// Up and discovered (set by [`Connection::maintain_with`] only).
    connected: watch::Sender<bool>,
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
        let (open, _) = watch::channel(0usize);
        let path = address.path().to_path_buf();
        let (counter, opened) = (connects.clone(), open.clone());
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            let (counter, opened) = (counter.clone(), opened.clone());
            async move {
                // The error names the path, its mode and owner and the
                // process's user (dial_error), for every module's log and
                // the prober's /healthz body.
                let stream = UnixStream::connect(&path).await.map_err(|e| dial_error(&path, e))?;
                counter.send_modify(|n| *n += 1);
                Ok::<_, std::io::Error>(TokioIo::new(Counted::new(stream, opened)))
            }
        });
        let channel = Endpoint::from_static("http://localhost").connect_with_connector_lazy(connector);
        let (driver, _) = watch::channel(None);
        Ok(Connection {
            inner: Arc::new(Inner {
                address,
                channel,
                connects,
                open,
                connected: watch::channel(false).0,
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

    /// Whether the connection is up and the driver discovered on it (kept by
    /// [`maintain_with`](Self::maintain_with); false without it).
    pub fn connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    fn set_connected(&self, up: bool) {
        self.inner.connected.send_replace(up);
        metrics::gauge!(DRIVER_CONNECTED).set(if up { 1.0 } else { 0.0 });
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

    /// Opens one server-streaming call: the deadline covers the whole
    /// stream (the driver sees it as the call's grpc-timeout), the request
    /// is logged redacted. The caller reads the stream and records the
    /// call's outcome with [`Connection::record_call`].
    pub(super) async fn open_stream<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        timeout: Duration,
        req: Req,
        send: F,
    ) -> Result<super::calls::CallStream<Resp>, Status>
    where
        Req: Redact + Clone + Debug,
        F: FnOnce(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<tonic::Streaming<Resp>>, Status>>,
    {
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(method, request = %redacted_debug(&req), "GRPC call");
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut request = Request::new(req);
        request.set_timeout(timeout);
        match tokio::time::timeout_at(deadline, send(self.inner.channel.clone(), request)).await {
            Ok(Ok(response)) => Ok(super::calls::CallStream::new(response.into_inner(), deadline)),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::deadline_exceeded(compat::DEADLINE_EXCEEDED_MESSAGE)),
        }
    }

    /// Records a streaming call's outcome in the call metrics, as a unary
    /// call's is: its code when it ended and how long it ran.
    pub fn record_call(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.record(method, code, elapsed);
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
    /// then discovers it again after every reconnect or lost connection.
    /// Keeps [`connected`](Self::connected) and its gauge (0 from the start).
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
            metrics::describe_gauge!(DRIVER_CONNECTED, DRIVER_CONNECTED_HELP);
            let mut connects = self.inner.connects.subscribe();
            let mut open = self.inner.open.subscribe();
            loop {
                self.set_connected(false);
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
                // Up unless the connection the discovery used has ended since.
                self.set_connected(*open.borrow_and_update() > 0);
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    r = connects.changed() => if r.is_err() { return Ok(()) },
                    r = open.wait_for(|n| *n == 0) => match r {
                        Ok(_) => tracing::warn!("Lost the connection to the CSI driver; connecting again"),
                        Err(_) => return Ok(()),
                    },
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// A connection to the driver, counted in `open` while it exists: hyper
/// drops it when the connection ends (the driver closed it or exited).
struct Counted {
    stream: UnixStream,
    open: watch::Sender<usize>,
}

impl Counted {
    fn new(stream: UnixStream, open: watch::Sender<usize>) -> Self {
        open.send_modify(|n| *n += 1);
        Counted { stream, open }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl AsyncRead for Counted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
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

#[cfg(test)]
mod connected_tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio_stream::wrappers::UnixListenerStream;

    use super::*;
    use crate::csi::proto::csi::v1::identity_server::{Identity, IdentityServer};

    /// A driver with the identity service only, ready or not.
    #[derive(Clone, Default)]
    struct Driver {
        ready: Arc<AtomicBool>,
        probes: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl Identity for Driver {
        async fn get_plugin_info(
            &self,
            _: Request<csi::GetPluginInfoRequest>,
        ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
            Ok(Response::new(csi::GetPluginInfoResponse {
                name: "connected.test.csi".into(),
                vendor_version: "1".into(),
                ..Default::default()
            }))
        }

        async fn get_plugin_capabilities(
            &self,
            _: Request<csi::GetPluginCapabilitiesRequest>,
        ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
            Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
        }

        async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(csi::ProbeResponse { ready: Some(self.ready.load(Ordering::SeqCst)) }))
        }
    }

    /// Serves `driver` on `path` until the returned token is cancelled.
    fn serve(driver: &Driver, path: &std::path::Path) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).expect("bind");
        let stop = CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(driver.clone()))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned());
        (stop, tokio::spawn(async move { server.await.expect("serve") }))
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn gauge(metrics: &crate::metrics::Metrics) -> Option<f64> {
        metrics.render().lines().find_map(|l| l.strip_prefix(DRIVER_CONNECTED)?.strip_prefix(' ')?.parse().ok())
    }

    /// The only test that runs `maintain_with` (the gauge is the process's).
    #[tokio::test]
    async fn connected_while_the_driver_is_up_discovered_and_ready() {
        let metrics = crate::metrics::Metrics::install().expect("recorder");
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("csi.sock");
        let conn = Connection::new(&path.display().to_string()).expect("address");
        let shutdown = CancellationToken::new();
        let maintain = tokio::spawn(conn.clone().maintain_with(Duration::from_secs(5), true, shutdown.clone()));

        // No socket yet: 0, in the metrics from the start.
        until("the gauge at 0", || gauge(&metrics) == Some(0.0)).await;
        assert!(!conn.connected());
        // A driver that is not ready: still 0.
        let driver = Driver::default();
        let (stop, server) = serve(&driver, &path);
        until("probed twice", || driver.probes.load(Ordering::SeqCst) >= 2).await;
        assert!(!conn.connected(), "not ready");
        assert_eq!(gauge(&metrics), Some(0.0));
        driver.ready.store(true, Ordering::SeqCst);
        until("connected", || conn.connected()).await;
        assert_eq!(gauge(&metrics), Some(1.0));
        assert_eq!(conn.driver().expect("discovered").name.as_ref(), "connected.test.csi");

        // The driver goes away: 0 without any call of a module.
        stop.cancel();
        server.await.expect("server stopped");
        until("the loss noticed", || !conn.connected()).await;
        assert_eq!(gauge(&metrics), Some(0.0));
        let connects = conn.connect_count();

        // It comes back: rediscovered at once, on a new connection.
        let (stop, server) = serve(&driver, &path);
        until("connected again", || conn.connected()).await;
        assert_eq!(gauge(&metrics), Some(1.0));
        assert!(conn.connect_count() > connects);

        shutdown.cancel();
        assert_eq!(maintain.await.expect("join"), Ok(()));
        stop.cancel();
        server.await.expect("server stopped");
    }
}
