//! What a claim or volume of the provisioner waits for (pure): the
//! `waiting_for` of `/debug/objects`, from the decisions and errors of the
//! claim and volume paths.

use super::{
    decide::{ClaimDecision, CreateFailure, PlanError},
    sources,
};
use crate::{debug::WaitingFor, k8s::snapshot_api::VolumeSnapshot};

impl ClaimDecision {
    /// What a claim so decided waits for (`None`: nothing of this
    /// provisioner's: not ours, done, or to be provisioned now).
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        match self {
            ClaimDecision::WaitForScheduler => Some(WaitingFor::Scheduler),
            ClaimDecision::Ignore(_) | ClaimDecision::Provision => None,
        }
    }
}

/// What a claim waits for after a failed CreateVolume of `class` with
/// `code`.
pub fn create_failure_waiting(class: CreateFailure, code: tonic::Code) -> WaitingFor {
    match class {
        CreateFailure::Reschedule => WaitingFor::Scheduler,
        CreateFailure::Final if code == tonic::Code::InvalidArgument => WaitingFor::Infeasible,
        CreateFailure::Final | CreateFailure::InBackground => WaitingFor::Driver,
    }
}

impl PlanError {
    /// What a claim whose plan failed so waits for: the data source's
    /// readiness or the source itself as its check said; an invalid claim
    /// (or a failed read of its grants or class) its next attempt.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            PlanError::Param(_) | PlanError::Strip(_) | PlanError::Selector => WaitingFor::Class,
            PlanError::Capability(_) => WaitingFor::Driver,
            PlanError::ExternalPopulator(_) => WaitingFor::Populator,
            PlanError::Source { waiting_for, .. } => *waiting_for,
            PlanError::Invalid(_) => WaitingFor::Retry,
        }
    }
}

/// What a claim restoring `snapshot` waits for when the snapshot cannot be
/// used yet: its readiness while it is not ready, else the source itself.
pub fn snapshot_source_waiting(snapshot: &VolumeSnapshot) -> WaitingFor {
    let ready = snapshot.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    if ready && sources::bound_content_name(snapshot).is_some() {
        WaitingFor::DataSource
    } else {
        WaitingFor::SnapshotReady
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::snapshot_api::VolumeSnapshotStatus;

    #[test]
    fn what_a_claim_waits_for() {
        assert_eq!(ClaimDecision::WaitForScheduler.waiting_for(), Some(WaitingFor::Scheduler));
        assert_eq!(ClaimDecision::Provision.waiting_for(), None);
        assert_eq!(ClaimDecision::Ignore("bound").waiting_for(), None);
        let code = tonic::Code::InvalidArgument;
        let cases = [
            (CreateFailure::Final, code, WaitingFor::Infeasible),
            (CreateFailure::Final, tonic::Code::ResourceExhausted, WaitingFor::Driver),
            (CreateFailure::InBackground, tonic::Code::DeadlineExceeded, WaitingFor::Driver),
            (CreateFailure::Reschedule, tonic::Code::ResourceExhausted, WaitingFor::Scheduler),
        ];
        for (class, code, want) in cases {
            assert_eq!(create_failure_waiting(class, code), want, "{class:?} {code:?}");
        }
        assert_eq!(PlanError::Selector.waiting_for(), WaitingFor::Class);
        assert_eq!(PlanError::Capability("no".into()).waiting_for(), WaitingFor::Driver);
        assert_eq!(PlanError::Invalid("selector".into()).waiting_for(), WaitingFor::Retry);
        let unready = PlanError::Source { waiting_for: WaitingFor::SnapshotReady, message: "not ready".into() };
        assert_eq!(unready.waiting_for(), WaitingFor::SnapshotReady);
        // A normal wait, told apart from a data source that cannot be used
        // (the long-wait alert leaves it out).
        assert_eq!(PlanError::ExternalPopulator("Backup".into()).waiting_for(), WaitingFor::Populator);
    }

    #[test]
    fn a_restore_waits_for_the_snapshot_until_it_is_ready_and_bound() {
        let snap = |ready: Option<bool>, bound: Option<&str>| VolumeSnapshot {
            status: Some(VolumeSnapshotStatus {
                ready_to_use: ready,
                bound_volume_snapshot_content_name: bound.map(str::to_string),
                ..VolumeSnapshotStatus::default()
            }),
            ..VolumeSnapshot::default()
        };
        assert_eq!(snapshot_source_waiting(&snap(None, None)), WaitingFor::SnapshotReady);
        assert_eq!(snapshot_source_waiting(&snap(Some(false), Some("c"))), WaitingFor::SnapshotReady);
        assert_eq!(snapshot_source_waiting(&snap(Some(true), None)), WaitingFor::SnapshotReady);
        assert_eq!(snapshot_source_waiting(&snap(Some(true), Some("c"))), WaitingFor::DataSource);
    }
}
