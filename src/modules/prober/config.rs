//! livenessprobe flags.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::{compat, flags::goflags::parse_go_duration};

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}

fn default_probe_timeout() -> Duration {
    compat::prober::DEFAULT_PROBE_TIMEOUT
}

/// prober: answers /healthz from the CSI driver's Probe (livenessprobe).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct ProberFlags {
    /// time budget of one health check: connection and Probe (default 3s)
    #[argh(option, default = "default_probe_timeout()", from_str_fn(duration))]
    pub probe_timeout: Duration,
}

/// Shared flags upstream livenessprobe accepts, besides the logging flags.
pub const SHARED_FLAGS: &[&[&str]] =
    &[&["csi-address", "http-endpoint", "metrics-address", "metrics-path", "health-port"]];
