//! The control-plane world: a real etcd, kube-apiserver and
//! kube-controller-manager (`ControlPlane::shared`, one per test module), the
//! CSI mock driver or the fault driver, and csi-sidecar's controllers.
//!
//! One binary per world; integration/scripts/run-tests.py runs each module in
//! a process of its own (`<binary> --exact <its tests>`).

mod attacher;
mod attacher_fairness;
mod attacher_faults;
mod capacity;
mod churn_soak;
mod cluster;
mod combined;
mod dropin_runtime;
mod explain;
mod health_monitor;
mod leader_election;
mod lists;
mod migration;
mod monitoring_scrape;
mod provisioner;
mod provisioner_faults;
mod provisioner_sources;
mod provisioner_vac;
mod rbac;
mod resizer;
mod resizer_faults;
mod rollout;
mod runtime_writes;
mod shutdown;
