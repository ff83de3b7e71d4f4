//! external-attacher flags, under their upstream names and defaults.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::flags::goflags::parse_go_duration;
use crate::modules::contract::Rule;

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
    /// feature gates k=v: MutableCSINodeAllocatableCount (GA, default true: the gRPC code of a failed publish as status.attachError.errorCode; false: no code, as upstream), ReleaseLeaderElectionOnExit
    #[argh(option, default = "String::new()")]
    pub feature_gates: String,
}

/// Shared flags upstream external-attacher accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER];

/// The gate that writes a driver error's gRPC code into the status.
pub const GATE_ERROR_CODE: &str = "MutableCSINodeAllocatableCount";

/// Feature gates external-attacher knows, with their defaults
/// (`MutableCSINodeAllocatableCount`: GA and on since external-attacher
/// v4.12, still settable).
pub const FEATURE_GATES: KnownGates = &[(GATE_ERROR_CODE, true), ("ReleaseLeaderElectionOnExit", false)];

use crate::flags::gates::{self, KnownGates};

/// The feature gates in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// `MutableCSINodeAllocatableCount`: `attachError.errorCode` is written.
    pub error_code: bool,
}

/// Parses `--feature-gates` ([`gates::parse`]) into the attacher's gates.
pub fn parse_gates(s: &str) -> Result<Gates, String> {
    let g = gates::parse(s, FEATURE_GATES).map_err(|e| e.to_string())?;
    Ok(Gates { error_code: g.enabled(GATE_ERROR_CODE) })
}

impl AttacherFlags {
    /// Start-up checks (upstream exits for these); the gates in effect.
    pub fn validate(&self) -> Result<Gates, String> {
        if self.worker_threads == 0 {
            return Err("--worker-threads must be greater than 0".into());
        }
        parse_gates(&self.feature_gates)
    }
}

/// The module's ClusterRole (its row's `cluster_rules`): exactly what the
/// code calls, each rule with where. `manifests/rbac/` and the chart are
/// checked against it, and `integration/tests/control_plane/rbac.rs` runs the module
/// under exactly it, with a cycle per rule taken away.
pub const CLUSTER_RULES: &[Rule] = &[
    // list, watch: `run`'s informer (never a GET). patch: `attach`,
    // `detach` (finalizer, node-id annotation).
    Rule::new(&["storage.k8s.io"], &["volumeattachments"], &["list", "watch", "patch"]),
    // `patch_status`, `error_status`.
    Rule::new(&["storage.k8s.io"], &["volumeattachments/status"], &["patch"]),
    // list, watch: the informer. patch: `add_finalizer`, `sync_pv`.
    Rule::new(&[""], &["persistentvolumes"], &["list", "watch", "patch"]),
    // The informer of CSINodes (node IDs).
    Rule::new(&["storage.k8s.io"], &["csinodes"], &["list", "watch"]),
    // `secrets`: the controllerPublishSecretRef.
    Rule::new(&[""], &["secrets"], &["get"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// external-attacher v4.12 made `MutableCSINodeAllocatableCount` GA and
    /// on by default: the gRPC code of a failed publish is written as
    /// `attachError.errorCode` unless the gate is switched off.
    #[test]
    fn mutable_csinode_allocatable_count_is_on_by_default() {
        let on = |s: &str| gates::parse(s, FEATURE_GATES).unwrap().enabled("MutableCSINodeAllocatableCount");
        assert!(on(""), "on unless given");
        assert!(!on("MutableCSINodeAllocatableCount=false"), "as upstream's gate: off when set false");
        assert_eq!(parse_gates("").unwrap(), Gates { error_code: true });
        assert_eq!(parse_gates("MutableCSINodeAllocatableCount=false").unwrap(), Gates { error_code: false });
        assert!(parse_gates("Topology=true").unwrap_err().contains("unrecognized feature gate: Topology"));
    }
}
