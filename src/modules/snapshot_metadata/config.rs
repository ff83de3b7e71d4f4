//! csi-snapshot-metadata's flags, each with upstream's default.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::{compat::snapshot_metadata as upstream, flags::goflags::parse_go_duration, modules::contract::Rule};

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}

fn default_port() -> u16 {
    upstream::DEFAULT_PORT
}

fn default_minutes() -> u64 {
    upstream::DEFAULT_MAX_STREAMING_MINUTES
}

fn default_timeout() -> Duration {
    Duration::from_secs(60)
}

/// snapshot-metadata: serves the Kubernetes SnapshotMetadata API (changed
/// block tracking) from the driver's CSI SnapshotMetadata service.
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct SnapshotMetadataFlags {
    /// port of the gRPC server (default 50051)
    #[argh(option, default = "default_port()")]
    pub port: u16,
    /// the server's TLS certificate file (default $TLS_CERT_PATH)
    #[argh(option, default = "String::new()")]
    pub tls_cert: String,
    /// the server's TLS key file (default $TLS_KEY_PATH)
    #[argh(option, default = "String::new()")]
    pub tls_key: String,
    /// the lowest TLS version served: VersionTLS12 or VersionTLS13 (default: TLS 1.2)
    #[argh(option, default = "String::new()")]
    pub tls_min_version: String,
    /// comma-separated TLS 1.2 cipher suites (default: the library's)
    #[argh(option, default = "String::new()")]
    pub tls_cipher_suites: String,
    /// comma-separated key exchange curves (default: the library's)
    #[argh(option, default = "String::new()")]
    pub tls_curve_preferences: String,
    /// the audience of client tokens (default: the SnapshotMetadataService's spec.audience)
    #[argh(option, default = "String::new()")]
    pub audience: String,
    /// the longest one stream may run, in minutes (default 10)
    #[argh(option, default = "default_minutes()")]
    pub max_streaming_duration_min: u64,
    /// timeout of each CSI call (default 1m)
    #[argh(option, default = "default_timeout()", from_str_fn(duration))]
    pub timeout: Duration,
    /// serve no metrics (default false)
    #[argh(switch)]
    pub disable_metrics: bool,
    /// the address the gRPC server binds (csi-sidecar's; default: every
    /// interface, as upstream)
    #[argh(option, default = "String::new()")]
    pub bind_address: String,
}

/// The lowest TLS version a `--tls-min-version` value allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMin {
    /// TLS 1.2 (also the default).
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl SnapshotMetadataFlags {
    /// The certificate and key files: the flags, else `$TLS_CERT_PATH` and
    /// `$TLS_KEY_PATH` (`env` reads a variable).
    pub fn tls_files(&self, env: impl Fn(&str) -> Option<String>) -> (Option<String>, Option<String>) {
        let pick = |flag: &str, var: &str| {
            Some(flag.to_string()).filter(|f| !f.is_empty()).or_else(|| env(var).filter(|v| !v.is_empty()))
        };
        (pick(&self.tls_cert, "TLS_CERT_PATH"), pick(&self.tls_key, "TLS_KEY_PATH"))
    }

    /// `--tls-min-version`, checked.
    pub fn tls_min(&self) -> Result<TlsMin, String> {
        let [tls12, tls13] = upstream::TLS_VERSIONS;
        match self.tls_min_version.as_str() {
            "" => Ok(TlsMin::Tls12),
            v if v == tls12 => Ok(TlsMin::Tls12),
            v if v == tls13 => Ok(TlsMin::Tls13),
            other => Err(format!("--tls-min-version: {other:?} is not {tls12} or {tls13}")),
        }
    }

    /// Where the server listens: `--bind-address` and `--port` (Go's
    /// `:port`, every interface, without the former).
    pub fn listen_address(&self) -> String {
        match self.bind_address.as_str() {
            host if host.contains(':') && !host.starts_with('[') => format!("[{host}]:{}", self.port),
            host => format!("{host}:{}", self.port),
        }
    }

    /// `--max-streaming-duration-min` as a duration.
    pub fn max_streaming(&self) -> Duration {
        Duration::from_secs(self.max_streaming_duration_min.saturating_mul(60))
    }
}

/// The module's ClusterRole (upstream's, with `list`/`watch` where the
/// shared cache replaces a GET per request).
pub const CLUSTER_RULES: &[Rule] = &[
    // request.rs `authorize`: every request's TokenReview and SubjectAccessReview.
    Rule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    Rule::new(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
    // request.rs `audience` (without --audience): the shared cache.
    Rule::new(&["cbt.storage.k8s.io"], &["snapshotmetadataservices"], &["list", "watch"]),
    // request.rs `resolve`: the one VolumeSnapshot a request names.
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshots"], &["get"]),
    // request.rs `resolve`: the driver's contents (shared cache), a GET when
    // the cache does not have it ready (just made ready, or another driver's).
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotcontents"], &["get", "list", "watch"]),
    // request.rs `secrets`: the shared cache.
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotclasses"], &["list", "watch"]),
    // request.rs `secrets`: the class's snapshotter secret.
    Rule::new(&[""], &["secrets"], &["get"]),
];

/// Shared flags upstream accepts, besides the logging flags (no leader
/// election: every replica serves).
pub const SHARED_FLAGS: &[&[&str]] =
    &[&["csi-address", "kubeconfig", "http-endpoint", "metrics-path", "kube-api-qps", "kube-api-burst"]];

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<SnapshotMetadataFlags, String> {
        SnapshotMetadataFlags::from_args(&["snapshot-metadata"], args).map_err(|e| e.output)
    }

    #[test]
    fn defaults_are_upstreams() {
        let f = parse(&[]).expect("defaults");
        assert_eq!((f.port, f.max_streaming_duration_min, f.timeout), (50051, 10, Duration::from_secs(60)));
        assert_eq!(f.max_streaming(), Duration::from_secs(600));
        assert!(f.tls_cert.is_empty() && f.tls_key.is_empty() && f.audience.is_empty() && !f.disable_metrics);
        assert_eq!(f.tls_min(), Ok(TlsMin::Tls12));
        let f =
            parse(&["--port", "6443", "--timeout", "30s", "--tls-min-version", "VersionTLS13", "--disable-metrics"])
                .expect("flags");
        assert_eq!(
            (f.port, f.timeout, f.tls_min(), f.disable_metrics),
            (6443, Duration::from_secs(30), Ok(TlsMin::Tls13), true)
        );
        let bad = parse(&["--tls-min-version", "VersionTLS10"]).expect("parsed").tls_min();
        assert!(bad.is_err_and(|e| e.contains("VersionTLS10")));
    }

    #[test]
    fn the_server_listens_on_every_interface_unless_an_address_is_bound() {
        let at = |args: &[&str]| parse(args).expect("flags").listen_address();
        assert_eq!(at(&[]), ":50051");
        assert_eq!(at(&["--port", "6443", "--bind-address", "127.0.0.1"]), "127.0.0.1:6443");
        assert_eq!(at(&["--bind-address", "::1"]), "[::1]:50051");
    }

    #[test]
    fn the_tls_files_are_the_flags_else_the_environment() {
        let env = |v: &str| match v {
            "TLS_CERT_PATH" => Some("/env/tls.crt".to_string()),
            "TLS_KEY_PATH" => Some(String::new()),
            _ => None,
        };
        let f = parse(&[]).expect("defaults");
        assert_eq!(f.tls_files(env), (Some("/env/tls.crt".into()), None), "an empty variable is unset");
        let f = parse(&["--tls-cert", "/flag/tls.crt", "--tls-key", "/flag/tls.key"]).expect("flags");
        assert_eq!(f.tls_files(env), (Some("/flag/tls.crt".into()), Some("/flag/tls.key".into())));
    }
}
