//! The shared runtime's API writes against the real apiserver: adding a
//! finalizer appends it to the list, as upstream's sidecars do, and adding
//! from a stale cached copy never drops a finalizer another controller wrote
//! since, nor brings back one it removed since, for built-in kinds and for
//! custom resources.

use std::{borrow::Cow, time::Duration};

use csi_sidecar::k8s::finalizers::{self, AddForm};
use csi_sidecar_integration::{
    cluster::ControlPlane,
    kube_support::{TestNamespace, create, csi_pv, pvc, unique_name, wait_for},
};
use k8s_openapi::{
    ClusterResourceScope,
    api::core::v1::{PersistentVolume, PersistentVolumeClaim},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
        CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(30);
const OURS: &str = "example.com/ours";
const OTHER: &str = "example.com/other";
/// The finalizers upstream's sidecars and the protection controllers write.
const PROVISIONER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
const CLONE_PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";

fn finalizers_of(obj: &impl Resource) -> Vec<String> {
    obj.meta().finalizers.clone().unwrap_or_default()
}

/// Another controller adds `finalizer` with `patch` (a strategic merge
/// appends to a built-in kind's list; custom resources here have no list
/// before, so a merge patch replacing it loses nothing).
async fn other_controller_adds<K>(api: &Api<K>, name: &str, finalizer: &str) -> K
where
    K: Resource + Clone + std::fmt::Debug + Serialize + for<'de> Deserialize<'de>,
    K::DynamicType: Default,
{
    let list = serde_json::json!({"metadata": {"finalizers": [finalizer]}});
    let patch =
        if K::group(&K::DynamicType::default()).is_empty() { Patch::Strategic(list) } else { Patch::Merge(list) };
    api.patch(name, &PatchParams::default(), &patch).await.expect("other controller's add")
}

/// Lets the objects of a test go: no finalizers, deleted.
async fn release<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + std::fmt::Debug + Serialize + for<'de> Deserialize<'de>,
{
    let clear = serde_json::json!({"metadata": {"finalizers": null}});
    let _ = api.patch(name, &PatchParams::default(), &Patch::Merge(&clear)).await;
    let _ = api.delete(name, &DeleteParams::default()).await;
}

async fn fresh_pv(client: &Client, prefix: &str) -> (Api<PersistentVolume>, PersistentVolume) {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let name = unique_name(prefix);
    let mut pv = csi_pv(&name, "finalizers.csi.example.com", &name, "1Mi");
    // A class of its own: the PV binder never binds it to another test's
    // claim (class "").
    if let Some(spec) = pv.spec.as_mut() {
        spec.storage_class_name = Some(name.clone());
    }
    let pv = create(&pvs, &pv).await;
    (pvs, pv)
}

/// A provisioned PV carries the provisioner's finalizer and the protection
/// controller's; upstream's attacher appends its own after them.
#[tokio::test]
async fn adding_to_a_pv_appends_after_the_provisioner_and_pv_protection() {
    let client = ControlPlane::shared().client().await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let name = unique_name("fin-order");
    let mut pv = csi_pv(&name, "finalizers.csi.example.com", &name, "1Mi");
    pv.metadata.finalizers = Some(vec![PROVISIONER.into(), PV_PROTECTION.into()]);
    let created = create(&pvs, &pv).await;
    assert_eq!(finalizers_of(&created), [PROVISIONER, PV_PROTECTION], "as created");
    let attacher = "external-attacher/finalizers-csi-example-com";

    finalizers::add(&pvs, &created, attacher).await.expect("add");

    let list = finalizers_of(&pvs.get(&name).await.expect("get"));
    release(&pvs, &name).await;
    assert_eq!(list, [PROVISIONER, PV_PROTECTION, attacher]);
}

/// A claim gets `kubernetes.io/pvc-protection` at creation; upstream's
/// provisioner appends the cloning protection of a clone's source after it.
#[tokio::test]
async fn adding_to_a_claim_appends_after_pvc_protection() {
    let client = ControlPlane::shared().client().await;
    let ns = TestNamespace::new(&client, "fin-claim").await;
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let created = create(&pvcs, &pvc("src", None, "1Mi")).await;
    assert_eq!(finalizers_of(&created), [PVC_PROTECTION], "the admission plugin's");

    finalizers::add(&pvcs, &created, CLONE_PROTECTION).await.expect("add");

    let list = finalizers_of(&pvcs.get("src").await.expect("get"));
    release(&pvcs, "src").await;
    assert_eq!(list, [PVC_PROTECTION, CLONE_PROTECTION]);
}

/// Another controller took its finalizer out after our copy was read: the
/// add must not bring it back (the order we send names it).
#[tokio::test]
async fn adding_from_a_copy_listing_a_finalizer_removed_since_does_not_restore_it() {
    let client = ControlPlane::shared().client().await;
    let (pvs, created) = fresh_pv(&client, "fin-gone").await;
    let name = created.metadata.name.clone().expect("name");
    let stale = other_controller_adds(&pvs, &name, OTHER).await;
    let without = serde_json::json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [OTHER]}});
    pvs.patch(&name, &PatchParams::default(), &Patch::Strategic(without)).await.expect("remove OTHER");

    finalizers::add(&pvs, &stale, OURS).await.expect("add");

    let list = finalizers_of(&pvs.get(&name).await.expect("get"));
    release(&pvs, &name).await;
    let mut want: Vec<String> = finalizers_of(&stale).into_iter().filter(|f| f != OTHER).collect();
    want.push(OURS.into());
    assert_eq!(list, want, "OTHER stays gone, ours appended");
}

#[tokio::test]
async fn adding_from_a_copy_without_finalizers_keeps_a_finalizer_written_since() {
    let client = ControlPlane::shared().client().await;
    let (pvs, mut stale) = fresh_pv(&client, "fin-empty").await;
    let name = stale.metadata.name.clone().expect("name");
    // The cached copy has no finalizers (the admission plugin may already
    // have added `kubernetes.io/pv-protection` on create: the copy is from
    // before that); the live object gets another one after it.
    stale.metadata.finalizers = None;
    let before = finalizers_of(&other_controller_adds(&pvs, &name, OTHER).await);

    finalizers::add(&pvs, &stale, OURS).await.expect("add");

    let list = finalizers_of(&pvs.get(&name).await.expect("get"));
    release(&pvs, &name).await;
    assert!(list.iter().any(|f| f == OURS), "ours missing: {list:?}");
    for f in &before {
        assert!(list.contains(f), "{f} (another controller's) was dropped: {list:?}, before {before:?}");
    }
}

#[tokio::test]
async fn adding_from_a_copy_whose_list_changed_since_keeps_both() {
    let client = ControlPlane::shared().client().await;
    let (pvs, created) = fresh_pv(&client, "fin-changed").await;
    let name = created.metadata.name.clone().expect("name");
    let stale = other_controller_adds(&pvs, &name, OTHER).await;
    // Another controller appends to the list after our copy was read.
    let third = "example.com/third";
    let append = serde_json::json!({"metadata": {"finalizers": [third]}});
    pvs.patch(&name, &PatchParams::default(), &Patch::Strategic(append)).await.expect("append");

    finalizers::add(&pvs, &stale, OURS).await.expect("add");

    let list = finalizers_of(&pvs.get(&name).await.expect("get"));
    release(&pvs, &name).await;
    for f in [OURS, OTHER, third] {
        assert!(list.iter().any(|l| l == f), "{f} missing: {list:?}");
    }
}

/// The protection controller removes its finalizer while we remove ours
/// (every PV deletion): removing from the stale copy must still succeed at
/// the first request, without a conflict or a retry, and keep the others.
#[tokio::test]
async fn removing_from_a_copy_whose_list_changed_since_succeeds_at_once() {
    let client = ControlPlane::shared().client().await;
    let (pvs, created) = fresh_pv(&client, "fin-remove").await;
    let name = created.metadata.name.clone().expect("name");
    finalizers::add(&pvs, &created, OURS).await.expect("add ours");
    other_controller_adds(&pvs, &name, OTHER).await;
    let stale = wait_for(&pvs, &name, T, |pv| {
        let l = finalizers_of(pv);
        l.iter().any(|f| f == OURS) && l.iter().any(|f| f == OTHER)
    })
    .await;
    // Another controller takes its own finalizer out of the list we read
    // (the list shifts under the index we would remove).
    let listed = finalizers_of(&stale);
    let ours_at = listed.iter().position(|f| f == OURS).expect("ours listed");
    assert!(ours_at > 0, "a finalizer before ours to take out: {listed:?}");
    let before = listed[ours_at - 1].clone();
    let mut tries = 0;
    loop {
        let fresh = pvs.get(&name).await.expect("get");
        let shifted: Vec<String> = finalizers_of(&fresh).into_iter().filter(|f| *f != before).collect();
        let rv = fresh.metadata.resource_version;
        let shift = serde_json::json!({"metadata": {"finalizers": shifted, "resourceVersion": rv}});
        match pvs.patch(&name, &PatchParams::default(), &Patch::Merge(shift)).await {
            Ok(_) => break,
            Err(e) if tries < 10 && csi_sidecar_integration::kube_support::is_status(&e, 409) => tries += 1,
            Err(e) => panic!("shift the list: {e}"),
        }
    }

    finalizers::remove(&pvs, &stale, OURS).await.expect("removed at the first request");

    let list = finalizers_of(&pvs.get(&name).await.expect("get"));
    release(&pvs, &name).await;
    assert!(!list.iter().any(|f| f == OURS), "ours removed: {list:?}");
    let kept: Vec<&String> = listed.iter().filter(|f| **f != OURS && **f != before).collect();
    assert!(kept.iter().all(|f| list.contains(f)), "the other controllers' kept: {list:?}, wanted {kept:?}");
}

#[tokio::test]
async fn adding_a_finalizer_already_present_writes_nothing() {
    let client = ControlPlane::shared().client().await;
    let (pvs, created) = fresh_pv(&client, "fin-present").await;
    let name = created.metadata.name.clone().expect("name");
    // kube-controller-manager writes a new PV too (its pv-protection
    // finalizer, phase Available): once it has, only the requests below can
    // change the resourceVersion.
    let created = wait_for(&pvs, &name, T, |pv| {
        finalizers_of(pv).iter().any(|f| f == PV_PROTECTION)
            && pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
    })
    .await;
    finalizers::add(&pvs, &created, OURS).await.expect("first add");
    let live = wait_for(&pvs, &name, T, |pv| finalizers_of(pv).iter().any(|f| f == OURS)).await;

    // Once from the fresh copy (no request at all), once from the stale one
    // (a request that changes nothing).
    finalizers::add(&pvs, &live, OURS).await.expect("add from the fresh copy");
    finalizers::add(&pvs, &created, OURS).await.expect("add from the stale copy");

    let after = pvs.get(&name).await.expect("get");
    release(&pvs, &name).await;
    assert_eq!(after.metadata.resource_version, live.metadata.resource_version, "the object was written");
    assert_eq!(finalizers_of(&after).iter().filter(|f| *f == OURS).count(), 1, "{:?}", finalizers_of(&after));
}

// A cluster-scoped custom resource with a free-form spec.
const GROUP: &str = "finalizers.csi-sidecar.example.com";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Widget {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<serde_json::Value>,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Installs the Widget kind (once per cluster) and waits until it is served.
async fn widgets(client: &Client) -> Api<Widget> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = format!("widgets.{GROUP}");
    let crd = CustomResourceDefinition {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        spec: CustomResourceDefinitionSpec {
            group: GROUP.into(),
            names: CustomResourceDefinitionNames {
                kind: "Widget".into(),
                plural: "widgets".into(),
                ..Default::default()
            },
            scope: "Cluster".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1".into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(JSONSchemaProps {
                        type_: Some("object".into()),
                        x_kubernetes_preserve_unknown_fields: Some(true),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    };
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create the Widget CRD: {e}"),
    }
    wait_for(&crds, &name, T, |c| {
        c.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Established" && c.status == "True")
    })
    .await;
    let api: Api<Widget> = Api::all(client.clone());
    // Established can precede the discovery of the new kind by a moment.
    let deadline = tokio::time::Instant::now() + T;
    while api.list(&Default::default()).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the Widget kind is not served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api
}

#[tokio::test]
async fn adding_to_a_custom_resource_keeps_a_finalizer_written_since() {
    let client = ControlPlane::shared().client().await;
    let api = widgets(&client).await;
    let name = unique_name("widget");
    let widget = Widget {
        api_version: format!("{GROUP}/v1"),
        kind: "Widget".into(),
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        spec: Some(serde_json::json!({"size": 1})),
    };
    let stale = create(&api, &widget).await;
    assert_eq!(finalizers::add_form(GROUP), AddForm::TestedJsonPatch);
    // Why custom resources need the other form: no strategic merge for them.
    let refused = finalizers::add_with(&api, &stale, OURS, AddForm::StrategicMerge).await;
    assert!(matches!(&refused, Err(kube::Error::Api(e)) if e.code == 415), "{refused:?}");

    other_controller_adds(&api, &name, OTHER).await;
    finalizers::add(&api, &stale, OURS).await.expect("add from the copy without finalizers");
    let list = finalizers_of(&api.get(&name).await.expect("get"));

    // And once more from a copy whose list changed since.
    let mut changed = stale.clone();
    changed.metadata.finalizers = Some(vec![OTHER.to_string()]);
    let second = "example.com/second";
    finalizers::add(&api, &changed, second).await.expect("add from the changed copy");
    let after = finalizers_of(&api.get(&name).await.expect("get"));

    // A widget that still has no list: the `test` of the absent list passes
    // (were it refused, every retry would be too, and `add` would fail).
    let bare_name = unique_name("widget");
    let bare = create(
        &api,
        &Widget { metadata: ObjectMeta { name: Some(bare_name.clone()), ..Default::default() }, ..widget },
    )
    .await;
    finalizers::add(&api, &bare, OURS).await.expect("add to a widget without finalizers");
    let bare_list = finalizers_of(&api.get(&bare_name).await.expect("get"));

    // From a fresh copy: appended, as for built-in kinds.
    let fresh = api.get(&name).await.expect("get");
    let third = "example.com/third";
    finalizers::add(&api, &fresh, third).await.expect("add from the fresh copy");
    let appended = finalizers_of(&api.get(&name).await.expect("get"));

    release(&api, &name).await;
    release(&api, &bare_name).await;
    let mut want = finalizers_of(&fresh);
    want.push(third.into());
    assert_eq!(appended, want);
    assert_eq!(bare_list, [OURS]);
    assert!(list.iter().any(|f| f == OURS) && list.iter().any(|f| f == OTHER), "{list:?}");
    for f in [OURS, OTHER, second] {
        assert!(after.iter().any(|l| l == f), "{f} missing: {after:?}");
    }
}
