//! The group snapshot decisions, free of I/O (upstream's
//! `groupsnapshot_helper.go` rules): which VolumeGroupSnapshotContents are
//! the driver's, what one needs now, the CreateVolumeGroupSnapshot request
//! (name, parameters), the Get and Delete requests' member IDs, the status
//! after an answer, the error-status and annotation patches, the secret
//! references, and which updates need a sync. Every rule is a row in
//! `group_decide/tests.rs`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::decide::{self, Naming, SecretKeys, SnapError, go_quote};
pub use super::decide::{being_created_patch, error_patch, should_enqueue, status_patch};
use crate::{
    compat::snapshotter as upstream,
    csi::proto::csi::v1 as csi,
    k8s::{
        group_snapshot_api::{
            VolumeGroupSnapshotClass, VolumeGroupSnapshotContent, VolumeGroupSnapshotContentStatus, VolumeSnapshotInfo,
        },
        snapshot_api::SnapshotError,
    },
};

/// Why a group content cannot be snapshotted, checked or deleted:
/// upstream's texts (they reach `status.error` and the events).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// A dynamic group content without a class.
    #[error("failed to take group snapshot {0} without a group snapshot class")]
    NoClass(String),
    /// The named class is not in the cache (client-go's NotFound text).
    #[error("volumegroupsnapshotclass.groupsnapshot.storage.k8s.io {} not found", go_quote(.0))]
    ClassNotFound(String),
    /// One of the group deletion-secret annotations is empty.
    #[error("cannot retrieve secrets for group snapshot content {}, err: secret name or namespace not specified", go_quote(.0))]
    SecretIncomplete(String),
    /// The group secret could not be read.
    #[error("cannot get credentials for group snapshot content {}", go_quote(.0))]
    Credentials(String),
    /// Wraps the input errors above.
    #[error("failed to get input parameters to create group snapshot for group snapshot content {content}: {}", go_quote(&.source.to_string()))]
    CreateInput {
        /// The group content.
        content: String,
        /// What failed.
        source: Box<GroupError>,
    },
    /// A reserved class parameter that is not a secret key.
    #[error("{0}")]
    Parameters(SnapError),
    /// CreateVolumeGroupSnapshot failed (or could not be sent); `volumes`
    /// is Go's `%s` of the handle list (`[a b]`).
    #[error("failed to take group snapshot of the volumes {volumes}: {}", go_quote(.error))]
    Take {
        /// `[a b c]`.
        volumes: String,
        /// The gRPC error text (or ours).
        error: String,
    },
    /// `spec.volumeGroupSnapshotRef.uid` is empty.
    #[error("cannot create group snapshot. Group snapshot content {0} not bound to a group snapshot")]
    NotBound(String),
    /// No volume handles.
    #[error("cannot create group snapshot. PVCs to be snapshotted not found in group snapshot content {0}")]
    NoVolumes(String),
    /// The driver answered without a group snapshot (upstream would crash).
    #[error("CreateVolumeGroupSnapshot answered without a group snapshot or group_snapshot_id")]
    EmptyAnswer,
    /// The being-created annotation could not be written.
    #[error("failed to add VolumeGroupSnapshotBeingCreated annotation on the group snapshot content {content}: {}", go_quote(.error))]
    AddAnnotation {
        /// The group content.
        content: String,
        /// The API error.
        error: String,
    },
    /// The being-created annotation could not be removed.
    #[error("failed to remove VolumeGroupSnapshotBeingCreated annotation on the groupSnapshotContent {content}: {}", go_quote(.error))]
    RemoveAnnotation {
        /// The group content.
        content: String,
        /// The API error.
        error: String,
    },
    /// The status could not be written.
    #[error("error updating status for volume group snapshot content {content}: {error}")]
    Status {
        /// The group content.
        content: String,
        /// The API error.
        error: String,
    },
    /// A pre-provisioned group content's class is missing.
    #[error("failed to get group snapshot class {class} for group snapshot content {content}: {error}")]
    CheckClass {
        /// The class.
        class: String,
        /// The group content.
        content: String,
        /// Why.
        error: String,
    },
    /// The get secret's parameters are wrong.
    #[error("failed to get secret reference for group snapshot content {content}: {error}")]
    SecretRef {
        /// The group content.
        content: String,
        /// Why.
        error: String,
    },
    /// The get secret could not be read.
    #[error("failed to get credentials for group snapshot content {content}: {error}")]
    GetCredentials {
        /// The group content.
        content: String,
        /// Why.
        error: String,
    },
    /// No member snapshot IDs to ask about.
    #[error("cannot list group snapshot {0}. No snapshots found in the group snapshot content")]
    NoMembersToGet(String),
    /// GetVolumeGroupSnapshot failed.
    #[error("failed to list group snapshot for group snapshot content {content}: {}", go_quote(.error))]
    Get {
        /// The group content.
        content: String,
        /// The gRPC error text.
        error: String,
    },
    /// No member snapshot IDs to delete.
    #[error("cannot delete group snapshot content {0}. No snapshots found in the group snapshot")]
    NoMembersToDelete(String),
}

fn annotation<'a>(c: &'a VolumeGroupSnapshotContent, key: &str) -> Option<&'a str> {
    c.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// Whether `c` carries annotation `key`.
pub fn has_annotation(c: &VolumeGroupSnapshotContent, key: &str) -> bool {
    annotation(c, key).is_some()
}

fn name(c: &VolumeGroupSnapshotContent) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

/// Whether the sidecar serves this group content (upstream's
/// `isDriverMatch`): a source (volume handles or group handles), the
/// driver's name, and its class, if cached, of the driver too.
pub fn is_ours(c: &VolumeGroupSnapshotContent, driver: &str, class: Option<&VolumeGroupSnapshotClass>) -> bool {
    (c.spec.source.group_snapshot_handles.is_some() || !c.spec.source.volume_handles.is_empty())
        && c.spec.driver == driver
        && class.is_none_or(|cl| cl.driver == driver)
}

/// Whether the status says ready.
pub fn is_ready(c: &VolumeGroupSnapshotContent) -> bool {
    c.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
}

/// Upstream's `shouldDeleteGroupSnapshotContent`.
pub fn should_delete(c: &VolumeGroupSnapshotContent) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return false;
    }
    if c.spec.source.group_snapshot_handles.is_some()
        && c.spec.volume_group_snapshot_ref.uid.as_deref().is_none_or(str::is_empty)
    {
        return true;
    }
    !has_annotation(c, upstream::ANN_GROUP_BEING_CREATED) && has_annotation(c, upstream::ANN_GROUP_BEING_DELETED)
}

/// What a group content needs now (upstream's `syncGroupSnapshotContent`
/// order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupStep {
    /// Deletion: with `Some(group id)` (policy Delete and a handle in the
    /// status) DeleteVolumeGroupSnapshot first, then the finalizer goes.
    Delete {
        /// The backend group snapshot to delete.
        group_id: Option<String>,
    },
    /// CreateVolumeGroupSnapshot (idempotent by name); `first`: no status
    /// yet (it picks the failure event's reason). Upstream polls a dynamic
    /// group content that is not ready by calling create again.
    Create {
        /// No status yet.
        first: bool,
    },
    /// Ready: only the being-created annotation may need to go.
    Ready {
        /// The annotation is still there.
        remove_annotation: bool,
    },
    /// A pre-provisioned group content: GetVolumeGroupSnapshot.
    Check,
}

/// What `c` needs now.
pub fn step(c: &VolumeGroupSnapshotContent) -> GroupStep {
    let status = c.status.as_ref();
    if should_delete(c) {
        let group_id = (c.spec.deletion_policy == upstream::POLICY_DELETE)
            .then(|| status.and_then(|s| s.volume_group_snapshot_handle.clone()))
            .flatten();
        return GroupStep::Delete { group_id };
    }
    if !c.spec.source.volume_handles.is_empty() && status.is_none() {
        return GroupStep::Create { first: true };
    }
    if is_ready(c) {
        return GroupStep::Ready { remove_annotation: has_annotation(c, upstream::ANN_GROUP_BEING_CREATED) };
    }
    if c.spec.source.group_snapshot_handles.is_some() {
        return GroupStep::Check;
    }
    GroupStep::Create { first: false }
}

/// The member snapshot IDs DeleteVolumeGroupSnapshot gets: those of the
/// status's info list, else (with a status) the pre-provisioned handles.
/// Err when there are none (upstream refuses to call then).
pub fn delete_snapshot_ids(c: &VolumeGroupSnapshotContent) -> Result<Vec<String>, GroupError> {
    let ids = match &c.status {
        Some(s) if !s.volume_snapshot_info_list.is_empty() => {
            s.volume_snapshot_info_list.iter().map(|i| i.snapshot_handle.clone()).collect()
        }
        Some(_) => {
            c.spec.source.group_snapshot_handles.as_ref().map(|h| h.volume_snapshot_handles.clone()).unwrap_or_default()
        }
        None => Vec::new(),
    };
    if ids.is_empty() {
        return Err(GroupError::NoMembersToDelete(name(c)));
    }
    Ok(ids)
}

/// The group handle of a pre-provisioned content and the member IDs
/// GetVolumeGroupSnapshot gets.
pub fn get_request_ids(c: &VolumeGroupSnapshotContent) -> Result<(String, Vec<String>), GroupError> {
    let handles = c.spec.source.group_snapshot_handles.as_ref();
    let ids = handles.map(|h| h.volume_snapshot_handles.clone()).unwrap_or_default();
    if ids.is_empty() {
        return Err(GroupError::NoMembersToGet(name(c)));
    }
    let group = c
        .status
        .as_ref()
        .and_then(|s| s.volume_group_snapshot_handle.clone())
        .or_else(|| handles.map(|h| h.volume_group_snapshot_handle.clone()))
        .unwrap_or_default();
    Ok((group, ids))
}

/// The secret of CreateVolumeGroupSnapshot and DeleteVolumeGroupSnapshot,
/// from the group content's deletion-secret annotations (written by
/// snapshot-controller from the class's `group-snapshotter-secret-*`):
/// `None` unless both are present; one empty is an error.
pub fn deletion_secret_ref(c: &VolumeGroupSnapshotContent) -> Result<Option<(String, String)>, GroupError> {
    match (
        annotation(c, upstream::ANN_GROUP_DELETION_SECRET_NAME),
        annotation(c, upstream::ANN_GROUP_DELETION_SECRET_NAMESPACE),
    ) {
        (Some(n), Some(ns)) if n.is_empty() || ns.is_empty() => Err(GroupError::SecretIncomplete(name(c))),
        (Some(n), Some(ns)) => Ok(Some((n.to_string(), ns.to_string()))),
        _ => Ok(None),
    }
}

/// The GetVolumeGroupSnapshot secret from the class parameters
/// `csi.storage.k8s.io/group-snapshotter-get-secret-{name,namespace}`.
pub fn get_secret_ref(
    params: Option<&BTreeMap<String, String>>,
    content: &str,
) -> Result<Option<(String, String)>, String> {
    let keys = SecretKeys {
        label: "GroupSnapshotterGet",
        name: upstream::PARAM_GROUP_GET_SECRET_NAME,
        namespace: upstream::PARAM_GROUP_GET_SECRET_NAMESPACE,
    };
    let tokens = [(upstream::TOKEN_GROUP_CONTENT_NAME, content)];
    decide::class_secret_ref(params, &keys, &tokens, &tokens)
}

/// Go's `%s` of a string slice: `[a b c]`.
pub fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// The CreateVolumeGroupSnapshot request for a dynamic group content,
/// without secrets. Everything is checked before anything is written (as
/// the snapshotter does for single contents).
pub fn create_request(
    c: &VolumeGroupSnapshotContent,
    class: Option<&VolumeGroupSnapshotClass>,
    naming: &Naming,
) -> Result<csi::CreateVolumeGroupSnapshotRequest, GroupError> {
    let content = name(c);
    let input = |e: GroupError| GroupError::CreateInput { content: content.clone(), source: Box::new(e) };
    let class = match (&c.spec.volume_group_snapshot_class_name, class) {
        (None, _) => return Err(input(GroupError::NoClass(content.clone()))),
        (Some(n), None) => return Err(input(GroupError::ClassNotFound(n.clone()))),
        (Some(_), Some(cl)) => cl,
    };
    deletion_secret_ref(c).map_err(input)?;
    let mut parameters = decide::strip_reserved(class.parameters.as_ref()).map_err(GroupError::Parameters)?;
    if naming.extra_metadata {
        let r = &c.spec.volume_group_snapshot_ref;
        parameters.insert(upstream::PARAM_GROUP_SNAPSHOT_NAME.into(), r.name.clone().unwrap_or_default());
        parameters.insert(upstream::PARAM_GROUP_SNAPSHOT_NAMESPACE.into(), r.namespace.clone().unwrap_or_default());
        parameters.insert(upstream::PARAM_GROUP_CONTENT_NAME.into(), content.clone());
    }
    let volumes = go_list(&c.spec.source.volume_handles);
    let take = |e: GroupError| GroupError::Take { volumes: volumes.clone(), error: e.to_string() };
    let uid = c.spec.volume_group_snapshot_ref.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(take(GroupError::NotBound(content)));
    }
    if c.spec.source.volume_handles.is_empty() {
        return Err(take(GroupError::NoVolumes(content)));
    }
    Ok(csi::CreateVolumeGroupSnapshotRequest {
        name: decide::snapshot_name(&naming.prefix, uid, naming.uuid_length),
        source_volume_ids: c.spec.source.volume_handles.clone(),
        secrets: HashMap::new(),
        parameters,
    })
}

/// What the driver said about a group snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupObserved {
    /// `group_snapshot_id`.
    pub handle: String,
    /// `ready_to_use`.
    pub ready: bool,
    /// The creation time (now when the driver sent none).
    pub created: Timestamp,
    /// The members (empty for a GetVolumeGroupSnapshot check, as upstream).
    pub members: Vec<VolumeSnapshotInfo>,
}

fn timestamp(ts: Option<&prost_types::Timestamp>, now: Timestamp) -> Timestamp {
    match ts {
        Some(t) if t.seconds != 0 || t.nanos != 0 => Timestamp::new(t.seconds, t.nanos).unwrap_or(now),
        _ => now,
    }
}

/// One member as the status lists it: creation time in nanoseconds (none
/// when the driver sent none), the size only when positive.
pub fn member_info(s: &csi::Snapshot) -> VolumeSnapshotInfo {
    VolumeSnapshotInfo {
        volume_handle: s.source_volume_id.clone(),
        snapshot_handle: s.snapshot_id.clone(),
        creation_time: s
            .creation_time
            .as_ref()
            .map(|t| t.seconds.saturating_mul(1_000_000_000).saturating_add(i64::from(t.nanos))),
        ready_to_use: Some(s.ready_to_use),
        restore_size: (s.size_bytes > 0).then_some(s.size_bytes),
    }
}

/// What a group snapshot answer means; Err when it is nonsense. With
/// `members == false` (a Get check) the member list is not taken, as
/// upstream.
pub fn observe(
    g: Option<&csi::VolumeGroupSnapshot>,
    members: bool,
    fallback_id: &str,
    now: Timestamp,
) -> Result<GroupObserved, GroupError> {
    let g = g.ok_or(GroupError::EmptyAnswer)?;
    let handle = if members { g.group_snapshot_id.clone() } else { fallback_id.to_string() };
    if handle.is_empty() {
        return Err(GroupError::EmptyAnswer);
    }
    Ok(GroupObserved {
        handle,
        ready: g.ready_to_use,
        created: timestamp(g.creation_time.as_ref(), now),
        members: if members { g.snapshots.iter().map(member_info).collect() } else { Vec::new() },
    })
}

/// The status after an observation (upstream's
/// `updateGroupSnapshotContentStatus`): a new one when there was none;
/// else unset fields filled, `readyToUse` overwritten when different
/// (clearing the error when it becomes true), the member list filled when
/// empty. `None`: nothing changed.
pub fn status_update(
    current: Option<&VolumeGroupSnapshotContentStatus>,
    o: &GroupObserved,
) -> Option<VolumeGroupSnapshotContentStatus> {
    let Some(cur) = current else {
        return Some(VolumeGroupSnapshotContentStatus {
            volume_group_snapshot_handle: Some(o.handle.clone()),
            ready_to_use: Some(o.ready),
            creation_time: Some(Time(o.created)),
            error: None,
            volume_snapshot_info_list: o.members.clone(),
        });
    };
    let mut s = cur.clone();
    let members = s.volume_snapshot_info_list.is_empty() && !o.members.is_empty();
    if members {
        s.volume_snapshot_info_list = o.members.clone();
    }
    let changed = [
        decide::fill(&mut s.volume_group_snapshot_handle, Some(o.handle.clone())),
        decide::set_ready(&mut s.ready_to_use, &mut s.error, o.ready),
        decide::fill(&mut s.creation_time, Some(Time(o.created))),
        members,
    ];
    changed.contains(&true).then_some(s)
}

impl decide::ContentStatus for VolumeGroupSnapshotContentStatus {
    fn error(&self) -> Option<&SnapshotError> {
        self.error.as_ref()
    }
    fn failed(error: SnapshotError) -> Self {
        Self { ready_to_use: Some(false), error: Some(error), ..Default::default() }
    }
}

/// The status after DeleteVolumeGroupSnapshot: handle, readiness, time and
/// error cleared (the member list stays, as upstream).
pub fn cleared_status(current: Option<&VolumeGroupSnapshotContentStatus>) -> VolumeGroupSnapshotContentStatus {
    VolumeGroupSnapshotContentStatus {
        volume_group_snapshot_handle: None,
        ready_to_use: None,
        creation_time: None,
        error: None,
        ..current.cloned().unwrap_or_default()
    }
}

impl decide::Content for VolumeGroupSnapshotContent {
    type Status = VolumeGroupSnapshotContentStatus;
    const BEING_CREATED: &'static str = upstream::ANN_GROUP_BEING_CREATED;
    fn status(&self) -> Option<&VolumeGroupSnapshotContentStatus> {
        self.status.as_ref()
    }
    fn is_ready(&self) -> bool {
        is_ready(self)
    }
    fn clear_status(&mut self) {
        self.status = None;
    }
}

/// The JSON patch removing the group being-created annotation.
pub fn remove_being_created_patch() -> serde_json::Value {
    decide::remove_annotation_patch(upstream::ANN_GROUP_BEING_CREATED)
}

/// Whether a CreateVolumeGroupSnapshot error is final (the same codes as
/// CreateSnapshot's).
pub fn is_final(code: Option<tonic::Code>) -> bool {
    decide::is_final(code)
}

#[cfg(test)]
mod tests;
