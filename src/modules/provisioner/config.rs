//! external-provisioner flags: every upstream flag, under its upstream name
//! and default. Flags of features csi-sidecar does not implement yet are
//! accepted and reported at start-up.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::compat::provisioner as upstream;
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

/// provisioner: dynamic provisioning and deletion of volumes (external-provisioner).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct ProvisionerFlags {
    /// API server URL, overriding the kubeconfig's (out of cluster)
    #[argh(option)]
    pub master: Option<String>,
    /// prefix of PV and CSI volume names (default "pvc")
    #[argh(option, default = "String::from(\"pvc\")")]
    pub volume_name_prefix: String,
    /// -1: <prefix>-<PVC UID>; N: UID without dashes cut to N characters (default -1)
    #[argh(option, default = "-1")]
    pub volume_name_uuid_length: i64,
    /// first retry delay of a failed PVC or PV (default 1s)
    #[argh(option, default = "secs(1)", from_str_fn(duration))]
    pub retry_interval_start: Duration,
    /// maximum retry delay; also the delay after InvalidArgument (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub retry_interval_max: Duration,
    /// PVC workers, and as many PV workers (default 100)
    #[argh(option, default = "100")]
    pub worker_threads: usize,
    /// workers removing the cloning-protection finalizer from clone sources (default 1)
    #[argh(option, default = "1")]
    pub cloning_protection_threads: usize,
    /// how often orphaned snapshot source finalizers are swept; 0 disables it (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub snapshot_orphan_sweep_interval: Duration,
    /// CSIStorageCapacity workers (default 1)
    #[argh(option, default = "1")]
    pub capacity_threads: usize,
    /// timeout of each CSI call (default 10s)
    #[argh(option, default = "secs(10)", from_str_fn(duration))]
    pub timeout: Duration,
    /// late binding: the selected node's topology only (default false)
    #[argh(switch)]
    pub strict_topology: bool,
    /// immediate binding: the cluster's aggregated topology (default true)
    #[argh(option, arg_name = "bool", default = "yes()", from_str_fn(go_bool_value))]
    pub immediate_topology: bool,
    /// add PVC name and namespace and PV name to CreateVolume parameters (default false)
    #[argh(switch)]
    pub extra_create_metadata: bool,
    /// fsType when the StorageClass sets none (default "")
    #[argh(option, default = "String::new()")]
    pub default_fstype: String,
    /// requests per second of the CSIStorageCapacity client (default 1)
    #[argh(option, default = "1.0")]
    pub kube_api_capacity_qps: f64,
    /// burst of the CSIStorageCapacity client (default 5)
    #[argh(option, default = "5")]
    pub kube_api_capacity_burst: u32,
    /// produce CSIStorageCapacity objects from GetCapacity (needs env NAMESPACE, and POD_NAME unless --capacity-ownerref-level=-1) (default false)
    #[argh(switch)]
    pub enable_capacity: bool,
    /// CSIStorageCapacity also for StorageClasses with Immediate binding (default false)
    #[argh(switch)]
    pub capacity_for_immediate_binding: bool,
    /// how often every CSIStorageCapacity is refreshed with GetCapacity (default 1m)
    #[argh(option, default = "secs(60)", from_str_fn(duration))]
    pub capacity_poll_interval: Duration,
    /// owner of the CSIStorageCapacity objects, counted up from POD_NAME: negative: none, 0 the pod, 1 its controller (StatefulSet, ReplicaSet), 2 a Deployment (default 1)
    #[argh(option, default = "1")]
    pub capacity_ownerref_level: i64,
    /// per-node deployment next to the driver; needs $NODE_NAME (default false)
    #[argh(switch)]
    pub node_deployment: bool,
    /// node deployment: compete for Immediate PVCs (default true)
    #[argh(option, arg_name = "bool", default = "yes()", from_str_fn(go_bool_value))]
    pub node_deployment_immediate_binding: bool,
    /// node deployment: first delay before trying to own an Immediate PVC (default 20s)
    #[argh(option, default = "secs(20)", from_str_fn(duration))]
    pub node_deployment_base_delay: Duration,
    /// node deployment: maximum delay before trying to own an Immediate PVC (default 1m)
    #[argh(option, default = "secs(60)", from_str_fn(duration))]
    pub node_deployment_max_delay: Duration,
    /// PV spec.csi.readOnly when the PVC's only access mode is ReadOnlyMany (default false)
    #[argh(switch)]
    pub controller_publish_readonly: bool,
    /// refuse snapshot restores that change volumeMode unless the content allows it (default true)
    #[argh(option, arg_name = "bool", default = "yes()", from_str_fn(go_bool_value))]
    pub prevent_volume_mode_conversion: bool,
    /// feature gates k=v,k2=v2: Topology, CrossNamespaceVolumeDataSource, VolumeAttributesClass, ReleaseLeaderElectionOnExit
    #[argh(option, default = "String::new()")]
    pub feature_gates: String,
}

/// Shared flags upstream external-provisioner accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER, &["enable-pprof"]];

use crate::flags::gates::{self, KnownGates};

/// Feature gates external-provisioner knows, with their defaults
/// (`VolumeAttributesClass` unless given: on where the apiserver serves the API).
pub const FEATURE_GATES: KnownGates = &[
    ("Topology", true),
    (upstream::GATE_CROSS_NAMESPACE, false),
    (super::vac::GATE, true),
    ("ReleaseLeaderElectionOnExit", false),
];

/// The feature gates in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// `Topology`: accessibility requirements for a topology-aware driver.
    pub topology: bool,
    /// `CrossNamespaceVolumeDataSource`: data sources in other namespaces.
    pub cross_namespace: bool,
    /// `VolumeAttributesClass` as given (else decided by the served API).
    pub volume_attributes_class: Option<bool>,
}

/// Parses `--feature-gates` ([`gates::parse`]) into the provisioner's gates.
pub fn parse_gates(s: &str) -> Result<Gates, String> {
    let g = gates::parse(s, FEATURE_GATES).map_err(|e| e.to_string())?;
    Ok(Gates {
        topology: g.enabled("Topology"),
        cross_namespace: g.enabled(upstream::GATE_CROSS_NAMESPACE),
        volume_attributes_class: g.explicit(super::vac::GATE),
    })
}

impl ProvisionerFlags {
    /// Start-up checks (upstream exits 1 for these); the gates in effect.
    pub fn validate(&self) -> Result<Gates, String> {
        if self.volume_name_prefix.is_empty() {
            return Err("volume name prefix cannot be of length 0".into());
        }
        if self.worker_threads == 0 {
            return Err("--worker-threads must be greater than 0".into());
        }
        if self.enable_capacity && self.capacity_poll_interval.is_zero() {
            return Err("--capacity-poll-interval must be greater than 0".into());
        }
        parse_gates(&self.feature_gates)
    }
}

/// The module's ClusterRole (its row's `cluster_rules`): exactly what the
/// code calls, each rule with where. `manifests/rbac/` and the chart are
/// checked against it, and `integration/tests/control_plane/rbac.rs` runs the module
/// under exactly it, with a cycle per rule taken away.
pub const CLUSTER_RULES: &[Rule] = &[
    // list, watch: `run`'s informer of claims (a streaming list; `list` where
    // the apiserver refuses those). patch: `unselect_node` (the selected-node
    // annotation on a reschedule) and the cloning-protection finalizer on a
    // clone's source (`protect_source`, `sync_clone_source`); under
    // upstream's RBAC, which grants `update` instead, each goes out as an
    // update (k8s/update_fallback.rs). get: `clone_source`, the bound source
    // claim (not in the cache).
    Rule::new(&[""], &["persistentvolumeclaims"], &["get", "list", "watch", "patch"]),
    // get: `clone_source`, the source's volume. list, watch: the informer.
    // create: `provision`. delete: `delete`. patch: `patch_finalizers`.
    Rule::new(&[""], &["persistentvolumes"], &["get", "list", "watch", "create", "delete", "patch"]),
    // get: a restore's snapshot (`snapshot_source`, `protect_source`,
    // `release_snapshot`); patch: its source-protection finalizer (refused
    // under upstream's RBAC: the restore goes on without it, as upstream's);
    // list, watch: the orphan sweep's view (with the snapshot CRDs and a
    // driver that snapshots; asked first, and without them the sweep is off).
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshots"], &["get", "list", "watch", "patch"]),
    // `snapshot_source`: the snapshot's bound content (its handle).
    Rule::new(&["snapshot.storage.k8s.io"], &["volumesnapshotcontents"], &["get"]),
    // The informer of classes (never a GET: the cache).
    Rule::new(&["storage.k8s.io"], &["storageclasses"], &["list", "watch"]),
    // The informer of attachments, when the driver can publish.
    Rule::new(&["storage.k8s.io"], &["volumeattachments"], &["list", "watch"]),
    // Topology (a driver with VOLUME_ACCESSIBILITY_CONSTRAINTS): the Node
    // metadata and CSINode informers.
    Rule::new(&[""], &["nodes"], &["list", "watch"]),
    Rule::new(&["storage.k8s.io"], &["csinodes"], &["list", "watch"]),
    // `prepare`: a claim naming a VolumeAttributesClass.
    Rule::new(&["storage.k8s.io"], &["volumeattributesclasses"], &["get"]),
    // `secret`: provisioner and deletion secrets.
    Rule::new(&[""], &["secrets"], &["get"]),
    // k8s/events.rs `write`: a new Event, the count of a repeat.
    Rule::new(&[""], &["events"], &["create", "patch"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates() {
        let g = parse_gates("Topology=false, VolumeAttributesClass=false").unwrap();
        assert_eq!((g.topology, g.cross_namespace, g.volume_attributes_class), (false, false, Some(false)));
        let g = parse_gates("").unwrap();
        assert_eq!((g.topology, g.cross_namespace, g.volume_attributes_class), (true, false, None));
        assert!(parse_gates("CrossNamespaceVolumeDataSource=true").unwrap().cross_namespace);
        assert!(parse_gates("Nope=true").unwrap_err().contains("unrecognized feature gate: Nope"));
        assert!(parse_gates("Topology").is_err());
        assert!(parse_gates("Topology=maybe").is_err());
    }
}
