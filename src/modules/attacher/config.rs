//! external-attacher flags, under their upstream names and defaults.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::flags::goflags::parse_go_duration;

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}
/// A period of a ticker: zero is refused (a ticker of zero cannot tick).
fn period(s: &str) -> Result<Duration, String> {
    let d = parse_go_duration(s)?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// attacher: ControllerPublish/Unpublish for VolumeAttachments (external-attacher).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct AttacherFlags {
    /// resync period of the VolumeAttachment and PV caches (default 10m)
    #[argh(option, default = "secs(600)", from_str_fn(duration))]
    pub resync: Duration,
    /// timeout of each CSI call; ListVolumes: of a whole reconcile pass (default 15s)
    #[argh(option, default = "secs(15)", from_str_fn(duration))]
    pub timeout: Duration,
    /// first retry delay of a failed attach or detach (default 1s)
    #[argh(option, default = "secs(1)", from_str_fn(duration))]
    pub retry_interval_start: Duration,
    /// maximum retry delay (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub retry_interval_max: Duration,
    /// attach workers, and as many detach workers and PV workers (default 10)
    #[argh(option, default = "10")]
    pub worker_threads: usize,
    /// page size of ListVolumes; 0 means no limit (default 0)
    #[argh(option, default = "0")]
    pub max_entries: i32,
    /// fsType when the PV sets none (default "")
    #[argh(option, default = "String::new()")]
    pub default_fstype: String,
    /// period of the ListVolumes reconciler; must be greater than 0 (default 1m)
    #[argh(option, default = "secs(60)", from_str_fn(period))]
    pub reconcile_sync: Duration,
    /// cap on the logged gRPC response length (-v=5); -1 means no cap (default -1); one connection per process: it caps every module's responses
    #[argh(option, default = "-1")]
    pub max_grpc_log_length: i64,
    /// feature gates k=v: MutableCSINodeAllocatableCount, ReleaseLeaderElectionOnExit
    #[argh(option, default = "String::new()")]
    pub feature_gates: String,
}

/// Shared flags upstream external-attacher accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER];

/// Feature gates external-attacher knows, with their defaults.
pub const FEATURE_GATES: KnownGates =
    &[("MutableCSINodeAllocatableCount", false), ("ReleaseLeaderElectionOnExit", false)];

use crate::flags::gates::{self, KnownGates};

impl AttacherFlags {
    /// Start-up checks (upstream exits for these).
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_threads == 0 {
            return Err("--worker-threads must be greater than 0".into());
        }
        gates::parse(&self.feature_gates, FEATURE_GATES).map_err(|e| e.to_string())?;
        Ok(())
    }
}
