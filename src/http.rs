//! The one HTTP server of the process: `/healthz`, `/healthz/<check>`, the
//! Prometheus metrics path and, with `--enable-debug-endpoints`,
//! `/debug/objects`.
//!
//! Modules register named health checks; `/healthz` is healthy only when
//! every check is. When exactly one check fails, its status and body are
//! returned unchanged, so a process running one module answers exactly like
//! the upstream sidecar it replaces.

use parking_lot::{Mutex, RwLock};
use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use futures::{
    FutureExt,
    future::{BoxFuture, Shared, join_all},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::healthz::{HealthCheck, HealthReport};
use crate::{
    compat, debug,
    flags::{SharedFlags, shared::non_empty},
    metrics::Metrics,
};

type NamedChecks = Vec<(String, Arc<dyn HealthCheck>)>;
type InFlight = Shared<BoxFuture<'static, HealthReport>>;

/// Runs one check at a time: concurrent callers share the running one, so a
/// burst of probes costs one driver call (and one allocation of its future).
struct Coalesced {
    inner: Arc<dyn HealthCheck>,
    in_flight: Arc<Mutex<Option<InFlight>>>,
}

impl HealthCheck for Coalesced {
    fn check(&self) -> BoxFuture<'static, HealthReport> {
        let fut = {
            let mut slot = self.in_flight.lock();
            match slot.as_ref() {
                Some(f) => f.clone(),
                None => {
                    let f = self.inner.check().shared();
                    *slot = Some(f.clone());
                    f
                }
            }
        };
        let in_flight = self.in_flight.clone();
        async move {
            let report = fut.clone().await;
            let mut slot = in_flight.lock();
            if slot.as_ref().is_some_and(|f| f.ptr_eq(&fut)) {
                *slot = None;
            }
            report
        }
        .boxed()
    }
}

/// All health checks of the process.
#[derive(Clone, Default)]
pub struct HealthRegistry {
    checks: Arc<RwLock<NamedChecks>>,
}

impl HealthRegistry {
    /// Adds (or replaces) the check `name`, served at `/healthz/<name>`.
    /// Concurrent requests share one run of the check.
    pub fn register(&self, name: &str, check: Arc<dyn HealthCheck>) {
        let check: Arc<dyn HealthCheck> = Arc::new(Coalesced { inner: check, in_flight: Arc::default() });
        let mut checks = self.checks.write();
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), check));
    }

    fn snapshot(&self) -> NamedChecks {
        self.checks.read().clone()
    }

    /// Runs every check concurrently and aggregates them.
    pub async fn check_all(&self) -> HealthReport {
        let checks = self.snapshot();
        let reports = join_all(checks.iter().map(|(_, c)| c.check())).await;
        aggregate(checks.into_iter().map(|(n, _)| n).zip(reports).collect())
    }

    /// Runs one check; `None` if there is no such check.
    pub async fn check_one(&self, name: &str) -> Option<HealthReport> {
        let check = self.snapshot().into_iter().find(|(n, _)| n == name)?.1;
        Some(check.check().await)
    }
}

/// Healthy only if every check is. One failure: that check's answer as is.
/// Several: the first failure's status, one line per failed check.
pub fn aggregate(reports: Vec<(String, HealthReport)>) -> HealthReport {
    let failed: Vec<_> = reports.into_iter().filter(|(_, r)| !r.is_healthy()).collect();
    match failed.as_slice() {
        [] => HealthReport::ok(),
        [(_, only)] => only.clone(),
        [(_, first), ..] => HealthReport::failed(
            first.status,
            failed.iter().map(|(n, r)| format!("{n}: {}", r.body)).collect::<Vec<_>>().join("\n"),
        ),
    }
}

/// HTTP configuration could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpConfigError {
    /// Upstream refuses both.
    #[error("only one of `--metrics-address` and `--http-endpoint` can be explicitly set")]
    MetricsAndHttpEndpoint,
    /// Upstream refuses both.
    #[error("only one of `--health-port` and `--http-endpoint` can be explicitly set")]
    HealthPortAndHttpEndpoint,
    /// Not a port number.
    #[error("invalid --health-port {0:?}: not a port number")]
    BadHealthPort(String),
}

/// Where the HTTP server listens.
#[derive(Debug, PartialEq, Eq)]
pub struct ListenPlan {
    /// Addresses in Go's `host:port` form (`:9808` = every interface).
    pub addresses: Vec<String>,
}

/// Resolves the listen addresses from the upstream flags.
///
/// `--http-endpoint` wins; otherwise `--health-port` (livenessprobe's default
/// port 9808 when a prober runs); the deprecated `--metrics-address` adds a
/// second listener on the same router.
pub fn listen_plan(shared: &SharedFlags, has_prober: bool) -> Result<ListenPlan, HttpConfigError> {
    let http = non_empty(&shared.http_endpoint);
    let metrics = non_empty(&shared.metrics_address);
    let health_port = non_empty(&shared.health_port).filter(|p| *p != "0");
    if http.is_some() && metrics.is_some() {
        return Err(HttpConfigError::MetricsAndHttpEndpoint);
    }
    if let Some(p) = health_port {
        if p.parse::<u16>().is_err() {
            return Err(HttpConfigError::BadHealthPort(p.to_string()));
        }
        if http.is_some() && p != compat::prober::DEFAULT_HEALTH_PORT {
            return Err(HttpConfigError::HealthPortAndHttpEndpoint);
        }
    }
    let mut addresses = Vec::new();
    if let Some(h) = http {
        addresses.push(h.to_string());
    } else if let Some(p) = health_port {
        addresses.push(format!(":{p}"));
    } else if has_prober {
        addresses.push(format!(":{}", compat::prober::DEFAULT_HEALTH_PORT));
    }
    if let Some(m) = metrics {
        addresses.push(m.to_string());
    }
    Ok(ListenPlan { addresses })
}

/// Where a Go `host:port` listen address binds.
#[derive(Debug, PartialEq, Eq)]
pub enum BindTarget {
    /// Every interface, IPv6 and IPv4 on one socket (IPV6_V6ONLY off), as
    /// Go's `net.Listen` does for `:port`, `0.0.0.0:port` and `[::]:port`;
    /// IPv4 only where the host has no IPv6.
    AnyInterface { port: u16 },
    /// A host or address as given.
    Given(String),
}

/// Go's `:port` (and the unspecified addresses) mean every interface.
pub fn bind_target(addr: &str) -> BindTarget {
    if let Some((host, port)) = addr.rsplit_once(':')
        && matches!(host, "" | "0.0.0.0" | "[::]")
        && let Ok(port) = port.parse::<u16>()
    {
        return BindTarget::AnyInterface { port };
    }
    BindTarget::Given(addr.to_string())
}

/// An IPv6 socket that also accepts IPv4 (mapped addresses), whatever the
/// host's `net.ipv6.bindv6only` default.
fn dual_stack_socket() -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn dual_stack_listener(port: u16) -> std::io::Result<std::net::TcpListener> {
    let socket = dual_stack_socket()?;
    socket.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

async fn listen(addr: &str) -> std::io::Result<TcpListener> {
    match bind_target(addr) {
        BindTarget::AnyInterface { port } => match dual_stack_listener(port) {
            Ok(l) => TcpListener::from_std(l),
            // No IPv6 on this host (or in this network namespace).
            Err(e) if matches!(e.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL)) => {
                TcpListener::bind(SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port))).await
            }
            Err(e) => Err(e),
        },
        BindTarget::Given(a) => TcpListener::bind(a).await,
    }
}

/// A listener on `addr` (Go's forms, as [`bind_target`] reads them) for a
/// server of a module's own, which the module wraps in its runtime's type.
pub async fn listen_std(addr: &str) -> std::io::Result<std::net::TcpListener> {
    listen(addr).await?.into_std()
}

const EAFNOSUPPORT: i32 = nix::errno::Errno::EAFNOSUPPORT as i32;
const EADDRNOTAVAIL: i32 = nix::errno::Errno::EADDRNOTAVAIL as i32;

#[derive(Clone)]
struct AppState {
    health: HealthRegistry,
    metrics: Option<Metrics>,
    debug: Option<debug::Registry>,
}

fn reply(r: HealthReport) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, r.body).into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    reply(s.health.check_all().await)
}

async fn healthz_one(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    match s.health.check_one(&name).await {
        Some(r) => reply(r),
        None => (StatusCode::NOT_FOUND, format!("no health check named {name:?}")).into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    match s.metrics {
        Some(m) => ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], m.render()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `/debug/objects`: one page of the objects not done (400 naming the
/// parameter on a bad query).
async fn debug_objects(State(s): State<AppState>, RawQuery(raw): RawQuery) -> Response {
    let Some(registry) = s.debug else { return StatusCode::NOT_FOUND.into_response() };
    let query = match debug::query::Query::parse(raw.as_deref().unwrap_or_default()) {
        Ok(q) => q,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let now = debug::query::Now { wall: std::time::SystemTime::now(), mono: std::time::Instant::now() };
    let page = debug::query::page_of(&query, registry.driver(), &registry.ledgers(), now);
    match serde_json::to_string(&page) {
        Ok(body) => ([("content-type", "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The path of the debug endpoint.
pub const DEBUG_OBJECTS_PATH: &str = "/debug/objects";

/// The router: health checks, metrics and, given a registry, the debug
/// endpoint.
pub fn router(
    health: HealthRegistry,
    metrics_registry: Option<Metrics>,
    metrics_path: &str,
    debug: Option<debug::Registry>,
) -> Router {
    let mut r = Router::new()
        .route(compat::prober::HEALTHZ_PATH, get(healthz))
        .route("/healthz/{name}", get(healthz_one))
        // external-snapshot-metadata's path: the same answer as /healthz.
        .route(compat::snapshot_metadata::HEALTH_PATH, get(healthz))
        .route(metrics_path, get(metrics));
    if debug.is_some() && metrics_path != DEBUG_OBJECTS_PATH {
        r = r.route(DEBUG_OBJECTS_PATH, get(debug_objects));
    }
    r.with_state(AppState { health, metrics: metrics_registry, debug })
}

/// Listening failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {source}")]
pub struct ListenError {
    address: String,
    source: std::io::Error,
}

/// Binds every address of the plan (so a port conflict fails at start-up).
pub async fn bind(plan: &ListenPlan) -> Result<Vec<TcpListener>, ListenError> {
    let mut out = Vec::new();
    for a in &plan.addresses {
        let l = listen(a).await.map_err(|source| ListenError { address: a.clone(), source })?;
        out.push(l);
    }
    Ok(out)
}

/// Serves `router` on `listener` until `shutdown` fires.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(address = ?addr, "HTTP server listening");
    axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counting {
        calls: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl HealthCheck for Counting {
        fn check(&self) -> BoxFuture<'static, HealthReport> {
            let calls = self.calls.clone();
            async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                HealthReport::ok()
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn concurrent_checks_share_one_run_and_later_ones_run_again() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reg = HealthRegistry::default();
        reg.register("c", Arc::new(Counting { calls: calls.clone() }));
        let all = join_all((0..32).map(|_| reg.check_one("c"))).await;
        assert!(all.iter().all(|r| r.as_ref() == Some(&HealthReport::ok())));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        reg.check_all().await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2, "a later request runs the check again");
        assert_eq!(reg.check_one("nope").await, None);
    }

    fn r(status: u16, body: &str) -> HealthReport {
        HealthReport::failed(status, body)
    }

    #[test]
    fn aggregation() {
        let table: Vec<(Vec<(&str, HealthReport)>, HealthReport)> = vec![
            (vec![], HealthReport::ok()),
            (vec![("prober", HealthReport::ok()), ("registrar", HealthReport::ok())], HealthReport::ok()),
            (
                vec![("prober", r(500, "driver responded but is not ready")), ("registrar", HealthReport::ok())],
                r(500, "driver responded but is not ready"),
            ),
            (
                vec![("prober", HealthReport::ok()), ("registrar", r(404, "registration socket does not exist"))],
                r(404, "registration socket does not exist"),
            ),
            (
                vec![("registrar", r(404, "registration socket does not exist")), ("prober", r(500, "x"))],
                r(404, "registrar: registration socket does not exist\nprober: x"),
            ),
        ];
        for (input, want) in table {
            let got = aggregate(input.iter().map(|(n, r)| (n.to_string(), r.clone())).collect());
            assert_eq!(got, want, "{input:?}");
        }
    }

    fn flags(http: Option<&str>, metrics: Option<&str>, health: Option<&str>) -> SharedFlags {
        SharedFlags {
            http_endpoint: http.map(String::from),
            metrics_address: metrics.map(String::from),
            health_port: health.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn listen_plans() {
        use HttpConfigError::*;
        type Row = (SharedFlags, bool, Result<Vec<&'static str>, HttpConfigError>);
        let table: &[Row] = &[
            (flags(None, None, None), true, Ok(vec![":9808"])),
            (flags(None, None, None), false, Ok(vec![])),
            (flags(Some("127.0.0.1:1"), None, None), true, Ok(vec!["127.0.0.1:1"])),
            (flags(Some(""), None, None), true, Ok(vec![":9808"])),
            (flags(None, None, Some("9900")), false, Ok(vec![":9900"])),
            (flags(None, None, Some("0")), false, Ok(vec![])),
            (flags(Some(":1"), None, Some("9808")), true, Ok(vec![":1"])),
            (flags(Some(":1"), None, Some("9900")), true, Err(HealthPortAndHttpEndpoint)),
            (flags(Some(":1"), Some(":2"), None), true, Err(MetricsAndHttpEndpoint)),
            (flags(None, Some(":2"), None), true, Ok(vec![":9808", ":2"])),
            (flags(None, None, Some("http")), true, Err(BadHealthPort("http".into()))),
        ];
        for (f, prober, want) in table {
            let got = listen_plan(f, *prober).map(|p| p.addresses);
            let want = want.clone().map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "{f:?}");
        }
    }

    #[test]
    fn go_any_interface_syntax() {
        use BindTarget::*;
        for (addr, want) in [
            (":9808", AnyInterface { port: 9808 }),
            ("0.0.0.0:9808", AnyInterface { port: 9808 }),
            ("[::]:9808", AnyInterface { port: 9808 }),
            ("127.0.0.1:9808", Given("127.0.0.1:9808".into())),
            ("[::1]:9808", Given("[::1]:9808".into())),
            ("localhost:9808", Given("localhost:9808".into())),
            (":http", Given(":http".into())),
        ] {
            assert_eq!(bind_target(addr), want, "{addr}");
        }
    }

    /// `:port` gets a socket that takes IPv6 and IPv4, like Go's listener.
    /// (Checked on the unbound socket: tests never listen beyond loopback.)
    #[test]
    fn any_interface_socket_is_dual_stack() {
        match dual_stack_socket() {
            Ok(s) => assert_eq!(s.only_v6().ok(), Some(false)),
            // A host without IPv6 falls back to IPv4 in `listen`.
            Err(e) => assert_eq!(e.raw_os_error(), Some(EAFNOSUPPORT), "{e}"),
        }
    }

    #[test]
    fn metrics_paths_the_flag_accepts_or_refuses() {
        use crate::flags::shared::metrics_path;
        for ok in ["", "/metrics", "/", "/custom/metrics", "/healthzz", "/a:b", "/m-1_2.txt"] {
            assert_eq!(metrics_path(ok).as_deref(), Ok(ok), "{ok:?}");
        }
        for (bad, why) in [
            ("metrics", "must start with"),
            ("/healthz", "health checks"),
            ("/healthz/leader", "health checks"),
            ("/{name}", "not allowed"),
            ("/a b", "not allowed"),
            ("/x/:id", "must not start"),
            ("/*rest", "must not start"),
        ] {
            let err = metrics_path(bad).expect_err(bad);
            assert!(err.starts_with("--metrics-path ") && err.contains(why), "{bad:?}: {err}");
        }
    }

    proptest::proptest! {
        /// Whatever the flag accepts, the router can serve (it panics on a
        /// path it cannot route, which would abort the release binary).
        #[test]
        fn every_accepted_metrics_path_builds_a_router(path in "/?[ -~]{0,12}") {
            if let Ok(p) = crate::flags::shared::metrics_path(&path) {
                let p = if p.is_empty() { compat::DEFAULT_METRICS_PATH.to_string() } else { p };
                let _ = router(HealthRegistry::default(), None, &p, Some(crate::debug::Registry::default()));
            }
        }
    }
}
