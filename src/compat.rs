//! Every name and text that upstream kubernetes-csi sidecars define and that
//! users, dashboards or the kubelet depend on, spelled exactly once.
//!
//! Drop-in compatibility is read and tested here: change a value only when
//! upstream changes it.

use std::time::Duration;

/// `--csi-address` default of every upstream sidecar.
pub const DEFAULT_CSI_ADDRESS: &str = "/run/csi/socket";
/// `--metrics-path` default.
pub const DEFAULT_METRICS_PATH: &str = "/metrics";

/// CSI call metrics (csi-lib-utils `metrics`).
pub mod metrics {
    /// Histogram of every CSI call.
    pub const OPERATIONS_SECONDS: &str = "csi_sidecar_operations_seconds";
    /// HELP text of [`OPERATIONS_SECONDS`].
    pub const OPERATIONS_SECONDS_HELP: &str =
        "[ALPHA] Container Storage Interface operation duration with gRPC error code status total";
    /// Buckets of [`OPERATIONS_SECONDS`].
    pub const OPERATIONS_SECONDS_BUCKETS: &[f64] =
        &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];
    /// Label: the driver name.
    pub const LABEL_DRIVER_NAME: &str = "driver_name";
    /// Label: the full gRPC method, e.g. `/csi.v1.Identity/Probe`.
    pub const LABEL_METHOD_NAME: &str = "method_name";
    /// Label: the gRPC status code name.
    pub const LABEL_GRPC_STATUS_CODE: &str = "grpc_status_code";
    /// `driver_name` before the driver told its name.
    pub const UNKNOWN_DRIVER: &str = "unknown-driver";
    /// `grpc_status_code` of a failure that carried no gRPC status.
    pub const UNKNOWN_NON_GRPC: &str = "unknown-non-grpc";
}

/// gRPC status code names as Go's `codes.Code.String()` prints them (note
/// Go's spelling `Canceled`), used in metric labels and error texts.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The text Go's gRPC status error prints: `rpc error: code = X desc = Y`.
pub fn grpc_error_text(status: &tonic::Status) -> String {
    format!("rpc error: code = {} desc = {}", grpc_code_name(status.code()), status.message())
}

/// The message of a call that ran out of its deadline, as Go's context says it.
pub const DEADLINE_EXCEEDED_MESSAGE: &str = "context deadline exceeded";

/// livenessprobe (`cmd/livenessprobe`).
pub mod prober {
    use super::Duration;
    /// `--probe-timeout` default.
    pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
    /// `--health-port` default: livenessprobe listens on `0.0.0.0:9808` when
    /// `--http-endpoint` is not set.
    pub const DEFAULT_HEALTH_PORT: &str = "9808";
    /// Health path.
    pub const HEALTHZ_PATH: &str = "/healthz";
    /// Body of a healthy answer (200).
    pub const BODY_OK: &str = "ok";
    /// Body when `Probe` answered `ready: false` (500).
    pub const BODY_NOT_READY: &str = "driver responded but is not ready";
}

/// node-driver-registrar (`cmd/csi-node-driver-registrar`).
pub mod registrar {
    use super::Duration;
    /// `--plugin-registration-path` default.
    pub const DEFAULT_PLUGIN_REGISTRATION_PATH: &str = "/registration";
    /// `--timeout` default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    /// The only `--mode` upstream still knows; it exits 0 at once.
    pub const MODE_REGISTRATION_PROBE: &str = "kubelet-registration-probe";
    /// Registration socket file name for a driver.
    pub fn socket_file_name(driver: &str) -> String {
        format!("{driver}-reg.sock")
    }
    /// `PluginInfo.type` for CSI plugins.
    pub const PLUGIN_TYPE_CSI: &str = "CSIPlugin";
    /// `PluginInfo.supported_versions`.
    pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
    /// `/healthz` body when the registration socket is missing (404).
    pub const BODY_SOCKET_MISSING: &str = "registration socket does not exist";
    /// `/healthz` body prefix when `GetInfo` on the own socket failed (500).
    pub fn body_get_info_failed(err: &str) -> String {
        format!("error getting info from node-registrar socket: {err}")
    }
    /// `/healthz` body when the own socket answers with another name (500).
    pub fn body_wrong_name(name: &str) -> String {
        format!("invalid driver name {name}")
    }
}

/// Flags that upstream still accepts but calls deprecated, with what
/// csi-sidecar does with them.
pub const DEPRECATED_FLAGS: &[(&str, &str)] = &[
    ("health-port", "use --http-endpoint"),
    ("metrics-address", "use --http-endpoint"),
    ("connection-timeout", "ignored: csi-sidecar waits for the driver for as long as it takes"),
    ("mode", "ignored except kubelet-registration-probe, which exits 0"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spells_grpc_codes_its_own_way() {
        assert_eq!(grpc_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(grpc_code_name(tonic::Code::Ok), "OK");
        assert_eq!(grpc_code_name(tonic::Code::DeadlineExceeded), "DeadlineExceeded");
    }

    #[test]
    fn grpc_error_text_matches_go() {
        let s = tonic::Status::deadline_exceeded(DEADLINE_EXCEEDED_MESSAGE);
        assert_eq!(grpc_error_text(&s), "rpc error: code = DeadlineExceeded desc = context deadline exceeded");
    }

    #[test]
    fn registration_socket_name_is_driver_name_verbatim() {
        assert_eq!(registrar::socket_file_name("hostpath.csi.k8s.io"), "hostpath.csi.k8s.io-reg.sock");
    }
}
