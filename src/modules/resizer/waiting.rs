//! What a claim of the resizer waits for (pure): the `waiting_for` of
//! `/debug/objects`, from the resize and modify decisions and from where an
//! expansion or modification stopped.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::decide::{Failure, InputError, ModifyFailed, ModifyStep, Step, classify, vac_names};
use crate::debug::WaitingFor;

impl InputError {
    /// Sizes that do not parse, or a PV the request cannot be built from
    /// (no handle, access modes CSI cannot express): the claim or its PV
    /// must change first.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            InputError::Quantity { .. } | InputError::EmptyHandle | InputError::AccessModes(_) => WaitingFor::Dependent,
        }
    }
}

impl Step {
    /// What a claim so planned waits for (`None`: nothing of the
    /// controller's, or it expands now).
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        match self {
            Step::HeldBack => Some(WaitingFor::Infeasible),
            Step::Skip | Step::Expand { .. } => None,
        }
    }
}

/// Where an expansion stopped, before or at the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpandStop {
    /// The PV cannot be put into the request: its translation, volume
    /// handle or access modes.
    Volume,
    /// The controller-expand secret the PV names cannot be read.
    Secret,
    /// `ControllerExpandVolume` failed with this code.
    Call(tonic::Code),
    /// The driver's answer is unusable (a capacity below the request).
    Answer,
}

impl ExpandStop {
    /// The gRPC code, when the driver answered with one.
    pub fn code(self) -> Option<tonic::Code> {
        match self {
            ExpandStop::Call(code) => Some(code),
            ExpandStop::Volume | ExpandStop::Secret | ExpandStop::Answer => None,
        }
    }

    /// What the claim waits for after stopping here. `in_use_tracked`:
    /// the pods using claims are watched (an offline-only driver with
    /// `--handle-volume-inuse-error`), so FailedPrecondition means the
    /// volume is in use.
    pub fn waiting_for(self, in_use_tracked: bool) -> WaitingFor {
        match self {
            ExpandStop::Volume => WaitingFor::Dependent,
            ExpandStop::Secret => WaitingFor::Secret,
            ExpandStop::Answer => WaitingFor::Driver,
            ExpandStop::Call(tonic::Code::FailedPrecondition) if in_use_tracked => WaitingFor::VolumeInUse,
            ExpandStop::Call(code) if classify(Some(code)) == Failure::Infeasible => WaitingFor::Infeasible,
            ExpandStop::Call(_) => WaitingFor::Driver,
        }
    }
}

impl ModifyStep {
    /// What a claim so planned waits for (`None`: nothing, or it is
    /// modified, rolled back or resumed now).
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        match self {
            ModifyStep::HeldBack => Some(WaitingFor::Infeasible),
            ModifyStep::Nothing
            | ModifyStep::Rollback { .. }
            | ModifyStep::Resume { .. }
            | ModifyStep::Start { .. } => None,
        }
    }
}

impl ModifyFailed {
    /// What a claim whose `ControllerModifyVolume` failed so waits for:
    /// an infeasible class is held back until the user picks another.
    pub fn waiting_for(&self) -> WaitingFor {
        if self.hold_back { WaitingFor::Infeasible } else { WaitingFor::Driver }
    }
}

/// A claim whose PV is not among the driver's cached ones, in the modify
/// controller: it waits for the PV (whose arrival queues it again) when it
/// is `annotated` for the driver and asks for a class it does not have.
pub fn modify_without_volume(pvc: &PersistentVolumeClaim, annotated: bool) -> Option<WaitingFor> {
    let (spec, current, _) = vac_names(pvc);
    (annotated && !spec.is_empty() && spec != current).then_some(WaitingFor::Dependent)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PersistentVolumeClaimStatus};

    use super::*;

    #[test]
    fn what_a_resize_waits_for() {
        use tonic::Code;
        let table = [
            (ExpandStop::Volume, false, WaitingFor::Dependent),
            (ExpandStop::Secret, false, WaitingFor::Secret),
            (ExpandStop::Answer, false, WaitingFor::Driver),
            (ExpandStop::Call(Code::Internal), false, WaitingFor::Driver),
            (ExpandStop::Call(Code::DeadlineExceeded), true, WaitingFor::Driver),
            (ExpandStop::Call(Code::OutOfRange), false, WaitingFor::Infeasible),
            (ExpandStop::Call(Code::InvalidArgument), true, WaitingFor::Infeasible),
            (ExpandStop::Call(Code::FailedPrecondition), true, WaitingFor::VolumeInUse),
            (ExpandStop::Call(Code::FailedPrecondition), false, WaitingFor::Driver),
        ];
        for (stop, in_use_tracked, want) in table {
            assert_eq!(stop.waiting_for(in_use_tracked), want, "{stop:?} (pods watched: {in_use_tracked})");
        }
        assert_eq!(ExpandStop::Call(Code::Internal).code(), Some(Code::Internal));
        assert_eq!(ExpandStop::Secret.code(), None, "never sent: no code (an uncertain failure)");
        assert_eq!(Step::HeldBack.waiting_for(), Some(WaitingFor::Infeasible));
        assert_eq!(Step::Skip.waiting_for(), None);
        assert_eq!(Step::Expand { target: 1, update_status: true }.waiting_for(), None);
        assert_eq!(InputError::EmptyHandle.waiting_for(), WaitingFor::Dependent);
    }

    #[test]
    fn what_a_modification_waits_for() {
        use tonic::Code;
        assert_eq!(ModifyStep::HeldBack.waiting_for(), Some(WaitingFor::Infeasible));
        assert_eq!(ModifyStep::Start { target: "gold".into() }.waiting_for(), None);
        assert_eq!(ModifyStep::Nothing.waiting_for(), None);
        let failed = |code| crate::modules::resizer::decide::modify_failed(code).waiting_for();
        assert_eq!(failed(Code::InvalidArgument), WaitingFor::Infeasible);
        assert_eq!(failed(Code::Internal), WaitingFor::Driver);
        assert_eq!(failed(Code::DeadlineExceeded), WaitingFor::Driver);
        let claim = |spec: Option<&str>, current: Option<&str>| PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                volume_attributes_class_name: spec.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                current_volume_attributes_class_name: current.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let table = [
            (Some("gold"), None, true, Some(WaitingFor::Dependent)),
            (Some("gold"), Some("silver"), true, Some(WaitingFor::Dependent)),
            (Some("gold"), Some("gold"), true, None),
            (None, Some("gold"), true, None),
            (Some("gold"), None, false, None),
        ];
        for (spec, current, annotated, want) in table {
            assert_eq!(
                modify_without_volume(&claim(spec, current), annotated),
                want,
                "{spec:?} {current:?} {annotated}"
            );
        }
    }
}
