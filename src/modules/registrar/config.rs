//! node-driver-registrar flags.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::{compat, flags::goflags::parse_go_duration};

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}

fn default_timeout() -> Duration {
    compat::registrar::DEFAULT_TIMEOUT
}

fn default_plugin_registration_path() -> String {
    compat::registrar::DEFAULT_PLUGIN_REGISTRATION_PATH.to_string()
}

/// registrar: registers the CSI driver with the kubelet (node-driver-registrar).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct RegistrarFlags {
    /// path of the driver socket on the host, returned to the kubelet (required)
    #[argh(option)]
    pub kubelet_registration_path: Option<String>,
    /// directory of the kubelet's plugin registry, where the registration socket is created (default "/registration")
    #[argh(option, default = "default_plugin_registration_path()")]
    pub plugin_registration_path: String,
    /// timeout of GetPluginInfo and of the registration socket self-check in /healthz (default 1s)
    #[argh(option, default = "default_timeout()", from_str_fn(duration))]
    pub timeout: Duration,
    /// deprecated: "kubelet-registration-probe" exits 0 at once; other values are ignored
    #[argh(option)]
    pub mode: Option<String>,
    /// deprecated and ignored: connection timeout
    #[argh(option, from_str_fn(duration))]
    pub connection_timeout: Option<Duration>,
}

/// Shared flags upstream node-driver-registrar accepts, besides the logging flags.
pub const SHARED_FLAGS: &[&[&str]] = &[&["csi-address", "http-endpoint", "health-port", "enable-pprof"]];
