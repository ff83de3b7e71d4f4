//! Leader election on a `coordination.k8s.io/v1` Lease, compatible with
//! client-go's `tools/leaderelection` as csi-lib-utils configures it: candidates
//! that run the upstream sidecars and candidates that run csi-sidecar can share
//! one Lease during a rolling upgrade.
//!
//! One round is: read the Lease → [`decide`] (pure, table-tested) → write it
//! with `replace`, whose body carries the `resourceVersion` read, so a 409
//! Conflict means another candidate wrote first and won the round; or `create`
//! it, where AlreadyExists means the same. A candidate retries every retry
//! period, jittered by up to 1.2 periods like client-go until it has seen a
//! holder; a standby then polls every 1 to 1.2 periods, and wakes just after
//! the holder's Lease would expire when that is sooner, so a killed leader is
//! replaced about one lease duration after its last renewal (client-go: up to
//! 2.2 periods later than that). The leader renews every retry period and
//! has lost when a renewal round has not succeeded within the renew deadline.
//! On shutdown the leader releases the Lease (empty holder, duration 1 s), so
//! a standby takes over at its next retry instead of after the lease duration.
//! Upstream only does that behind the `ReleaseLeaderElectionOnExit` gate;
//! here it is the default.
//!
//! Deviation, on the safe side: a leader that reads the Lease during a renewal
//! and finds another holder stops leading at once, where client-go keeps
//! retrying until its renew deadline.
//!
//! Layout: [`config`](LeaderElectionConfig) (what a candidate needs, errors),
//! `decide` (the pure round, table-tested), `elector` (the I/O loop) and
//! `tests` (the tables, and the loop against an in-memory apiserver).

mod config;
mod decide;
mod elector;

pub use config::{
    LeaderElectionConfig, LeaderError, LostReason, choose_namespace, default_identity, resolve_namespace,
};
pub use decide::{
    Decision, EXPIRY_MARGIN, Observed, STANDBY_JITTER_FACTOR, TakeOver, decide, holder_of, jittered, leader_health,
    observe, released, standby_jittered, standby_wait,
};
pub use elector::LeaderElector;

pub use crate::compat::sanitize_lease_name;

#[cfg(test)]
mod tests;
