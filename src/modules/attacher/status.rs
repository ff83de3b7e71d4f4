//! The attacher's `/status` writes, pure: the status each outcome leaves,
//! built from the status the attachment has, and the JSON merge patch from
//! the one to the other (upstream patches with the merge patch of the
//! object and its modified clone). So a key the driver's new publish
//! context lacks, or an `errorCode` the new error has not, goes out as
//! `null` instead of staying beside the new values.

use std::collections::HashMap;

use k8s_openapi::{
    api::storage::v1::{VolumeAttachmentStatus, VolumeError},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use serde_json::Value;

/// One status write of the attacher.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Published with this publish context (the trivial handler: none):
    /// attached, the context as `attachmentMetadata`, no `attachError`.
    Attached(HashMap<String, String>),
    /// The attach failed: `attachError` is this error, the rest is kept.
    AttachError(VolumeError),
    /// The detach failed: `detachError` is this error, the rest is kept.
    DetachError(VolumeError),
    /// Unpublished: not attached, no `attachmentMetadata`, no `detachError`.
    Detached,
}

/// An error as the status records it; `code` (the gRPC code of a driver's
/// error) only while `MutableCSINodeAllocatableCount` is on.
pub fn volume_error(message: &str, time: Timestamp, code: Option<tonic::Code>, gate: bool) -> VolumeError {
    VolumeError {
        message: Some(message.to_string()),
        time: Some(Time(time)),
        error_code: code.filter(|_| gate).map(|c| c as i32),
    }
}

/// The status `write` leaves, from the attachment's status `old`.
pub fn next(old: Option<&VolumeAttachmentStatus>, write: Write) -> VolumeAttachmentStatus {
    let mut status = old.cloned().unwrap_or_default();
    match write {
        Write::Attached(context) => {
            status.attached = true;
            // An empty map is left out, as Go's `omitempty` leaves it.
            status.attachment_metadata = (!context.is_empty()).then(|| context.into_iter().collect());
            status.attach_error = None;
        }
        Write::AttachError(e) => status.attach_error = Some(e),
        Write::DetachError(e) => status.detach_error = Some(e),
        Write::Detached => {
            status.attached = false;
            status.attachment_metadata = None;
            status.detach_error = None;
        }
    }
    status
}

/// The `/status` merge patch from `old` (none: Go's zero status) to `new`:
/// `{"status": ...}` with what changed; `{"status": {}}` when nothing did
/// (still sent, as upstream sends its empty patch).
pub fn patch(old: Option<&VolumeAttachmentStatus>, new: &VolumeAttachmentStatus) -> Value {
    let json = |s: &VolumeAttachmentStatus| serde_json::to_value(s).unwrap_or(Value::Null);
    let old = json(&old.cloned().unwrap_or_default());
    serde_json::json!({ "status": crate::k8s::merge_patch::diff(&old, &json(new)) })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ctx(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn status(v: Value) -> VolumeAttachmentStatus {
        serde_json::from_value(v).unwrap()
    }

    /// (old status, write, the patch's `status`).
    #[test]
    fn each_write_patches_what_changed_and_nulls_what_went() {
        let err = |m: &str, s: i64, code: Option<tonic::Code>| volume_error(m, at(s), code, true);
        let cases: Vec<(Option<Value>, Write, Value)> = vec![
            (
                None,
                Write::Attached(ctx(&[("devicePath", "/dev/sdb")])),
                json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/sdb"}}),
            ),
            // A re-attach whose publish context lost a key.
            (
                Some(json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/sdb", "lun": "3"}})),
                Write::Attached(ctx(&[("devicePath", "/dev/sdb")])),
                json!({"attachmentMetadata": {"lun": null}}),
            ),
            // Now none at all (and the failed try before it is cleared).
            (
                Some(json!({"attached": false, "attachmentMetadata": {"lun": "3"},
                            "attachError": {"message": "m", "time": "1970-01-01T00:00:01Z", "errorCode": 13}})),
                Write::Attached(HashMap::new()),
                json!({"attached": true, "attachmentMetadata": null, "attachError": null}),
            ),
            // Nothing changed: an empty patch.
            (
                Some(json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/sdb"}})),
                Write::Attached(ctx(&[("devicePath", "/dev/sdb")])),
                json!({}),
            ),
            // A later error without a gRPC code drops the old code.
            (
                Some(json!({"attached": false,
                            "attachError": {"message": "backend down", "time": "1970-01-01T00:00:01Z", "errorCode": 13}})),
                Write::AttachError(err("csinode not found", 2, None)),
                json!({"attachError": {"message": "csinode not found", "time": "1970-01-01T00:00:02Z", "errorCode": null}}),
            ),
            // The same error again, a second later: only the time.
            (
                Some(json!({"attached": false,
                            "attachError": {"message": "m", "time": "1970-01-01T00:00:01Z", "errorCode": 13}})),
                Write::AttachError(err("m", 2, Some(tonic::Code::Internal))),
                json!({"attachError": {"time": "1970-01-01T00:00:02Z"}}),
            ),
            // A first error: attached is unchanged (false), so left out.
            (
                Some(json!({"attached": false})),
                Write::AttachError(err("m", 1, Some(tonic::Code::ResourceExhausted))),
                json!({"attachError": {"message": "m", "time": "1970-01-01T00:00:01Z", "errorCode": 8}}),
            ),
            (
                Some(json!({"attached": true, "attachmentMetadata": {"k": "v"}})),
                Write::DetachError(err("busy", 1, None)),
                json!({"detachError": {"message": "busy", "time": "1970-01-01T00:00:01Z"}}),
            ),
            (
                Some(json!({"attached": true, "attachmentMetadata": {"k": "v"},
                            "detachError": {"message": "busy", "time": "1970-01-01T00:00:01Z"}})),
                Write::Detached,
                json!({"attached": false, "attachmentMetadata": null, "detachError": null}),
            ),
            (Some(json!({"attached": false})), Write::Detached, json!({})),
        ];
        for (old, write, want) in cases {
            let old = old.map(status);
            let new = next(old.as_ref(), write.clone());
            assert_eq!(patch(old.as_ref(), &new), json!({ "status": want }), "{old:?} {write:?}");
        }
    }

    #[test]
    fn the_error_code_is_written_only_with_the_gate() {
        let e = |gate| volume_error("m", at(1), Some(tonic::Code::ResourceExhausted), gate);
        assert_eq!(e(true).error_code, Some(8));
        assert_eq!(e(false).error_code, None);
        assert_eq!(volume_error("m", at(1), None, true).error_code, None);
    }
}
