//! external-health-monitor-controller flags
//! (`csi-external-health-monitor-controller`), under their upstream names
//! and defaults (v0.18.0).

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::modules::contract::Rule;
use crate::{compat::health_monitor as upstream, flags::goflags::parse_go_duration};

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// health-monitor: volume health from the driver, as claim events or `status.healthStatus` (external-health-monitor).
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
pub struct HealthMonitorFlags {
    /// how often every bound volume of the driver is checked in get mode (default 1m)
    #[argh(option, default = "secs(60)", from_str_fn(duration))]
    pub monitor_interval: Duration,
    /// how often the driver's volumes are listed in list mode, counted from the end of a pass (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub list_volumes_interval: Duration,
    /// accepted for compatibility: the volumes come from the shared cache at every pass (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub volume_list_add_interval: Duration,
    /// how often the node watcher looks at every node again (default 5m)
    #[argh(option, default = "secs(300)", from_str_fn(duration))]
    pub node_list_add_interval: Duration,
    /// volumes checked at once in get mode (default 10)
    #[argh(option, default = "10")]
    pub worker_threads: usize,
    /// watch nodes and pods: NodeFailed/NodeRecovered events on the claims of pods on a failed node (default false)
    #[argh(switch)]
    pub enable_node_watcher: bool,
    /// timeout of each CSI call and of a list pass (default 15s)
    #[argh(option, default = "secs(15)", from_str_fn(duration))]
    pub timeout: Duration,
    /// resync period of the informers (default 10m)
    #[argh(option, default = "secs(600)", from_str_fn(duration))]
    pub resync: Duration,
}

/// Shared flags upstream's health monitor accepts, besides logging.
pub const SHARED_FLAGS: &[&[&str]] = &[crate::flags::shared::CONTROLLER];

impl HealthMonitorFlags {
    /// Start-up checks (upstream exits 1 for these).
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_threads == 0 {
            return Err(upstream::ERR_WORKER_THREADS.into());
        }
        for (flag, d) in [
            ("--monitor-interval", self.monitor_interval),
            ("--list-volumes-interval", self.list_volumes_interval),
            ("--timeout", self.timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{flag} must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// The module's ClusterRole (its row's `cluster_rules`): exactly what the
/// code calls, each rule with where. `manifests/rbac/` and the chart are
/// checked against it, and `integration/tests/control_plane/rbac.rs` runs the module
/// under exactly it, with a cycle per rule taken away.
pub const CLUSTER_RULES: &[Rule] = &[
    // mod.rs `run`: views::bound_claims (never a GET).
    Rule::new(&[""], &["persistentvolumeclaims"], &["list", "watch"]),
    // mod.rs `run`: views::driver_pvs.
    Rule::new(&[""], &["persistentvolumes"], &["list", "watch"]),
    // nodes.rs `NodeWatcher::new` (--enable-node-watcher): the nodes and
    // the view of pods on a node using claims.
    Rule::new(&[""], &["nodes", "pods"], &["list", "watch"]),
    // list: monitor.rs `recall`, its own past events once when it leads (no
    // watch). create, patch: k8s/events.rs `write`.
    Rule::new(&[""], &["events"], &["list", "create", "patch"]),
];

/// Rules the chart adds while a value of the module's block is true: the
/// status form (`status_api.rs`, CSI 1.13 and Kubernetes 1.37+) patches
/// claims' status instead of writing events.
pub const VALUE_RULES: &[(&str, Rule)] =
    &[("patchClaimStatus", Rule::new(&[""], &["persistentvolumeclaims/status"], &["patch"]))];

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<HealthMonitorFlags, String> {
        HealthMonitorFlags::from_args(&["health-monitor"], args).map_err(|e| e.output)
    }

    #[test]
    fn defaults_are_upstreams() {
        let f = parse(&[]).unwrap();
        assert_eq!(f.monitor_interval, secs(60));
        assert_eq!(f.list_volumes_interval, secs(300));
        assert_eq!(f.volume_list_add_interval, secs(300));
        assert_eq!(f.node_list_add_interval, secs(300));
        assert_eq!(f.worker_threads, 10);
        assert!(!f.enable_node_watcher);
        assert_eq!(f.timeout, secs(15));
        assert_eq!(f.resync, secs(600));
        assert!(f.validate().is_ok());
    }

    #[test]
    fn flags_parse_and_bad_values_are_refused() {
        let f = parse(&["--monitor-interval", "5s", "--enable-node-watcher", "--worker-threads", "3"]).unwrap();
        assert_eq!((f.monitor_interval, f.enable_node_watcher, f.worker_threads), (secs(5), true, 3));
        assert_eq!(parse(&["--worker-threads", "0"]).unwrap().validate().unwrap_err(), upstream::ERR_WORKER_THREADS);
        assert!(parse(&["--timeout", "0s"]).unwrap().validate().unwrap_err().contains("--timeout"));
        assert!(parse(&["--monitor-interval", "soon"]).is_err());
    }
}
