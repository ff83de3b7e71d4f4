//! The Kubernetes client of the process: `--kubeconfig` (or `$KUBECONFIG`,
//! or the in-cluster configuration) and a client-side request budget of
//! `--kube-api-qps` requests per second with bursts of `--kube-api-burst`,
//! like client-go's token bucket. Leader election builds a second client with
//! its own budget, so a busy module cannot starve lease renewals.

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

/// Where the configuration comes from: the flag, else `$KUBECONFIG`, else in-cluster.
pub fn kubeconfig_path(flag: Option<&str>, env: Option<String>) -> Option<String> {
    flag.filter(|s| !s.is_empty()).map(String::from).or(env.filter(|s| !s.is_empty()))
}

/// Loads the client configuration.
pub async fn load_config(kubeconfig: Option<&str>) -> Result<Config, ClientError> {
    match kubeconfig_path(kubeconfig, std::env::var("KUBECONFIG").ok()) {
        Some(path) => {
            let err = |message: String| ClientError::Kubeconfig { path: path.clone(), message };
            let kc = Kubeconfig::read_from(&path).map_err(|e| err(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(|e| err(e.to_string()))
        }
        None => Config::incluster().map_err(|e| ClientError::InCluster(e.to_string())),
    }
}

/// Builds a client with its own request budget. `qps <= 0` disables the
/// limit (client-go: a negative QPS means unlimited; csi-sidecar also treats 0
/// so, since every upstream default is positive).
pub fn build(config: Config, qps: f64, burst: u32) -> Result<Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    Ok(builder.with_layer(&RateLimitLayer::new(qps, burst)).build())
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
        let refilled = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst);
        if refilled >= 1.0 {
            *s = (refilled - 1.0, now);
            Ok(())
        } else {
            *s = (refilled, now);
            Err(Duration::from_secs_f64((1.0 - refilled) / self.qps))
        }
    }

    /// Waits for a token.
    pub async fn acquire(self: Arc<Self>) {
        while let Err(wait) = self.try_take(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Applies a [`TokenBucket`] to every request (a watch counts once).
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<TokenBucket>>,
}

impl RateLimitLayer {
    /// `qps <= 0`: unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        RateLimitLayer { bucket: (qps > 0.0).then(|| Arc::new(TokenBucket::new(qps, burst))) }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, bucket: self.bucket.clone(), waiting: None, has_token: false }
    }
}

/// See [`RateLimitLayer`].
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<TokenBucket>>,
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    has_token: bool,
}

impl<S: Service<R>, R> Service<R> for RateLimited<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket
            && !self.has_token
        {
            let waiting = self.waiting.get_or_insert_with(|| Box::pin(bucket.clone().acquire()));
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waiting = None;
            self.has_token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_precedence() {
        assert_eq!(kubeconfig_path(Some("/a"), Some("/b".into())), Some("/a".into()));
        assert_eq!(kubeconfig_path(Some(""), Some("/b".into())), Some("/b".into()));
        assert_eq!(kubeconfig_path(None, None), None);
        assert_eq!(kubeconfig_path(None, Some(String::new())), None);
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

    #[tokio::test]
    async fn limited_service_paces_requests() {
        let svc = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
        let mut limited = RateLimitLayer::new(50.0, 1).layer(svc);
        let start = Instant::now();
        for _ in 0..6 {
            tower::ServiceExt::ready(&mut limited).await.expect("ready");
            limited.call(()).await.expect("call");
        }
        // 1 burst token, then 5 more at 50/s: at least 100 ms.
        assert!(start.elapsed() >= Duration::from_millis(95), "{:?}", start.elapsed());
        let mut unlimited = RateLimitLayer::new(-1.0, 1)
            .layer(tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) }));
        let start = Instant::now();
        for _ in 0..100 {
            tower::ServiceExt::ready(&mut unlimited).await.expect("ready");
            unlimited.call(()).await.expect("call");
        }
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
