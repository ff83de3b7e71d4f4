//! external-resizer flags (`csi-resizer`), under their upstream names and
//! defaults, and its feature gates.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::flags::goflags::{go_bool_value, parse_go_duration};
use crate::modules::contract::Rule;

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
fn yes() -> bool {
    true
}

/// resizer: volume expansion and VolumeAttributesClass changes (external-resizer).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct ResizerFlags {
    /// API server URL, overriding the kubeconfig's (out of cluster)
    #[argh(option)]
    pub master: Option<String>,
    /// resync period of the claim, volume and pod handlers (default 10m)
    #[argh(option, default = "secs(600)", from_str_fn(duration))]
    pub resync_period: Duration,
    /// workers of the resize queue, and as many of the modify queue (default 10)
    #[argh(option, default = "10")]
    pub workers: usize,
    /// add PVC name and namespace and PV name to ControllerModifyVolume parameters (default false)
    #[argh(switch)]
    pub extra_modify_metadata: bool,
    /// timeout of each CSI call (default 10s)
    #[argh(option, default = "secs(10)", from_str_fn(duration))]
    pub timeout: Duration,
    /// first retry delay of a failed resize or modify (default 1s)
    #[argh(option, default = "secs(1)", from_str_fn(duration))]
    pub retry_interval_start: Duration,
    /// maximum retry delay; also how long an infeasible size is held back (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub retry_interval_max: Duration,
    /// offline-only drivers: no expansion while a pod uses the claim (watches pods) (default true)
    #[argh(option, arg_name = "bool", default = "yes()", from_str_fn(go_bool_value))]
    pub handle_volume_inuse_error: bool,
    /// feature gates k=v: AnnotateFsResize, RecoverVolumeExpansionFailure, VolumeAttributesClass, ReleaseLeaderElectionOnExit
    #[argh(option, default = "String::new()")]
    pub feature_gates: String,
}

/// Shared flags upstream external-resizer accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER];

use crate::flags::gates::{self, KnownGates};

/// Feature gates external-resizer knows, with their defaults.
pub const FEATURE_GATES: KnownGates = &[
    ("AnnotateFsResize", true),
    ("RecoverVolumeExpansionFailure", true),
    ("VolumeAttributesClass", true),
    ("ReleaseLeaderElectionOnExit", false),
];

/// The feature gates in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// `AnnotateFsResize`: the PV's pre-resize-capacity annotation.
    pub annotate_fs_resize: bool,
    /// `RecoverVolumeExpansionFailure`: allocatedResources, the shrink-back rule.
    pub recover: bool,
    /// `VolumeAttributesClass`: the modify controller.
    pub volume_attributes_class: bool,
    /// Whether `VolumeAttributesClass` was given explicitly (otherwise it is
    /// switched off when the apiserver does not serve the API).
    pub volume_attributes_class_explicit: bool,
    /// `ReleaseLeaderElectionOnExit` (csi-sidecar always releases; accepted).
    pub release_leader_election_on_exit: bool,
}

/// Parses `--feature-gates` ([`gates::parse`]) into the resizer's gates.
pub fn parse_gates(s: &str) -> Result<Gates, String> {
    let g = gates::parse(s, FEATURE_GATES).map_err(|e| e.to_string())?;
    Ok(Gates {
        annotate_fs_resize: g.enabled("AnnotateFsResize"),
        recover: g.enabled("RecoverVolumeExpansionFailure"),
        volume_attributes_class: g.enabled("VolumeAttributesClass"),
        volume_attributes_class_explicit: g.explicit("VolumeAttributesClass").is_some(),
        release_leader_election_on_exit: g.enabled("ReleaseLeaderElectionOnExit"),
    })
}

impl ResizerFlags {
    /// Start-up checks (upstream exits 1 for these).
    pub fn validate(&self) -> Result<Gates, String> {
        if self.workers == 0 {
            return Err("--workers must be greater than 0".into());
        }
        parse_gates(&self.feature_gates)
    }
}

/// The module's ClusterRole (its row's `cluster_rules`): exactly what the
/// code calls, each rule with where. `manifests/rbac/` and the chart are
/// checked against it, and `integration/tests/control_plane/rbac.rs` runs the module
/// under exactly it, with a cycle per rule taken away.
pub const CLUSTER_RULES: &[Rule] = &[
    // `run`: views::bound_claims (never a GET).
    Rule::new(&[""], &["persistentvolumeclaims"], &["list", "watch"]),
    // `patch_status`: resize and modify status, and the
    // node-expansion-not-required annotation (through /status, as upstream).
    Rule::new(&[""], &["persistentvolumeclaims/status"], &["patch"]),
    // list, watch: views::driver_pvs. patch: `patch_pv` (capacity, the
    // pre-resize annotation, volumeAttributesClassName).
    Rule::new(&[""], &["persistentvolumes"], &["list", "watch", "patch"]),
    // views::pods_using_claims (an offline-only driver).
    Rule::new(&[""], &["pods"], &["list", "watch"]),
    // The informer of classes, when the driver can modify.
    Rule::new(&["storage.k8s.io"], &["volumeattributesclasses"], &["list", "watch"]),
    // `expand`, `sync_modify`: the controllerExpandSecretRef.
    Rule::new(&[""], &["secrets"], &["get"]),
    // k8s/events.rs `write`: a new Event, the count of a repeat.
    Rule::new(&[""], &["events"], &["create", "patch"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_defaults_and_overrides() {
        let g = parse_gates("").unwrap();
        assert!(g.annotate_fs_resize && g.recover && g.volume_attributes_class);
        assert!(!g.volume_attributes_class_explicit && !g.release_leader_election_on_exit);
        let g =
            parse_gates("AnnotateFsResize=false, VolumeAttributesClass=true,ReleaseLeaderElectionOnExit=true").unwrap();
        assert!(!g.annotate_fs_resize && g.volume_attributes_class_explicit && g.release_leader_election_on_exit);
        assert!(!parse_gates("RecoverVolumeExpansionFailure=false").unwrap().recover);
        assert!(parse_gates("Nope=true").unwrap_err().contains("unrecognized feature gate: Nope"));
        assert!(parse_gates("AnnotateFsResize").is_err());
        assert!(parse_gates("AnnotateFsResize=maybe").is_err());
        assert_eq!(FEATURE_GATES.len(), 4);
    }
}
