//! What a VolumeSnapshotContent or VolumeGroupSnapshotContent of the
//! snapshotter waits for (pure): the `waiting_for` of `/debug/objects`,
//! from the step decided, the errors of the create, check and delete
//! paths, and the readiness after a create or check.

use super::{
    decide::{Content, SnapError, Step},
    group_decide::GroupError,
};
use crate::{
    debug::WaitingFor,
    k8s::{group_snapshot_api::VolumeGroupSnapshotContent, snapshot_api::VolumeSnapshotContent},
};

impl SnapError {
    /// What a content that failed so waits for.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            SnapError::NoClass(_)
            | SnapError::ClassNotFound(_)
            | SnapError::UnknownReserved(_)
            | SnapError::CheckClass { .. }
            | SnapError::ListSecretRef { .. } => WaitingFor::Class,
            SnapError::SecretIncomplete(_) | SnapError::Credentials(_) | SnapError::ListCredentials { .. } => {
                WaitingFor::Secret
            }
            SnapError::CreateInput { source, .. } | SnapError::MemberCredentials { source, .. } => source.waiting_for(),
            SnapError::NotBound(_) => WaitingFor::Dependent,
            SnapError::Take { .. } | SnapError::EmptyAnswer | SnapError::List { .. } => WaitingFor::Driver,
            SnapError::AddAnnotation { .. } | SnapError::RemoveAnnotation { .. } | SnapError::Status { .. } => {
                WaitingFor::ApiServer
            }
        }
    }
}

/// What a content whose create failed with `e` waits for: a content not
/// bound to a snapshot yet (refused before any call, in upstream's
/// "failed to take snapshot" words) waits for snapshot-controller to bind
/// it; otherwise what the error says.
pub fn create_waiting(c: &VolumeSnapshotContent, e: &SnapError) -> WaitingFor {
    let unbound = c.spec.volume_snapshot_ref.uid.as_deref().unwrap_or_default().is_empty();
    match e {
        SnapError::Take { .. } if unbound => WaitingFor::Dependent,
        e => e.waiting_for(),
    }
}

impl Step {
    /// What a content so stepped waits for before anything is done: a
    /// member of a dynamic group snapshot without its handle waits for the
    /// group's create.
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        match self {
            Step::Wait => Some(WaitingFor::Dependent),
            Step::Delete { .. } | Step::Create { .. } | Step::Ready { .. } | Step::Check { .. } => None,
        }
    }
}

impl GroupError {
    /// What a group content that failed so waits for.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            GroupError::NoClass(_)
            | GroupError::ClassNotFound(_)
            | GroupError::Parameters(_)
            | GroupError::CheckClass { .. }
            | GroupError::SecretRef { .. } => WaitingFor::Class,
            GroupError::SecretIncomplete(_) | GroupError::Credentials(_) | GroupError::GetCredentials { .. } => {
                WaitingFor::Secret
            }
            GroupError::CreateInput { source, .. } => source.waiting_for(),
            GroupError::NotBound(_)
            | GroupError::NoVolumes(_)
            | GroupError::NoMembersToGet(_)
            | GroupError::NoMembersToDelete(_) => WaitingFor::Dependent,
            GroupError::Take { .. } | GroupError::EmptyAnswer | GroupError::Get { .. } => WaitingFor::Driver,
            GroupError::AddAnnotation { .. } | GroupError::RemoveAnnotation { .. } | GroupError::Status { .. } => {
                WaitingFor::ApiServer
            }
        }
    }
}

/// What a group content whose create failed with `e` waits for: one not
/// bound to a group snapshot, or without volumes (refused before any call)
/// waits for snapshot-controller; otherwise what the error says.
pub fn group_create_waiting(c: &VolumeGroupSnapshotContent, e: &GroupError) -> WaitingFor {
    let unbound = c.spec.volume_group_snapshot_ref.uid.as_deref().unwrap_or_default().is_empty();
    match e {
        GroupError::Take { .. } if unbound || c.spec.source.volume_handles.is_empty() => WaitingFor::Dependent,
        e => e.waiting_for(),
    }
}

/// What a content (or group content) waits for after a create or check
/// that succeeded: its readiness while the driver says not ready (it is
/// polled); a ready one being deleted comes round again for its deletion
/// (a plain retry); a ready one is done (`None`).
pub fn after_answer<K: Content>(c: &K) -> Option<WaitingFor> {
    match (c.is_ready(), c.meta().deletion_timestamp.is_some()) {
        (true, false) => None,
        (true, true) => Some(WaitingFor::Retry),
        (false, _) => Some(WaitingFor::SnapshotReady),
    }
}

#[cfg(test)]
mod tests;
