//! The Kubernetes client of the process: `--kubeconfig` (or `$KUBECONFIG`,
//! or the in-cluster configuration) and a client-side request budget of
//! `--kube-api-qps` requests per second with bursts of `--kube-api-burst`,
//! like client-go's token bucket. Leader election builds a second client with
//! its own budget, so a busy module cannot starve lease renewals.
//!
//! Beyond client-go, the budget knows what is urgent: Event writes
//! (bookkeeping nobody waits for) take a token only when no other request
//! is waiting for one, so the PVs, finalizers and statuses a user waits for
//! go first. Events are only deferred, never dropped: the recorder
//! aggregates repeats while they wait. The total rate is the same bucket's.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use ::kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use tower::{Layer, Service};

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Reading or interpreting the kubeconfig failed.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No kubeconfig and not in a cluster.
    #[error("no --kubeconfig given and not running in a cluster: {0}")]
    InCluster(String),
    /// Building the HTTP stack failed.
    #[error("cannot build the Kubernetes client: {0}")]
    Build(String),
}

/// Where the configuration comes from, as upstream: `$KUBECONFIG` when the
/// provisioner runs (external-provisioner reads it and lets it override
/// `--kubeconfig`), else the flag, else in-cluster (the other sidecars
/// ignore `$KUBECONFIG`).
pub fn kubeconfig_path(flag: Option<&str>, env: Option<String>) -> Option<String> {
    env.filter(|s| !s.is_empty()).or(flag.filter(|s| !s.is_empty()).map(String::from))
}

/// Loads the client configuration; `read_env`: whether `$KUBECONFIG` counts
/// (only when the process runs the provisioner, see [`kubeconfig_path`]).
pub async fn load_config(kubeconfig: Option<&str>, read_env: bool) -> Result<Config, ClientError> {
    let env = if read_env { std::env::var("KUBECONFIG").ok() } else { None };
    match kubeconfig_path(kubeconfig, env) {
        Some(path) => {
            let err = |message: String| ClientError::Kubeconfig { path: path.clone(), message };
            let kc = Kubeconfig::read_from(&path).map_err(|e| err(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(|e| err(e.to_string()))
        }
        None => Config::incluster().map_err(|e| ClientError::InCluster(e.to_string())),
    }
}

/// client-go's defaults for a `rest.Config` QPS or burst of 0.
pub const CLIENT_GO_DEFAULT_QPS: f64 = 5.0;
/// See [`CLIENT_GO_DEFAULT_QPS`].
pub const CLIENT_GO_DEFAULT_BURST: u32 = 10;

/// The budget client-go gives a `rest.Config` (pure): QPS 0 is the default
/// 5, a negative QPS is unlimited (`None`); burst 0 is the default 10.
pub fn effective_budget(qps: f64, burst: u32) -> Option<(f64, u32)> {
    let qps = if qps == 0.0 { CLIENT_GO_DEFAULT_QPS } else { qps };
    let burst = if burst == 0 { CLIENT_GO_DEFAULT_BURST } else { burst };
    (qps > 0.0).then_some((qps, burst))
}

/// Builds a client with its own request budget, as client-go would for
/// `--kube-api-qps`/`--kube-api-burst` ([`effective_budget`]).
pub fn build(config: Config, qps: f64, burst: u32) -> Result<Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    let layer = match effective_budget(qps, burst) {
        Some((qps, burst)) => RateLimitLayer::new(qps, burst),
        None => RateLimitLayer::new(-1.0, 1),
    };
    Ok(builder.with_layer(&layer).build())
}

/// The `User-Agent` of a client-go program: `<program>/<version> (<os>/<arch>) csi-sidecar`.
/// The apiserver names a writer's `managedFields` entry after the part
/// before the first `/` (upstream's: `csi-attacher`, `csi-provisioner`, ...).
pub fn user_agent(program: &str) -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{program}/{} ({}/{arch}) csi-sidecar", env!("CARGO_PKG_VERSION"), std::env::consts::OS)
}

/// `client` sending `agent` as its `User-Agent` (unless an outer wrapper
/// set one already): one budget and one connection pool, a field manager
/// per module.
pub fn with_user_agent(client: &Client, agent: &str) -> Result<Client, ClientError> {
    let value =
        http::HeaderValue::from_str(agent).map_err(|e| ClientError::Build(format!("user agent {agent:?}: {e}")))?;
    let ns = client.default_namespace().to_string();
    Ok(Client::new(UserAgent { client: client.clone(), value }, ns))
}

#[derive(Clone)]
struct UserAgent {
    client: Client,
    value: http::HeaderValue,
}

impl Service<http::Request<::kube::client::Body>> for UserAgent {
    type Response = http::Response<::kube::client::Body>;
    type Error = ::kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<::kube::client::Body>) -> Self::Future {
        req.headers_mut().entry(http::header::USER_AGENT).or_insert_with(|| self.value.clone());
        let client = self.client.clone();
        Box::pin(async move { client.send(req).await })
    }
}

/// A token bucket: `qps` tokens per second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes a token now, or says how long until one is there.
    pub fn try_take(&self, now: Instant) -> Result<(), Duration> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = *s;
        let mut tokens = refill(tokens, now.saturating_duration_since(last), self.qps, self.burst);
        let taken = take(&mut tokens, self.qps);
        *s = (tokens, now);
        taken
    }
}

/// The tokens of a bucket after `elapsed` at `qps`, capped at `burst`.
fn refill(tokens: f64, elapsed: Duration, qps: f64, burst: f64) -> f64 {
    (tokens + elapsed.as_secs_f64() * qps).min(burst)
}

/// Takes one of `tokens`, or says how long until one is there at `qps`.
fn take(tokens: &mut f64, qps: f64) -> Result<(), Duration> {
    if *tokens >= 1.0 {
        *tokens -= 1.0;
        Ok(())
    } else {
        Err(Duration::from_secs_f64((1.0 - *tokens) / qps))
    }
}

/// How urgent a request is for the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// Work a user waits for: everything but events.
    Critical,
    /// Event writes: sent when nothing critical is waiting.
    Deferrable,
}

/// The urgency of a request (pure): writes of core or `events.k8s.io`
/// Events are deferrable, everything else is critical.
pub fn urgency(method: &http::Method, path: &str) -> Urgency {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // .../namespaces/<ns>/events[/<name>]
    let events_at = |i: usize| segments.get(i) == Some(&"events") && i >= 2 && segments[i - 2] == "namespaces";
    let n = segments.len();
    let event_path = (path.starts_with("/api/v1/") || path.starts_with("/apis/events.k8s.io/"))
        && ((n >= 1 && events_at(n - 1)) || (n >= 2 && events_at(n - 2)));
    if *method != http::Method::GET && event_path { Urgency::Deferrable } else { Urgency::Critical }
}

#[derive(Debug)]
struct PriorityState {
    tokens: f64,
    last: tokio::time::Instant,
    critical_waiting: usize,
}

/// A token bucket (`qps` per second, `burst` saved up) whose deferrable
/// takers wait while any critical taker waits.
#[derive(Debug)]
pub struct PriorityBucket {
    qps: f64,
    burst: f64,
    state: Mutex<PriorityState>,
    /// Woken when the last waiting critical taker got its token.
    critical_done: tokio::sync::Notify,
}

impl PriorityBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        let state = PriorityState { tokens: burst, last: tokio::time::Instant::now(), critical_waiting: 0 };
        PriorityBucket { qps, burst, state: Mutex::new(state), critical_done: tokio::sync::Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PriorityState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a token now if `urgency` may, else says how long to wait
    /// (`None`: until the critical takers are served).
    fn try_take(&self, urgency: Urgency, now: tokio::time::Instant) -> Result<(), Option<Duration>> {
        let mut s = self.lock();
        s.tokens = refill(s.tokens, now.saturating_duration_since(s.last), self.qps, self.burst);
        s.last = now;
        if urgency == Urgency::Deferrable && s.critical_waiting > 0 {
            return Err(None);
        }
        take(&mut s.tokens, self.qps).map_err(Some)
    }

    /// Waits for a token.
    pub async fn acquire(self: Arc<Self>, urgency: Urgency) {
        if urgency == Urgency::Critical {
            self.lock().critical_waiting += 1;
            // Counted until served, also if the caller gives up waiting.
            let _served = CriticalWaiter(&self);
            while let Err(wait) = self.try_take(urgency, tokio::time::Instant::now()) {
                tokio::time::sleep(wait.unwrap_or_default()).await;
            }
            return;
        }
        loop {
            let notified = self.critical_done.notified();
            match self.try_take(urgency, tokio::time::Instant::now()) {
                Ok(()) => return,
                Err(Some(wait)) => tokio::time::sleep(wait).await,
                Err(None) => notified.await,
            }
        }
    }
}

/// Un-counts a waiting critical taker when dropped.
struct CriticalWaiter<'a>(&'a PriorityBucket);

impl Drop for CriticalWaiter<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.critical_waiting = s.critical_waiting.saturating_sub(1);
        if s.critical_waiting == 0 {
            drop(s);
            self.0.critical_done.notify_waiters();
        }
    }
}

/// Applies a [`PriorityBucket`] to every request (a watch counts once):
/// the request's future waits for its token before it is first polled into
/// the inner service (which sends nothing before that).
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<PriorityBucket>>,
}

impl RateLimitLayer {
    /// `qps <= 0`: unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        RateLimitLayer { bucket: (qps > 0.0).then(|| Arc::new(PriorityBucket::new(qps, burst))) }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, bucket: self.bucket.clone() }
    }
}

/// See [`RateLimitLayer`].
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<PriorityBucket>>,
}

impl<S, B> Service<http::Request<B>> for RateLimited<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let wait = self.bucket.clone().map(|b| b.acquire(urgency(req.method(), req.uri().path())));
        let response = self.inner.call(req);
        Box::pin(async move {
            if let Some(wait) = wait {
                wait.await;
            }
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_precedence() {
        // external-provisioner: a non-empty $KUBECONFIG overrides the flag.
        assert_eq!(kubeconfig_path(Some("/a"), Some("/b".into())), Some("/b".into()));
        assert_eq!(kubeconfig_path(Some(""), Some("/b".into())), Some("/b".into()));
        assert_eq!(kubeconfig_path(Some("/a"), Some(String::new())), Some("/a".into()));
        assert_eq!(kubeconfig_path(None, None), None);
        assert_eq!(kubeconfig_path(None, Some(String::new())), None);
    }

    #[test]
    fn the_budget_is_client_gos() {
        type Budget = Option<(f64, u32)>;
        let cases: &[(f64, u32, Budget)] = &[
            (5.0, 10, Some((5.0, 10))),
            (0.0, 10, Some((5.0, 10))),  // QPS 0: client-go's default 5, not unlimited
            (0.0, 0, Some((5.0, 10))),   // both defaults
            (20.0, 0, Some((20.0, 10))), // burst 0: the default 10
            (-1.0, 10, None),            // negative: unlimited
            (0.5, 1, Some((0.5, 1))),
        ];
        for (qps, burst, want) in cases {
            assert_eq!(effective_budget(*qps, *burst), *want, "qps {qps} burst {burst}");
        }
    }

    #[test]
    fn bucket_allows_a_burst_then_qps() {
        let b = TokenBucket::new(5.0, 10);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(b.try_take(t0), Ok(()), "burst token {i}");
        }
        let wait = b.try_take(t0).expect_err("bucket empty");
        assert!((wait.as_secs_f64() - 0.2).abs() < 0.01, "{wait:?}");
        assert_eq!(b.try_take(t0 + Duration::from_millis(200)), Ok(()));
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..10 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }

    fn get(path: &str) -> http::Request<()> {
        http::Request::get(path).body(()).expect("request")
    }

    #[tokio::test]
    async fn limited_service_paces_requests() {
        let svc = tower::service_fn(|_: http::Request<()>| async { Ok::<_, std::convert::Infallible>(()) });
        let mut limited = RateLimitLayer::new(50.0, 1).layer(svc);
        let start = Instant::now();
        for _ in 0..6 {
            tower::ServiceExt::ready(&mut limited).await.expect("ready");
            limited.call(get("/api/v1/persistentvolumes")).await.expect("call");
        }
        // 1 burst token, then 5 more at 50/s: at least 100 ms.
        assert!(start.elapsed() >= Duration::from_millis(95), "{:?}", start.elapsed());
        let mut unlimited = RateLimitLayer::new(-1.0, 1)
            .layer(tower::service_fn(|_: http::Request<()>| async { Ok::<_, std::convert::Infallible>(()) }));
        let start = Instant::now();
        for _ in 0..100 {
            tower::ServiceExt::ready(&mut unlimited).await.expect("ready");
            unlimited.call(get("/api/v1/persistentvolumes")).await.expect("call");
        }
        assert!(start.elapsed() < Duration::from_millis(50));
    }

    #[test]
    fn only_event_writes_are_deferrable() {
        use http::Method;
        let table = [
            (Method::POST, "/api/v1/namespaces/ns/events", Urgency::Deferrable),
            (Method::PATCH, "/api/v1/namespaces/ns/events/pvc.17a", Urgency::Deferrable),
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events", Urgency::Deferrable),
            (Method::GET, "/api/v1/namespaces/ns/events", Urgency::Critical),
            (Method::POST, "/api/v1/persistentvolumes", Urgency::Critical),
            (Method::PATCH, "/api/v1/persistentvolumes/events", Urgency::Critical),
            (Method::PATCH, "/apis/storage.k8s.io/v1/volumeattachments/va/status", Urgency::Critical),
            (Method::PATCH, "/api/v1/namespaces/events/persistentvolumeclaims/c", Urgency::Critical),
        ];
        for (m, path, want) in table {
            assert_eq!(urgency(&m, path), want, "{m} {path}");
        }
    }

    /// With a backlog of critical requests, deferred ones wait until it is
    /// served, and the whole stays within the bucket's rate.
    #[tokio::test(start_paused = true)]
    async fn critical_requests_go_before_deferred_ones_within_one_budget() {
        let bucket = Arc::new(PriorityBucket::new(5.0, 10));
        let order: Arc<Mutex<Vec<(&'static str, Duration)>>> = Arc::default();
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        // Drain the burst first, so everything below has to wait.
        for _ in 0..10 {
            bucket.clone().acquire(Urgency::Critical).await;
        }
        for _ in 0..5 {
            let (b, order) = (bucket.clone(), order.clone());
            tasks.spawn(async move {
                b.acquire(Urgency::Deferrable).await;
                order.lock().expect("order").push(("event", start.elapsed()));
            });
        }
        tokio::task::yield_now().await;
        for _ in 0..30 {
            let (b, order) = (bucket.clone(), order.clone());
            tasks.spawn(async move {
                b.acquire(Urgency::Critical).await;
                order.lock().expect("order").push(("critical", start.elapsed()));
            });
        }
        while tasks.join_next().await.is_some() {}
        let order = order.lock().expect("order").clone();
        assert_eq!(order.len(), 35);
        let first_event = order.iter().position(|(k, _)| *k == "event").expect("events went out");
        // At most the event whose token was already due when the critical
        // requests queued up may go before them.
        assert!(first_event >= 29, "events deferred behind the critical backlog: {order:?}");
        // 45 tokens in all: 10 of burst, 35 more at 5/s = 7 s; never faster.
        let end = order.iter().map(|(_, t)| *t).max().expect("times");
        assert!(end >= Duration::from_millis(6900), "within the rate: {end:?}");
        assert!(end <= Duration::from_millis(7400), "no token wasted: {end:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_request_goes_out_once_nothing_critical_waits() {
        let bucket = Arc::new(PriorityBucket::new(1.0, 1));
        bucket.clone().acquire(Urgency::Critical).await;
        let b = bucket.clone();
        let event = tokio::spawn(async move { b.acquire(Urgency::Deferrable).await });
        tokio::time::timeout(Duration::from_secs(3), event).await.expect("deferred, not dropped").expect("join");
    }
}
