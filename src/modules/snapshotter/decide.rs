//! The snapshotter's decisions, free of I/O: which contents are the
//! driver's, what a content needs now, the CreateSnapshot request (name,
//! parameters), the status and error-status patches, the deletion-secret
//! and list-secret references, final vs non-final codes, and which updates
//! need a sync (upstream's `ShouldEnqueueContentChange`). Every rule is a
//! row in `decide/tests.rs`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::Resource;
use serde::Serialize;

use crate::{
    compat::snapshotter as upstream,
    csi::proto::csi::v1 as csi,
    k8s::snapshot_api::{SnapshotError, VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentStatus},
};

pub use crate::k8s::secret_templates::go_quote;

/// Why a content cannot be snapshotted, checked or deleted: upstream's
/// error texts (they reach `status.error` and the events).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapError {
    /// A dynamic content without `spec.volumeSnapshotClassName`.
    #[error("failed to take snapshot {0} without a snapshot class")]
    NoClass(String),
    /// The named class is not in the cache (client-go's NotFound text).
    #[error("volumesnapshotclass.snapshot.storage.k8s.io {} not found", go_quote(.0))]
    ClassNotFound(String),
    /// One of the deletion-secret annotations is empty.
    #[error("cannot retrieve secrets for snapshot content {}, err: secret name or namespace not specified", go_quote(.0))]
    SecretIncomplete(String),
    /// The deletion secret could not be read.
    #[error("cannot get credentials for snapshot content {}", go_quote(.0))]
    Credentials(String),
    /// Wraps the input errors above for CreateSnapshot.
    #[error("failed to get input parameters to create snapshot for content {content}: {}", go_quote(&.source.to_string()))]
    CreateInput {
        /// The content.
        content: String,
        /// What failed.
        source: Box<SnapError>,
    },
    /// A class parameter in the reserved namespace that is not one of the
    /// eight known secret keys.
    #[error("failed to remove CSI Parameters of prefixed keys: found unknown parameter key \"{0}\" with reserved namespace {prefix}", prefix = upstream::PARAM_PREFIX)]
    UnknownReserved(String),
    /// `spec.volumeSnapshotRef.uid` is empty.
    #[error("cannot create snapshot. Snapshot content {0} not bound to a snapshot")]
    NotBound(String),
    /// CreateSnapshot failed (or could not be sent).
    #[error("failed to take snapshot of the volume {volume}: {}", go_quote(.error))]
    Take {
        /// `spec.source.volumeHandle`.
        volume: String,
        /// The gRPC error text (or ours).
        error: String,
    },
    /// The driver answered CreateSnapshot without a snapshot (upstream
    /// would crash on it).
    #[error("CreateSnapshot answered without a snapshot or snapshot_id")]
    EmptyAnswer,
    /// The being-created annotation could not be written.
    #[error("failed to add VolumeSnapshotBeingCreated annotation on the content {content}: {}", go_quote(.error))]
    AddAnnotation {
        /// The content.
        content: String,
        /// The API error.
        error: String,
    },
    /// The being-created annotation could not be removed.
    #[error("failed to remove VolumeSnapshotBeingCreated annotation on the content {content}: {}", go_quote(.error))]
    RemoveAnnotation {
        /// The content.
        content: String,
        /// The API error.
        error: String,
    },
    /// The status could not be written.
    #[error("error updating status for volume snapshot content {content}: {error}")]
    Status {
        /// The content.
        content: String,
        /// The API error.
        error: String,
    },
    /// A pre-provisioned content's class is missing.
    #[error("failed to get snapshot class {class} for snapshot content {content}: {error}")]
    CheckClass {
        /// The class.
        class: String,
        /// The content.
        content: String,
        /// Why.
        error: String,
    },
    /// The list secret's parameters are wrong.
    #[error("failed to get secret reference for snapshot content {content}: {error}")]
    ListSecretRef {
        /// The content.
        content: String,
        /// Why.
        error: String,
    },
    /// The list secret could not be read.
    #[error("failed to get credentials for snapshot content {content}: {error}")]
    ListCredentials {
        /// The content.
        content: String,
        /// Why.
        error: String,
    },
    /// A group member's deletion-secret annotations are wrong.
    #[error("failed to get credentials from annotation for snapshot content {content}: {}", .source)]
    MemberCredentials {
        /// The content.
        content: String,
        /// What failed.
        source: Box<SnapError>,
    },
    /// ListSnapshots failed, or found nothing.
    #[error("failed to list snapshot for content {content}: {}", go_quote(.error))]
    List {
        /// The content.
        content: String,
        /// The gRPC error text, or [`SnapError::not_found`].
        error: String,
    },
}

impl SnapError {
    /// The text of an empty ListSnapshots answer.
    pub fn not_found(snapshot_id: &str) -> String {
        format!("can not find snapshot for snapshotID {snapshot_id}")
    }
}

fn annotation<'a>(c: &'a VolumeSnapshotContent, key: &str) -> Option<&'a str> {
    c.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// Whether `c` carries annotation `key`.
pub fn has_annotation(c: &VolumeSnapshotContent, key: &str) -> bool {
    annotation(c, key).is_some()
}

/// Whether the content is one this sidecar serves (upstream's
/// `isDriverMatch`): it has a source, names the driver, and its class, if
/// cached, is the driver's too. `class` is the cached class named by
/// `spec.volumeSnapshotClassName`, if any.
pub fn is_ours(c: &VolumeSnapshotContent, driver: &str, class: Option<&VolumeSnapshotClass>) -> bool {
    (c.spec.source.volume_handle.is_some() || c.spec.source.snapshot_handle.is_some())
        && c.spec.driver == driver
        && class.is_none_or(|cl| cl.driver == driver)
}

/// With `--node-deployment`: whether the content is this node's
/// (label `snapshot.storage.kubernetes.io/managed-by=<node>`).
pub fn managed_by(c: &VolumeSnapshotContent, node: &str) -> bool {
    c.metadata.labels.as_ref().and_then(|l| l.get(upstream::LABEL_MANAGED_BY)).map(String::as_str) == Some(node)
}

/// Whether the status says ready.
pub fn is_ready(c: &VolumeSnapshotContent) -> bool {
    c.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
}

/// What a content needs now (upstream's `syncContent` order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Deletion: `DeleteSnapshot(snapshot_id)` first when set (policy
    /// Delete, a handle in the status, not a group member), then the
    /// finalizer goes.
    Delete {
        /// The backend snapshot to delete.
        snapshot_id: Option<String>,
    },
    /// CreateSnapshot (idempotent by name); `first`: no status yet, which
    /// picks the failure event's reason.
    Create {
        /// No status yet.
        first: bool,
    },
    /// Ready: nothing to do but make sure the being-created annotation is
    /// gone.
    Ready {
        /// The annotation is still there.
        remove_annotation: bool,
    },
    /// A pre-provisioned content (or a group member with handles): ask
    /// ListSnapshots about `snapshot_id`.
    Check {
        /// The snapshot asked about.
        snapshot_id: String,
        /// Credentials come from the deletion-secret annotations (a
        /// member of a group snapshot).
        group_member: bool,
    },
    /// A member of a dynamically created group snapshot without handles
    /// yet: nothing to do, polled.
    Wait,
}

/// Upstream's `shouldDelete`.
pub fn should_delete(c: &VolumeSnapshotContent) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return false;
    }
    if c.spec.source.snapshot_handle.is_some() && c.spec.volume_snapshot_ref.uid.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    !has_annotation(c, upstream::ANN_BEING_CREATED) && has_annotation(c, upstream::ANN_BEING_DELETED)
}

/// What `c` needs now.
pub fn step(c: &VolumeSnapshotContent) -> Step {
    let status = c.status.as_ref();
    if should_delete(c) {
        let snapshot_id = (c.spec.deletion_policy == upstream::POLICY_DELETE)
            .then(|| {
                status.filter(|s| s.volume_group_snapshot_handle.is_none()).and_then(|s| s.snapshot_handle.clone())
            })
            .flatten();
        return Step::Delete { snapshot_id };
    }
    let member = has_annotation(c, upstream::ANN_GROUP_SNAPSHOT_HANDLE);
    if c.spec.source.volume_handle.is_some() && status.is_none() && !member {
        return Step::Create { first: true };
    }
    if is_ready(c) {
        return Step::Ready { remove_annotation: has_annotation(c, upstream::ANN_BEING_CREATED) };
    }
    let member_handles =
        status.is_some_and(|s| s.volume_group_snapshot_handle.is_some() && s.snapshot_handle.is_some());
    if let Some(id) = c.spec.source.snapshot_handle.clone() {
        return Step::Check { snapshot_id: id, group_member: member_handles };
    }
    if member_handles && let Some(id) = status.and_then(|s| s.snapshot_handle.clone()) {
        return Step::Check { snapshot_id: id, group_member: true };
    }
    if !member {
        return Step::Create { first: false };
    }
    Step::Wait
}

/// The secret of CreateSnapshot and DeleteSnapshot, from the content's
/// deletion-secret annotations (written by snapshot-controller): `None`
/// unless both are present; both present with one empty is an error.
pub fn deletion_secret_ref(c: &VolumeSnapshotContent) -> Result<Option<(String, String)>, SnapError> {
    match (annotation(c, upstream::ANN_DELETION_SECRET_NAME), annotation(c, upstream::ANN_DELETION_SECRET_NAMESPACE)) {
        (Some(name), Some(ns)) if name.is_empty() || ns.is_empty() => Err(SnapError::SecretIncomplete(content_name(c))),
        (Some(name), Some(ns)) => Ok(Some((name.to_string(), ns.to_string()))),
        _ => Ok(None),
    }
}

fn content_name(c: &VolumeSnapshotContent) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

/// The ListSnapshots secret from the class parameters
/// `csi.storage.k8s.io/snapshotter-list-secret-{name,namespace}` (both or
/// neither); the templates may use `${volumesnapshotcontent.name}` only.
/// Err: upstream's text (wrapped by the caller).
pub fn list_secret_ref(
    params: Option<&BTreeMap<String, String>>,
    content: &str,
) -> Result<Option<(String, String)>, String> {
    let keys = SecretKeys {
        label: "SnapshotterList",
        name: upstream::PARAM_LIST_SECRET_NAME,
        namespace: upstream::PARAM_LIST_SECRET_NAMESPACE,
    };
    let tokens = [(upstream::TOKEN_CONTENT_NAME, content)];
    class_secret_ref(params, &keys, &tokens, &tokens)
}

pub use crate::k8s::secret_templates::{SecretKeys, class_secret_ref};

/// Class parameters without the eight reserved secret keys (upstream's
/// `RemovePrefixedParameters`); any other `csi.storage.k8s.io/` key is an
/// error.
pub fn strip_reserved(class_params: Option<&BTreeMap<String, String>>) -> Result<HashMap<String, String>, SnapError> {
    let mut out = HashMap::new();
    for (k, v) in class_params.into_iter().flatten() {
        if k.starts_with(upstream::PARAM_PREFIX) {
            if !upstream::RESERVED_SECRET_PARAMS.contains(&k.as_str()) {
                return Err(SnapError::UnknownReserved(k.clone()));
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// The class parameters CreateSnapshot gets: the eight reserved secret
/// keys dropped, any other `csi.storage.k8s.io/` key refused; with
/// `--extra-create-metadata` the snapshot's name and namespace and the
/// content's name added.
pub fn create_parameters(
    c: &VolumeSnapshotContent,
    class_params: Option<&BTreeMap<String, String>>,
    extra_metadata: bool,
) -> Result<HashMap<String, String>, SnapError> {
    let mut out = strip_reserved(class_params)?;
    if extra_metadata {
        let r = &c.spec.volume_snapshot_ref;
        out.insert(upstream::PARAM_SNAPSHOT_NAME.into(), r.name.clone().unwrap_or_default());
        out.insert(upstream::PARAM_SNAPSHOT_NAMESPACE.into(), r.namespace.clone().unwrap_or_default());
        out.insert(upstream::PARAM_CONTENT_NAME.into(), content_name(c));
    }
    Ok(out)
}

/// `<prefix>-<uid>`; with a uuid length `n >= 0`, `<prefix>-` and the
/// first `n` characters of the UID without dashes.
pub fn snapshot_name(prefix: &str, uid: &str, uuid_length: i64) -> String {
    match usize::try_from(uuid_length) {
        Err(_) => format!("{prefix}-{uid}"),
        Ok(n) => {
            let bare: String = uid.chars().filter(|c| *c != '-').collect();
            let cut: String = bare.chars().take(n).collect();
            format!("{prefix}-{cut}")
        }
    }
}

/// How snapshot names are made (from the flags).
#[derive(Clone, Debug)]
pub struct Naming {
    /// `--snapshot-name-prefix`.
    pub prefix: String,
    /// `--snapshot-name-uuid-length`.
    pub uuid_length: i64,
    /// `--extra-create-metadata`.
    pub extra_metadata: bool,
}

/// The CreateSnapshot request for a dynamic content, without secrets.
/// `class` is the cached class named by the content (`None`: not named or
/// not cached). Checked before anything is written, so a content that can
/// never be snapshotted does not get the being-created annotation (upstream
/// sets it first and then leaves it, which blocks the deletion).
pub fn create_request(
    c: &VolumeSnapshotContent,
    class: Option<&VolumeSnapshotClass>,
    naming: &Naming,
) -> Result<csi::CreateSnapshotRequest, SnapError> {
    let name = content_name(c);
    let class = match (&c.spec.volume_snapshot_class_name, class) {
        (None, _) => {
            return Err(SnapError::CreateInput { content: name.clone(), source: Box::new(SnapError::NoClass(name)) });
        }
        (Some(n), None) => {
            return Err(SnapError::CreateInput {
                content: name,
                source: Box::new(SnapError::ClassNotFound(n.clone())),
            });
        }
        (Some(_), Some(cl)) => cl,
    };
    deletion_secret_ref(c).map_err(|e| SnapError::CreateInput { content: name.clone(), source: Box::new(e) })?;
    let parameters = create_parameters(c, class.parameters.as_ref(), naming.extra_metadata)?;
    let volume = c.spec.source.volume_handle.clone().unwrap_or_default();
    let uid = c.spec.volume_snapshot_ref.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(SnapError::Take { volume, error: SnapError::NotBound(name).to_string() });
    }
    Ok(csi::CreateSnapshotRequest {
        source_volume_id: volume,
        name: snapshot_name(&naming.prefix, uid, naming.uuid_length),
        secrets: HashMap::new(),
        parameters,
        // Snapshot topology (alpha in CSI v1.13) is not requested.
        accessibility_requirements: None,
    })
}

/// Whether a CreateSnapshot error is final: the driver will not go on
/// creating the snapshot, so the being-created annotation may go. Timeouts,
/// Unavailable, ResourceExhausted, Aborted and Canceled are not; an error
/// without a gRPC code (never sent) is not either, like upstream.
pub fn is_final(code: Option<tonic::Code>) -> bool {
    use tonic::Code::*;
    match code {
        None => false,
        Some(Cancelled | DeadlineExceeded | Unavailable | ResourceExhausted | Aborted) => false,
        Some(_) => true,
    }
}

/// What the driver said about a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The snapshot id.
    pub handle: String,
    /// `ready_to_use`.
    pub ready: bool,
    /// Nanoseconds since the epoch.
    pub created_ns: i64,
    /// `size_bytes`.
    pub size: i64,
    /// `group_snapshot_id` (empty: none).
    pub group_id: String,
}

/// Nanoseconds of the driver's creation time; `now` when it sent none (or
/// the epoch: upstream means to use "now" for a missing time, but a nil
/// protobuf time converts to the epoch there and is written as 0).
pub fn creation_ns(ts: Option<&prost_types::Timestamp>, now: Timestamp) -> i64 {
    match ts {
        Some(t) if t.seconds != 0 || t.nanos != 0 => {
            t.seconds.saturating_mul(1_000_000_000).saturating_add(i64::from(t.nanos))
        }
        _ => i64::try_from(now.as_nanosecond()).unwrap_or(i64::MAX),
    }
}

/// What a snapshot answer means: the observation, or Err when the answer
/// is nonsense (no snapshot, no id).
pub fn observe(snapshot: Option<&csi::Snapshot>, now: Timestamp) -> Result<Observed, SnapError> {
    let s = snapshot.filter(|s| !s.snapshot_id.is_empty()).ok_or(SnapError::EmptyAnswer)?;
    Ok(Observed {
        handle: s.snapshot_id.clone(),
        ready: s.ready_to_use,
        created_ns: creation_ns(s.creation_time.as_ref(), now),
        size: s.size_bytes,
        group_id: s.group_snapshot_id.clone(),
    })
}

/// The status after an observation (upstream's
/// `updateSnapshotContentStatus`): a new status when there was none; else
/// only unset fields are filled, `readyToUse` is overwritten when it
/// differs (clearing the error when it becomes true). `None`: nothing
/// changed.
pub fn status_update(
    current: Option<&VolumeSnapshotContentStatus>,
    o: &Observed,
) -> Option<VolumeSnapshotContentStatus> {
    let group = (!o.group_id.is_empty()).then(|| o.group_id.clone());
    let size = (o.size > 0).then_some(o.size);
    let Some(cur) = current else {
        return Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some(o.handle.clone()),
            ready_to_use: Some(o.ready),
            creation_time: Some(o.created_ns),
            restore_size: size,
            volume_group_snapshot_handle: group,
            error: None,
        });
    };
    let mut s = cur.clone();
    let changed = [
        fill(&mut s.snapshot_handle, Some(o.handle.clone())),
        set_ready(&mut s.ready_to_use, &mut s.error, o.ready),
        fill(&mut s.creation_time, Some(o.created_ns)),
        fill(&mut s.restore_size, size),
        fill(&mut s.volume_group_snapshot_handle, group),
    ];
    changed.contains(&true).then_some(s)
}

/// Sets an unset status field to `value` (when that is set); whether it
/// changed.
pub(super) fn fill<T>(field: &mut Option<T>, value: Option<T>) -> bool {
    let fills = field.is_none() && value.is_some();
    if fills {
        *field = value;
    }
    fills
}

/// Overwrites `readyToUse` when it differs from `ready`, clearing the error
/// when it becomes true; whether it changed.
pub(super) fn set_ready(ready_to_use: &mut Option<bool>, error: &mut Option<SnapshotError>, ready: bool) -> bool {
    let differs = *ready_to_use != Some(ready);
    if differs {
        *ready_to_use = Some(ready);
        if ready {
            *error = None;
        }
    }
    differs
}

/// JSON patch replacing the whole status (to the `status` subresource), of
/// a content or a group content.
pub fn status_patch<S: Serialize>(status: &S) -> serde_json::Value {
    serde_json::json!([{"op": "replace", "path": "/status", "value": status}])
}

/// A content's or a group content's status, as [`error_patch`] reads and
/// writes it.
pub trait ContentStatus: Default + Serialize {
    /// `status.error`.
    fn error(&self) -> Option<&SnapshotError>;
    /// A status of just `error` and `readyToUse: false`.
    fn failed(error: SnapshotError) -> Self;
}

impl ContentStatus for VolumeSnapshotContentStatus {
    fn error(&self) -> Option<&SnapshotError> {
        self.error.as_ref()
    }
    fn failed(error: SnapshotError) -> Self {
        Self { ready_to_use: Some(false), error: Some(error), ..Default::default() }
    }
}

/// The error-status patch (upstream's `updateContentErrorStatusWithEvent`
/// and its group form): `status.error = {time, message}` and
/// `readyToUse: false`; the whole status when there was none. `None` when
/// the same message is already recorded (then neither the status nor the
/// event is written).
pub fn error_patch<S: ContentStatus>(current: Option<&S>, message: &str, now: Timestamp) -> Option<serde_json::Value> {
    let error = SnapshotError { time: Some(Time(now)), message: Some(message.to_string()) };
    match current {
        Some(s) if s.error().and_then(|e| e.message.as_deref()) == Some(message) => None,
        None => Some(status_patch(&S::failed(error))),
        Some(_) => Some(serde_json::json!([
            {"op": "replace", "path": "/status/error", "value": error},
            {"op": "replace", "path": "/status/readyToUse", "value": false},
        ])),
    }
}

/// The status after DeleteSnapshot: handle, readiness, time and size
/// cleared (the error and the group handle stay).
pub fn cleared_status(current: Option<&VolumeSnapshotContentStatus>) -> VolumeSnapshotContentStatus {
    VolumeSnapshotContentStatus {
        snapshot_handle: None,
        ready_to_use: None,
        creation_time: None,
        restore_size: None,
        ..current.cloned().unwrap_or_default()
    }
}

/// A content kind as the decisions shared with group contents see it.
pub trait Content: Resource + Clone + PartialEq {
    /// The kind's status.
    type Status: ContentStatus;
    /// The kind's being-created annotation.
    const BEING_CREATED: &'static str;
    /// The status, if any.
    fn status(&self) -> Option<&Self::Status>;
    /// Whether the status says ready.
    fn is_ready(&self) -> bool;
    /// Drops the status.
    fn clear_status(&mut self);
}

impl Content for VolumeSnapshotContent {
    type Status = VolumeSnapshotContentStatus;
    const BEING_CREATED: &'static str = upstream::ANN_BEING_CREATED;
    fn status(&self) -> Option<&VolumeSnapshotContentStatus> {
        self.status.as_ref()
    }
    fn is_ready(&self) -> bool {
        is_ready(self)
    }
    fn clear_status(&mut self) {
        self.status = None;
    }
}

/// The merge patch setting the kind's being-created annotation: the one
/// key, merged into whatever annotations the object has when the patch
/// lands. Upstream sends a JSON patch replacing the whole map with the one
/// it read plus the key, which drops an annotation the snapshot-controller
/// added since (its being-deleted mark: the content then never gets its
/// DeleteSnapshot and keeps its finalizer); see docs/differences.md.
pub fn being_created_patch<K: Content>(_read: &K) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {K::BEING_CREATED: "yes"}}})
}

/// The JSON pointer of annotation `key`.
fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// The JSON patch removing the being-created annotation.
pub fn remove_being_created_patch() -> serde_json::Value {
    remove_annotation_patch(upstream::ANN_BEING_CREATED)
}

/// The JSON patch removing annotation `key`.
pub(super) fn remove_annotation_patch(key: &str) -> serde_json::Value {
    serde_json::json!([{"op": "remove", "path": annotation_path(key)}])
}

/// Whether an update needs a sync (upstream's `ShouldEnqueueContentChange`
/// and v8.7's `ShouldEnqueueGroupContentChange`): always for an unchanged
/// resourceVersion (a resync) and for the readyToUse false → true
/// transition; otherwise only when something other than the status,
/// managedFields, finalizers and the kind's being-created annotation
/// changed.
pub fn should_enqueue<K: Content>(old: &K, new: &K) -> bool {
    if old.meta().resource_version == new.meta().resource_version {
        return true;
    }
    if !old.is_ready() && new.is_ready() {
        return true;
    }
    sanitized(old) != sanitized(new)
}

fn sanitized<K: Content>(c: &K) -> K {
    let mut s = c.clone();
    s.clear_status();
    let m = s.meta_mut();
    m.resource_version = None;
    m.managed_fields = None;
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove(K::BEING_CREATED);
    }
    // Go's semantic equality: an empty map equals a missing one.
    if m.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        m.annotations = None;
    }
    if m.labels.as_ref().is_some_and(BTreeMap::is_empty) {
        m.labels = None;
    }
    s
}

/// Whether a resourceVersion is older than another (numeric, as upstream's
/// internal store compares them); unparsable ones are never older.
pub fn is_older(rv: Option<&str>, than: Option<&str>) -> bool {
    match (rv.and_then(|r| r.parse::<u64>().ok()), than.and_then(|r| r.parse::<u64>().ok())) {
        (Some(a), Some(b)) => a < b,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
