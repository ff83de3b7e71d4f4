//! The JSON merge patch (RFC 7386) that turns one document into another:
//! what client-go's callers build with `jsonpatch.CreateMergePatch` from
//! an object and its modified clone. Keys that changed carry their new
//! value, keys that are gone carry `null`, unchanged keys are left out, and
//! objects are compared key by key (arrays and scalars are replaced whole).
//! A patch written by hand from the new values only would keep every key
//! the new document no longer has.

use serde_json::{Map, Value};

/// The merge patch from `old` to `new`. Both objects: the object of their
/// differences (`{}` when equal); otherwise `new` itself. A `null` inside
/// `new` cannot be told from a removal (a limit of merge patches).
pub fn diff(old: &Value, new: &Value) -> Value {
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        return new.clone();
    };
    let mut patch = Map::new();
    for (key, was) in old {
        match new.get(key) {
            None => {
                patch.insert(key.clone(), Value::Null);
            }
            Some(now) if now != was => {
                patch.insert(key.clone(), diff(was, now));
            }
            Some(_) => {}
        }
    }
    for (key, now) in new {
        if !old.contains_key(key) {
            patch.insert(key.clone(), now.clone());
        }
    }
    Value::Object(patch)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    #[test]
    fn changed_removed_and_unchanged_keys() {
        let cases = [
            (json!({"a": 1, "b": 2}), json!({"a": 1, "b": 3}), json!({"b": 3})),
            (json!({"m": {"x": "1", "y": "2"}}), json!({"m": {"x": "1"}}), json!({"m": {"y": null}})),
            (json!({"m": {"x": "1"}}), json!({}), json!({"m": null})),
            (json!({}), json!({"m": {"x": "1"}}), json!({"m": {"x": "1"}})),
            (json!({"l": [1, 2]}), json!({"l": [1]}), json!({"l": [1]})),
            (json!({"a": {"b": 1}}), json!({"a": 2}), json!({"a": 2})),
            (json!({"a": 1}), json!({"a": 1}), json!({})),
            (json!(1), json!({"a": 1}), json!({"a": 1})),
        ];
        for (old, new, want) in cases {
            assert_eq!(diff(&old, &new), want, "{old} -> {new}");
        }
    }

    /// JSON without nulls (a merge patch cannot set one), small keys so
    /// that documents share keys.
    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            (-3i64..3).prop_map(Value::from),
            "[ab]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-d]", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Applying the patch to `old` (RFC 7386, the model) gives `new`,
        /// and the patch names no key whose value did not change.
        #[test]
        fn applying_the_patch_gives_the_new_document(old in document(), new in document()) {
            let patch = diff(&old, &new);
            let mut doc = old.clone();
            json_patch::merge(&mut doc, &patch);
            prop_assert_eq!(&doc, &new);
            if let (Value::Object(o), Value::Object(n), Value::Object(p)) = (&old, &new, &patch) {
                for key in p.keys() {
                    prop_assert_ne!(o.get(key), n.get(key), "unchanged key {} in the patch", key);
                }
            }
        }
    }
}
