//! Flags that configure the shared services of the process (CSI connection,
//! HTTP server, logging, Kubernetes client, leader election). They may be
//! given before the first module or inside any module's segment (that is how
//! upstream manifests pass them), as long as every place agrees; only the API
//! budget (`--kube-api-qps`, `--kube-api-burst`) is each module's own.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use super::goflags::parse_go_duration;

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}

/// `--metrics-path`: an absolute path that the HTTP router can serve next to
/// the health checks. Empty means the default, as in Go. Refused here (exit
/// 2 naming the flag) rather than left to the router, which panics.
pub fn metrics_path(s: &str) -> Result<String, String> {
    let reserved = crate::compat::prober::HEALTHZ_PATH;
    if s.is_empty() {
        return Ok(String::new());
    }
    if !s.starts_with('/') {
        return Err(format!("--metrics-path {s:?}: must start with \"/\""));
    }
    if s == reserved || s.strip_prefix(reserved).is_some_and(|rest| rest.starts_with('/')) {
        return Err(format!("--metrics-path {s:?}: {reserved} and the paths under it serve the health checks"));
    }
    if let Some(c) = s.chars().find(|c| matches!(c, '{' | '}' | '?' | '#') || c.is_control() || c.is_whitespace()) {
        return Err(format!("--metrics-path {s:?}: {c:?} is not allowed in a path"));
    }
    if s.split('/').any(|segment| segment.starts_with(':') || segment.starts_with('*')) {
        return Err(format!("--metrics-path {s:?}: a path segment must not start with ':' or '*'"));
    }
    Ok(s.to_string())
}

/// Settings shared by every module in the process.
#[derive(FromArgs, ArgsInfo, Debug, Default, Clone, PartialEq)]
pub struct SharedFlags {
    /// address of the CSI driver socket: a path or a unix:// URL (default "/run/csi/socket")
    #[argh(option)]
    pub csi_address: Option<String>,
    /// TCP address of the HTTP server for health checks and metrics, e.g. ":9808" (default: none)
    #[argh(option)]
    pub http_endpoint: Option<String>,
    /// deprecated: TCP address of the metrics server; use --http-endpoint
    #[argh(option)]
    pub metrics_address: Option<String>,
    /// HTTP path of the Prometheus metrics (default "/metrics")
    #[argh(option, from_str_fn(metrics_path))]
    pub metrics_path: Option<String>,
    /// deprecated: TCP port of the health server, on all interfaces; use --http-endpoint
    #[argh(option)]
    pub health_port: Option<String>,
    /// path to a kubeconfig; empty means in-cluster configuration
    #[argh(option)]
    pub kubeconfig: Option<String>,
    /// each module's client-side budget of API requests per second (a combined process pools the modules' budgets, see --help); negative: unlimited, 0: the default (default 5)
    #[argh(option)]
    pub kube_api_qps: Option<f64>,
    /// burst of each module's API request budget; 0: the default (default 10)
    #[argh(option)]
    pub kube_api_burst: Option<u32>,
    /// enable leader election (one Lease per module, upstream names)
    #[argh(switch)]
    pub leader_election: bool,
    /// namespace of the Lease; default $POD_NAMESPACE, the service account's namespace, else "default"
    #[argh(option)]
    pub leader_election_namespace: Option<String>,
    /// leader election lease duration (default 15s)
    #[argh(option, from_str_fn(duration))]
    pub leader_election_lease_duration: Option<Duration>,
    /// leader election renew deadline (default 10s)
    #[argh(option, from_str_fn(duration))]
    pub leader_election_renew_deadline: Option<Duration>,
    /// leader election retry period (default 5s)
    #[argh(option, from_str_fn(duration))]
    pub leader_election_retry_period: Option<Duration>,
    /// labels added to the Lease while leading, as k1:v1,k2:v2
    #[argh(option)]
    pub leader_election_labels: Option<String>,
    /// csi-sidecar only: one Lease of this name decides which replica runs all the modules of the process; each module still takes its upstream-named Lease before it works (the migration guard; default without this flag: per-module Leases with upstream names only)
    #[argh(option)]
    pub leader_election_shared_lease: Option<String>,
    /// log verbosity (klog levels: 0-1 info, 2-4 debug, 5+ trace with CSI requests)
    #[argh(option, long = "v")]
    pub v: Option<u32>,
    /// klog per-file verbosity (accepted for compatibility; has no effect)
    #[argh(option)]
    pub vmodule: Option<String>,
    /// log format: "text" or "json" (default "text")
    #[argh(option)]
    pub logging_format: Option<String>,
    /// log flush frequency (accepted for compatibility; logs are never buffered)
    #[argh(option, from_str_fn(duration))]
    pub log_flush_frequency: Option<Duration>,
    /// split text logs into stdout and stderr (accepted for compatibility; has no effect)
    #[argh(switch)]
    pub log_text_split_stream: bool,
    /// text info buffer size (accepted for compatibility; has no effect)
    #[argh(option)]
    pub log_text_info_buffer_size: Option<String>,
    /// split JSON logs into stdout and stderr (accepted for compatibility; has no effect)
    #[argh(switch)]
    pub log_json_split_stream: bool,
    /// JSON info buffer size (accepted for compatibility; has no effect)
    #[argh(option)]
    pub log_json_info_buffer_size: Option<String>,
    /// size GOMAXPROCS from the cgroup quota (accepted for compatibility; has no effect in Rust)
    #[argh(switch)]
    pub automaxprocs: bool,
    /// enable pprof (accepted for compatibility; profiling endpoints are not served)
    #[argh(switch)]
    pub enable_pprof: bool,
    /// csi-sidecar only: serve /debug/objects on the HTTP endpoint: every object a module holds that is not done, what it waits for, its last error and next retry (read by `csi-sidecar explain`)
    #[argh(switch)]
    pub enable_debug_endpoints: bool,
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
}

/// Logging flags every upstream sidecar has (component-base `logs`).
pub const LOGGING: &[&str] = &[
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
    "automaxprocs",
    "version",
];

impl SharedFlags {
    /// The CSI address, with the upstream default.
    pub fn csi_address(&self) -> &str {
        non_empty(&self.csi_address).unwrap_or(crate::compat::DEFAULT_CSI_ADDRESS)
    }

    /// The metrics path, with the upstream default.
    pub fn metrics_path(&self) -> &str {
        non_empty(&self.metrics_path).unwrap_or(crate::compat::DEFAULT_METRICS_PATH)
    }

    /// `--kube-api-qps` with the upstream default.
    pub fn kube_api_qps(&self) -> f64 {
        self.kube_api_qps.unwrap_or(5.0)
    }

    /// `--kube-api-burst` with the upstream default.
    pub fn kube_api_burst(&self) -> u32 {
        self.kube_api_burst.unwrap_or(10)
    }

    /// The verbosity, 0 by default.
    pub fn verbosity(&self) -> u32 {
        self.v.unwrap_or(0)
    }
}

/// An empty string means "not set", as in Go.
pub fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// Shared flags of the controller sidecars (csi-lib-utils `standardflags`).
pub const CONTROLLER: &[&str] = &[
    "csi-address",
    "kubeconfig",
    "http-endpoint",
    "metrics-address",
    "metrics-path",
    "kube-api-qps",
    "kube-api-burst",
    "leader-election",
    "leader-election-namespace",
    "leader-election-lease-duration",
    "leader-election-renew-deadline",
    "leader-election-retry-period",
    "leader-election-labels",
    "leader-election-shared-lease",
    "enable-debug-endpoints",
];

/// `k1:v1,k2:v2` (upstream's syntax for `--leader-election-labels`).
pub fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(format!("invalid label {p:?}: expected key:value")),
        })
        .collect()
}
