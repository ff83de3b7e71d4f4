//! The Kubernetes client of the process: `--kubeconfig` (or `$KUBECONFIG`,
//! or the in-cluster configuration), client-go's reading of
//! `--kube-api-qps`/`--kube-api-burst`, the `User-Agent` per module, and a
//! client with a budget of its own (leader election, the capacity writes).
//! The modules' budget, pooled per process, is [`super::budget`].

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use tower::Service;

use super::budget::Taker;

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
    let client = build_unlimited(config)?;
    Ok(match effective_budget(qps, burst) {
        Some(budget) => super::budget::client(&client, super::budget::Budget::new(&[budget]), Taker::Account(0)),
        None => client,
    })
}

/// Builds a client without a budget of its own (the process client, whose
/// requests go through [`super::budget`] per module).
pub fn build_unlimited(config: Config) -> Result<Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(|e| ClientError::Build(e.to_string()))?;
    Ok(builder.build())
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

impl Service<http::Request<kube::client::Body>> for UserAgent {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<kube::client::Body>) -> Self::Future {
        req.headers_mut().entry(http::header::USER_AGENT).or_insert_with(|| self.value.clone());
        let client = self.client.clone();
        Box::pin(async move { client.send(req).await })
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
}
