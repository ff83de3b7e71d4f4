//! A claim's status conditions as the resizer writes them, pure: a
//! strategic merge patch of `status.conditions`, which the apiserver merges
//! by `type`. A write changes only the conditions the resizer decided on
//! (set, replaced or deleted), against the claim as it is when the write
//! lands: what the kubelet did meanwhile to the others (a
//! `FileSystemResizePending` it removed, a `NodeResizeError` it added) is
//! kept, where a whole list from the copy the decision read would undo it.

use k8s_openapi::api::core::v1::PersistentVolumeClaimCondition;
use serde_json::{Value, json};

/// The optional fields of a condition: given as `null` when absent, so a
/// replaced condition keeps nothing of the one it replaces.
const OPTIONAL: &[&str] = &["lastProbeTime", "lastTransitionTime", "message", "reason"];

/// The `status.conditions` of a strategic merge patch turning `old` (the
/// copy the decision read) into `new` (the list decided on): each condition
/// of `new` that differs from `old`'s of its type, whole; a
/// `$patch: delete` for each type of `old` that `new` lacks. Types in
/// neither are left alone.
pub fn by_type(old: &[PersistentVolumeClaimCondition], new: &[PersistentVolumeClaimCondition]) -> Value {
    let mut out = Vec::new();
    for c in new {
        if old.iter().any(|o| o == c) {
            continue;
        }
        let mut v = serde_json::to_value(c).unwrap_or_else(|_| json!({ "type": c.type_, "status": c.status }));
        if let Some(map) = v.as_object_mut() {
            for field in OPTIONAL {
                map.entry(*field).or_insert(Value::Null);
            }
        }
        out.push(v);
    }
    for o in old {
        if !new.iter().any(|c| c.type_ == o.type_) {
            out.push(json!({ "type": o.type_, "$patch": "delete" }));
        }
    }
    Value::Array(out)
}

/// `status` with the conditions of [`by_type`] and, when `new` is not
/// empty, `$setElementOrder/conditions` listing `new`'s types in order: the
/// merged list keeps the order decided on (a condition added after the ones
/// it follows, as a whole list would have it), without re-adding a type
/// that is gone meanwhile; conditions only the live claim has stay. When
/// nothing changes, the conditions are left out: an order alone naming
/// types the live claim no longer has is refused by the apiserver's merge
/// (a 500, "no elements in any of the given slices").
pub fn with_conditions(
    mut status: Value,
    old: &[PersistentVolumeClaimCondition],
    new: &[PersistentVolumeClaimCondition],
) -> Value {
    let changes = by_type(old, new);
    if changes.as_array().is_some_and(Vec::is_empty) {
        return status;
    }
    if let Some(map) = status.as_object_mut() {
        map.insert("conditions".into(), changes);
        if !new.is_empty() {
            let order: Vec<Value> = new.iter().map(|c| json!({ "type": c.type_ })).collect();
            map.insert("$setElementOrder/conditions".into(), Value::Array(order));
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, message: Option<&str>) -> PersistentVolumeClaimCondition {
        PersistentVolumeClaimCondition {
            type_: type_.into(),
            status: "True".into(),
            message: message.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_decided_changes_by_type() {
        let fs = cond("FileSystemResizePending", Some("waiting"));
        let other = cond("Other", None);
        let modifying = cond("ModifyingVolume", Some("in progress"));
        // (what, old, new, want)
        let cases = [
            ("nothing changed", vec![fs.clone(), other.clone()], vec![fs.clone(), other.clone()], json!([])),
            (
                "one set, the rest untouched",
                vec![fs.clone()],
                vec![fs.clone(), modifying.clone()],
                json!([{"type": "ModifyingVolume", "status": "True", "message": "in progress",
                        "lastProbeTime": null, "lastTransitionTime": null, "reason": null}]),
            ),
            (
                "replaced whole: the old message goes",
                vec![modifying.clone()],
                vec![cond("ModifyingVolume", None)],
                json!([{"type": "ModifyingVolume", "status": "True",
                        "lastProbeTime": null, "lastTransitionTime": null, "message": null, "reason": null}]),
            ),
            (
                "removed by type",
                vec![other.clone(), modifying.clone(), fs.clone()],
                vec![other.clone()],
                json!([{"type": "ModifyingVolume", "$patch": "delete"},
                       {"type": "FileSystemResizePending", "$patch": "delete"}]),
            ),
            ("no conditions", vec![], vec![], json!([])),
        ];
        for (what, old, new, want) in cases {
            assert_eq!(by_type(&old, &new), want, "{what}");
        }
    }

    #[test]
    fn the_order_decided_on_goes_with_the_conditions() {
        let resizing = cond("Resizing", None);
        let fs = cond("FileSystemResizePending", Some("waiting"));
        let s = with_conditions(
            json!({ "capacity": {} }),
            std::slice::from_ref(&resizing),
            &[resizing.clone(), fs.clone()],
        );
        assert_eq!(
            s["$setElementOrder/conditions"],
            json!([{"type": "Resizing"}, {"type": "FileSystemResizePending"}])
        );
        assert_eq!(s["conditions"].as_array().map(Vec::len), Some(1), "only the new one written");
        assert_eq!(s["capacity"], json!({}));
        let none = with_conditions(json!({}), &[resizing], &[]);
        assert_eq!(
            none,
            json!({"conditions": [{"type": "Resizing", "$patch": "delete"}]}),
            "no order for an empty list"
        );
        let unchanged =
            with_conditions(json!({ "capacity": {} }), std::slice::from_ref(&fs), std::slice::from_ref(&fs));
        assert_eq!(unchanged, json!({ "capacity": {} }), "nothing decided: the conditions left alone");
    }
}
