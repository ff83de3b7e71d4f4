//! csi-snapshotter flags, under their upstream names and defaults, and its
//! feature gates.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::modules::contract::Rule;
use crate::{compat::snapshotter as upstream, flags::goflags::parse_go_duration};

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The longest `--snapshot-name-uuid-length` that means something: a UID
/// without its dashes has 32 characters (upstream panics above that).
pub const MAX_UUID_LENGTH: i64 = 32;

/// snapshotter: VolumeSnapshotContents → CreateSnapshot/DeleteSnapshot/ListSnapshots (csi-snapshotter).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct SnapshotterFlags {
    /// resync period of the content handler (default 15m)
    #[argh(option, default = "secs(900)", from_str_fn(duration))]
    pub resync_period: Duration,
    /// prefix of the snapshot name sent to CreateSnapshot (default "snapshot")
    #[argh(option, default = "String::from(\"snapshot\")")]
    pub snapshot_name_prefix: String,
    /// characters of the VolumeSnapshot UID (dashes removed) in the snapshot name; -1: the whole UID (default -1)
    #[argh(option, default = "-1")]
    pub snapshot_name_uuid_length: i64,
    /// workers of the content queue (default 10)
    #[argh(option, default = "10")]
    pub worker_threads: usize,
    /// timeout of each CSI call (default 1m)
    #[argh(option, default = "secs(60)", from_str_fn(duration))]
    pub timeout: Duration,
    /// add VolumeSnapshot name and namespace and content name to CreateSnapshot parameters (default false)
    #[argh(switch)]
    pub extra_create_metadata: bool,
    /// first retry delay of a failed or not yet ready snapshot (default 1s)
    #[argh(option, default = "secs(1)", from_str_fn(duration))]
    pub retry_interval_start: Duration,
    /// maximum retry delay (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub retry_interval_max: Duration,
    /// run next to the driver on each node: only contents labelled managed-by=$NODE_NAME (default false)
    #[argh(switch)]
    pub node_deployment: bool,
    /// prefix of the group snapshot name sent to CreateVolumeGroupSnapshot (default "groupsnapshot")
    #[argh(option, default = "String::from(\"groupsnapshot\")")]
    pub groupsnapshot_name_prefix: String,
    /// characters of the VolumeGroupSnapshot UID (dashes removed) in the group snapshot name; -1: the whole UID (default -1)
    #[argh(option, default = "-1")]
    pub groupsnapshot_name_uuid_length: i64,
    /// feature gates k=v: CSIVolumeGroupSnapshot (default true: group snapshots when the group CRDs are installed), ReleaseLeaderElectionOnExit
    #[argh(option, default = "String::new()")]
    pub feature_gates: String,
}

/// Shared flags upstream csi-snapshotter accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER];

use crate::flags::gates::{self, KnownGates};

/// Feature gates csi-snapshotter knows, with their defaults.
pub const FEATURE_GATES: KnownGates = &[("CSIVolumeGroupSnapshot", true), ("ReleaseLeaderElectionOnExit", false)];

/// The feature gates in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// `CSIVolumeGroupSnapshot`: VolumeGroupSnapshotContents are served
    /// (when the group snapshot CRDs are installed).
    pub volume_group_snapshot: bool,
    /// `ReleaseLeaderElectionOnExit` (csi-sidecar always releases; accepted).
    pub release_leader_election_on_exit: bool,
}

/// Parses `--feature-gates` ([`gates::parse`]) into the snapshotter's gates.
pub fn parse_gates(s: &str) -> Result<Gates, String> {
    let g = gates::parse(s, FEATURE_GATES).map_err(|e| e.to_string())?;
    Ok(Gates {
        volume_group_snapshot: g.enabled("CSIVolumeGroupSnapshot"),
        release_leader_election_on_exit: g.enabled("ReleaseLeaderElectionOnExit"),
    })
}

impl SnapshotterFlags {
    /// Start-up checks (upstream exits 1 for these; a uuid length above 32
    /// makes upstream panic at the first snapshot, csi-sidecar refuses it
    /// at start).
    pub fn validate(&self) -> Result<Gates, String> {
        if self.snapshot_name_prefix.is_empty() {
            return Err(upstream::TEXT_EMPTY_PREFIX.into());
        }
        for (flag, n) in [
            ("--snapshot-name-uuid-length", self.snapshot_name_uuid_length),
            ("--groupsnapshot-name-uuid-length", self.groupsnapshot_name_uuid_length),
        ] {
            if !(-1..=MAX_UUID_LENGTH).contains(&n) {
                return Err(format!("{flag} must be -1 or between 0 and {MAX_UUID_LENGTH}, not {n}"));
            }
        }
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
    // list, watch: views::driver_snapshot_contents. get: the fresh read
    // before a status write or a delete. patch: the being-created annotation
    // and (k8s/finalizers.rs) the finalizer. No `update`: every write is a
    // patch.
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotcontents"], &["get", "list", "watch", "patch"]),
    // `patch_status`: handle, readyToUse, creationTime, restoreSize, error.
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotcontents/status"], &["patch"]),
    // views::snapshot_classes.
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotclasses"], &["list", "watch"]),
    // With group snapshots: the view of the driver's group contents, and
    // group.rs's fresh read, annotation and finalizer patches, status.
    Rule::new(&["groupsnapshot.storage.k8s.io"], &["volumegroupsnapshotcontents"], &["get", "list", "watch", "patch"]),
    Rule::new(&["groupsnapshot.storage.k8s.io"], &["volumegroupsnapshotcontents/status"], &["patch"]),
    Rule::new(&["groupsnapshot.storage.k8s.io"], &["volumegroupsnapshotclasses"], &["list", "watch"]),
    // `secrets`: the deletion-secret annotations, the list secret.
    Rule::new(&[""], &["secrets"], &["get"]),
    // k8s/events.rs `write`: a new Event, the count of a repeat.
    Rule::new(&[""], &["events"], &["create", "patch"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> SnapshotterFlags {
        SnapshotterFlags::from_args(&["snapshotter"], args).expect("parses")
    }

    #[test]
    fn defaults_are_upstreams() {
        let f = flags(&[]);
        assert_eq!(f.resync_period, secs(900));
        assert_eq!(f.snapshot_name_prefix, "snapshot");
        assert_eq!(f.snapshot_name_uuid_length, -1);
        assert_eq!(f.worker_threads, 10);
        assert_eq!(f.timeout, secs(60));
        assert!(!f.extra_create_metadata && !f.node_deployment);
        assert_eq!((f.retry_interval_start, f.retry_interval_max), (secs(1), secs(300)));
        assert_eq!(f.groupsnapshot_name_prefix, "groupsnapshot");
        assert_eq!(f.groupsnapshot_name_uuid_length, -1);
        let g = f.validate().expect("valid");
        assert!(g.volume_group_snapshot && !g.release_leader_election_on_exit);
    }

    #[test]
    fn start_up_refusals() {
        let e = flags(&["--snapshot-name-prefix", ""]).validate().unwrap_err();
        assert_eq!(e, "Snapshot name prefix cannot be of length 0");
        assert!(flags(&["--snapshot-name-uuid-length", "33"]).validate().is_err());
        assert!(flags(&["--snapshot-name-uuid-length", "32"]).validate().is_ok());
        assert!(flags(&["--snapshot-name-uuid-length", "-2"]).validate().is_err());
        assert!(flags(&["--worker-threads", "0"]).validate().is_err());
        let g = parse_gates("CSIVolumeGroupSnapshot=false,ReleaseLeaderElectionOnExit=true").unwrap();
        assert!(!g.volume_group_snapshot && g.release_leader_election_on_exit);
        assert!(parse_gates("Topology=true").unwrap_err().contains("unrecognized feature gate: Topology"));
        assert!(parse_gates("CSIVolumeGroupSnapshot").is_err());
        assert_eq!(FEATURE_GATES.len(), 2);
    }
}
