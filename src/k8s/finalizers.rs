//! Adding and removing one finalizer without a resourceVersion, so an
//! unrelated update of the object (another controller's finalizer or status)
//! never makes the write conflict, and without ever dropping a finalizer
//! another controller wrote after our (possibly stale) cached read.
//!
//! - Adding to a built-in kind is a strategic merge patch of
//!   `metadata.finalizers`, whose patch strategy is merge, with
//!   `$setElementOrder/finalizers`: the list we read plus the new name, as
//!   upstream's sidecars send it. The apiserver merges the name into the
//!   list it holds, so a finalizer written after our read is kept, and the
//!   order only arranges the names the merged list has, so one removed
//!   after our read is not brought back; the new name goes after the ones
//!   we read (without the order it would go first).
//! - Custom resources do not accept strategic merge patches, so adding to
//!   one is a JSON patch that first `test`s the list we read (`null` when we
//!   read none: a missing list passes that test, any list fails it). When the
//!   list changed meanwhile, the object is read again and the patch retried.
//! - Removing is a JSON patch naming the entry (`test` + `remove` at its
//!   index): a changed list makes the `test` fail instead of removing the
//!   wrong entry.
//! - A role that refuses the patch but grants `update` (upstream's RBAC on
//!   claims) gets the same edit as an update of the object read fresh
//!   ([`update_fallback::or_update_instead`]).

use std::fmt::Debug;

use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};

use super::update_fallback;

/// How a finalizer is added to objects of one API group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddForm {
    /// A strategic merge patch of `metadata.finalizers` (built-in kinds).
    StrategicMerge,
    /// A JSON patch testing the list read, re-read and retried on a change
    /// (every kind, including custom resources).
    TestedJsonPatch,
}

/// API groups whose kinds are served by the apiserver itself (and so
/// accept strategic merge patches) among those a CSI sidecar writes
/// finalizers to. Any other group gets the form that works for everything.
const BUILT_IN_GROUPS: [&str; 2] = ["", "storage.k8s.io"];

/// How many times a tested JSON patch is retried on a fresh read.
const TESTED_PATCH_TRIES: usize = 3;

/// The form for kinds of `group`.
pub fn add_form(group: &str) -> AddForm {
    if BUILT_IN_GROUPS.contains(&group) { AddForm::StrategicMerge } else { AddForm::TestedJsonPatch }
}

fn patch(ops: serde_json::Value) -> Result<json_patch::Patch, kube::Error> {
    serde_json::from_value(ops).map_err(kube::Error::SerdeError)
}

/// The strategic merge patch that appends `finalizer` to the list
/// `current` (`None`: no list) and keeps whatever else the object's list
/// holds by then.
pub fn strategic_add(current: Option<&[String]>, finalizer: &str) -> serde_json::Value {
    let mut order: Vec<&str> = current.unwrap_or_default().iter().map(String::as_str).collect();
    order.push(finalizer);
    serde_json::json!({"metadata": {
        "$setElementOrder/finalizers": order,
        "finalizers": [finalizer],
    }})
}

/// The JSON patch that appends `finalizer` to the list `current` (`None`:
/// no list), failing if the object's list is not `current` any more.
fn tested_add(current: Option<&[String]>, finalizer: &str) -> serde_json::Value {
    match current {
        None => serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ]),
        Some(current) => serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ]),
    }
}

/// Whether `obj` lists `finalizer`.
fn has(obj: &impl Resource, finalizer: &str) -> bool {
    obj.meta().finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Adds `finalizer` unless present, keeping every other finalizer the
/// object has on the server (see the module documentation).
pub async fn add<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    add_with(api, obj, finalizer, add_form(&K::group(&K::DynamicType::default()))).await
}

/// [`add`] in the given form (both work for built-in kinds; only
/// [`AddForm::TestedJsonPatch`] works for custom resources).
pub async fn add_with<K>(api: &Api<K>, obj: &K, finalizer: &str, form: AddForm) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    if has(obj, finalizer) {
        return Ok(());
    }
    let name = obj.meta().name.clone().unwrap_or_default();
    let result = match form {
        AddForm::StrategicMerge => {
            let body = strategic_add(obj.meta().finalizers.as_deref(), finalizer);
            api.patch(&name, &PatchParams::default(), &Patch::Strategic(body)).await.map(|_| ())
        }
        AddForm::TestedJsonPatch => add_tested(api, obj, &name, finalizer).await,
    };
    // A role with `update` but not `patch` (upstream's on claims).
    update_fallback::or_update_instead(result, api, &name, |o| {
        let absent = !has(o, finalizer);
        if absent {
            o.meta_mut().finalizers.get_or_insert_with(Vec::new).push(finalizer.to_string());
        }
        absent
    })
    .await
}

async fn add_tested<K>(api: &Api<K>, obj: &K, name: &str, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let mut current = obj.meta().finalizers.clone();
    let mut tries = 0;
    loop {
        let ops = tested_add(current.as_deref(), finalizer);
        match api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch(ops)?)).await {
            Ok(_) => return Ok(()),
            // A failed `test`: the list is not the one we read.
            Err(kube::Error::Api(e)) if e.code == 422 && tries + 1 < TESTED_PATCH_TRIES => tries += 1,
            Err(e) => return Err(e),
        }
        let fresh = api.get(name).await?;
        if has(&fresh, finalizer) {
            return Ok(());
        }
        current = fresh.meta().finalizers.clone();
    }
}

/// Removes `finalizer` if present; an object already gone is fine.
///
/// Built-in kinds: a strategic merge patch deleting the value from the list
/// (`$deleteFromPrimitiveList`), which cannot conflict with another
/// controller changing the list meanwhile (the PV protection controller
/// does, on every PV deletion) and never removes anything else. Custom
/// resources: a JSON patch testing the entry at its index, re-read and
/// retried when the list moved.
pub async fn remove<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    if !has(obj, finalizer) {
        return Ok(());
    }
    let name = obj.meta().name.clone().unwrap_or_default();
    let result = match add_form(&K::group(&K::DynamicType::default())) {
        AddForm::StrategicMerge => {
            let body = serde_json::json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}});
            api.patch(&name, &PatchParams::default(), &Patch::Strategic(body)).await.map(|_| ())
        }
        AddForm::TestedJsonPatch => remove_tested(api, obj, &name, finalizer).await,
    };
    // A role with `update` but not `patch` (upstream's on claims).
    let result = update_fallback::or_update_instead(result, api, &name, |o| {
        let present = has(o, finalizer);
        if let Some(list) = o.meta_mut().finalizers.as_mut() {
            list.retain(|f| f != finalizer);
        }
        present
    })
    .await;
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other,
    }
}

async fn remove_tested<K>(api: &Api<K>, obj: &K, name: &str, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let mut current = obj.meta().finalizers.clone().unwrap_or_default();
    let mut tries = 0;
    loop {
        let Some(i) = current.iter().position(|f| f == finalizer) else { return Ok(()) };
        let path = format!("/metadata/finalizers/{i}");
        let ops = serde_json::json!([
            {"op": "test", "path": path, "value": finalizer},
            {"op": "remove", "path": path},
        ]);
        match api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch(ops)?)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 422 && tries + 1 < TESTED_PATCH_TRIES => tries += 1,
            Err(e) => return Err(e),
        }
        current = api.get(name).await?.meta().finalizers.clone().unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_groups_get_a_strategic_merge_and_others_a_tested_json_patch() {
        for (group, form) in [
            ("", AddForm::StrategicMerge),
            ("storage.k8s.io", AddForm::StrategicMerge),
            ("snapshot.storage.k8s.io", AddForm::TestedJsonPatch),
            ("example.com", AddForm::TestedJsonPatch),
        ] {
            assert_eq!(add_form(group), form, "{group:?}");
        }
    }

    #[test]
    fn a_strategic_add_orders_the_new_name_after_the_list_it_read() {
        let read = ["a".to_string(), "b".to_string()];
        for (current, order) in
            [(None, serde_json::json!(["x/y"])), (Some(&read[..]), serde_json::json!(["a", "b", "x/y"]))]
        {
            assert_eq!(
                strategic_add(current, "x/y"),
                serde_json::json!({"metadata": {"$setElementOrder/finalizers": order, "finalizers": ["x/y"]}}),
                "{current:?}"
            );
        }
    }

    #[test]
    fn a_tested_add_tests_the_list_it_read() {
        assert_eq!(
            tested_add(None, "a/b"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["a/b"]},
            ])
        );
        assert_eq!(
            tested_add(Some(&["x".to_string()]), "a/b"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "a/b"},
            ])
        );
    }
}
