//! The RBAC manifests (`manifests/rbac/`) against the code and against the
//! real kube-apiserver.
//!
//! * Minimality: the provisioner's, the attacher's, the resizer's, the
//!   snapshotter's and the health monitor's ClusterRoles and leader-election
//!   Roles hold exactly the (apiGroup, resource, verb) triples the code uses,
//!   listed below with the code that uses each; no wildcard anywhere; the
//!   node ServiceAccount carries no token; the code touches no kind these
//!   lists do not cover.
//! * Sufficiency: each module runs under exactly those manifests (applied to
//!   the control plane, credentials minted for the controller
//!   ServiceAccount): the provisioner provisions, binds, deletes and cleans
//!   up a volume, with secrets, topology, a reschedule, events (including an
//!   aggregated repeat) and leader election; the attacher attaches and detaches a volume for the
//!   real attach-detach controller, with a publish secret and leader
//!   election; the health monitor (in-process fault driver, CSI 1.13 form,
//!   node watcher) reports abnormal, healthy and abnormal-again volume
//!   health and a failed node, with aggregated repeats; without a single
//!   `forbidden` in the log, in an Event or in a VolumeAttachment's status
//!   (but the health monitor's one info line when the optional claim
//!   status rule, commented out in its manifest, is not granted: it then
//!   reports events; with the rule, nothing is refused).
//! * Necessity: the same runs with any one exercised verb removed fail, with
//!   the apiserver's refusal of exactly that verb as the evidence.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use csi_sidecar::csi::{HealthCondition, HealthStatus};
use csi_sidecar_integration::yaml::{documents as load, kind};
use csi_sidecar_integration::{
    cluster::{ControlPlane, Identity, launcher_bin},
    component_bin,
    fault_driver::{FaultDriver, HealthForms, Script, Transport},
    kube_support::{TestNamespace, create, csi_node, csi_pv, node, pod, pvc, storage_class, unique_name},
    process::Proc,
    sidecar_bin, workspace_root,
};
use k8s_openapi::{
    ByteString,
    api::{
        coordination::v1::Lease,
        core::v1::{
            Event, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, Secret, SecretReference,
            ServiceAccount,
        },
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
        storage::v1::{CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass},
    },
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::Value;

/// (apiGroup, resource, verb).
type Triple = (String, String, String);

fn rbac_file(name: &str) -> PathBuf {
    workspace_root().join("manifests/rbac").join(name)
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// The one document of `kind` named `name` in `file`.
fn doc(file: &str, want_kind: &str, want_name: &str) -> Value {
    load(&rbac_file(file))
        .into_iter()
        .find(|d| kind(d) == want_kind && name(d) == want_name)
        .unwrap_or_else(|| panic!("no {want_kind} {want_name} in manifests/rbac/{file}"))
}

fn triples(role: &Value) -> BTreeSet<Triple> {
    let rules: Vec<PolicyRule> = serde_json::from_value(role["rules"].clone()).expect("rules");
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none(), "unexpected rule shape: {r:?}");
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    assert!(
                        out.insert((g.clone(), res.clone(), v.clone())),
                        "{} grants ({g:?}, {res}, {v}) twice",
                        name(role)
                    );
                }
            }
        }
    }
    out
}

fn set(list: &[(&str, &str, &str)]) -> BTreeSet<Triple> {
    list.iter().map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect()
}

/// What the provisioner module calls, and where (src/modules/provisioner/mod.rs
/// unless said otherwise). Nothing else: no `get` on StorageClasses or
/// VolumeAttachments, which are only read from informer caches; PVCs and
/// PVs are read with a GET only as a clone's source. (ReferenceGrants
/// `list`, with the CrossNamespaceVolumeDataSource gate only, is a
/// commented-out rule of the manifest: not granted by default.)
const PROVISIONER_CALLS: &[(&str, &str, &str)] = &[
    // `run`: informers.get::<PersistentVolumeClaim>() (src/kube/informers.rs:
    // a streaming list, i.e. a watch; `list` where the apiserver refuses
    // streaming lists, as one without the WatchList feature does).
    ("", "persistentvolumeclaims", "list"),
    ("", "persistentvolumeclaims", "watch"),
    // `unselect_node`: merge patch removing volume.kubernetes.io/selected-node
    // (reschedule: the selected node or its CSINode is gone, or
    // ResourceExhausted from a topology-aware driver).
    // Also `protect_source` / `sync_clone_source`: the cloning-protection
    // finalizer on a clone's source.
    ("", "persistentvolumeclaims", "patch"),
    // `clone_source`: the source claim (bound: not in the cache).
    ("", "persistentvolumeclaims", "get"),
    // `clone_source`: the source claim's volume (its handle).
    ("", "persistentvolumes", "get"),
    // `snapshot_source`, `protect_source`, `release_snapshot`: a restore's snapshot.
    ("snapshot.storage.k8s.io", "volumesnapshots", "get"),
    // The provisioner's volumesnapshot-as-source-protection finalizer (JSON patches).
    ("snapshot.storage.k8s.io", "volumesnapshots", "patch"),
    // `run`: views::provisioner_protected_snapshots (the orphan sweep; the
    // snapshot CRDs installed, a driver with CREATE_DELETE_SNAPSHOT).
    ("snapshot.storage.k8s.io", "volumesnapshots", "list"),
    ("snapshot.storage.k8s.io", "volumesnapshots", "watch"),
    // `snapshot_source`: the snapshot's bound content (its handle).
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
    // `run`: informers.get::<PersistentVolume>().
    ("", "persistentvolumes", "list"),
    ("", "persistentvolumes", "watch"),
    // `provision`: api.create(&pv).
    ("", "persistentvolumes", "create"),
    // `delete`: api.delete(&name).
    ("", "persistentvolumes", "delete"),
    // `patch_finalizers`: merge patch of metadata.finalizers.
    ("", "persistentvolumes", "patch"),
    // `run`: informers.get::<StorageClass>().
    ("storage.k8s.io", "storageclasses", "list"),
    ("storage.k8s.io", "storageclasses", "watch"),
    // `run`: informers.get::<VolumeAttachment>() when the driver can publish.
    ("storage.k8s.io", "volumeattachments", "list"),
    ("storage.k8s.io", "volumeattachments", "watch"),
    // `run`: informers.metadata::<Node>() and informers.get::<CSINode>() for
    // topology, only with a driver reporting VOLUME_ACCESSIBILITY_CONSTRAINTS
    // (the live run's driver does).
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("storage.k8s.io", "csinodes", "list"),
    ("storage.k8s.io", "csinodes", "watch"),
    // `secret`: Api::<Secret>::get (provisioner and deletion secrets).
    ("", "secrets", "get"),
    // `prepare`: Api::<VolumeAttributesClass>::get (a claim naming a class).
    ("storage.k8s.io", "volumeattributesclasses", "get"),
    // src/kube/events.rs `write`: create a new Event, patch the count of a repeat.
    ("", "events", "create"),
    ("", "events", "patch"),
];

/// What capacity tracking calls (src/modules/provisioner/capacity/mod.rs),
/// in the provisioner's namespace only (a Role).
const CAPACITY_CALLS: &[(&str, &str, &str)] = &[
    // views::capacity_objects: the namespaced, label-selected watch.
    ("storage.k8s.io", "csistoragecapacities", "list"),
    ("storage.k8s.io", "csistoragecapacities", "watch"),
    // `sync_item`: a new object; a changed capacity (merge patch).
    ("storage.k8s.io", "csistoragecapacities", "create"),
    ("storage.k8s.io", "csistoragecapacities", "patch"),
    // `sync_delete`: an object whose class or segment is gone.
    ("storage.k8s.io", "csistoragecapacities", "delete"),
    // `lookup_owner`: the pod $POD_NAME (--capacity-ownerref-level >= 0).
    ("", "pods", "get"),
];

#[test]
fn provisioner_capacity_role_is_exactly_what_the_code_calls() {
    let role = doc("provisioner.yaml", "Role", "csi-sidecar-provisioner-capacity");
    assert_eq!(role["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&role), set(CAPACITY_CALLS));
}

/// src/kube/leader.rs: `get_opt`, `create`, `replace` of the Lease.
const LEADER_ELECTION_CALLS: &[(&str, &str, &str)] = &[
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
];

#[test]
fn provisioner_cluster_role_is_exactly_what_the_code_calls() {
    let role = doc("provisioner.yaml", "ClusterRole", "csi-sidecar-provisioner");
    assert_eq!(triples(&role), set(PROVISIONER_CALLS));
}

#[test]
fn provisioner_leader_election_role_is_exactly_what_the_code_calls() {
    let role = doc("provisioner.yaml", "Role", "csi-sidecar-provisioner-leader-election");
    assert_eq!(role["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&role), set(LEADER_ELECTION_CALLS));
}

/// What the attacher module calls (src/modules/attacher/mod.rs). No `get`
/// on VolumeAttachments, PVs or CSINodes: informer caches only; no events.
const ATTACHER_CALLS: &[(&str, &str, &str)] = &[
    // `run`: informers.get::<VolumeAttachment>().
    ("storage.k8s.io", "volumeattachments", "list"),
    ("storage.k8s.io", "volumeattachments", "watch"),
    // `attach`, `detach`: va_api().patch (finalizer, node-id annotation).
    ("storage.k8s.io", "volumeattachments", "patch"),
    // `patch_status`, `error_status`: va_api().patch_status.
    ("storage.k8s.io", "volumeattachments/status", "patch"),
    // `run`: informers.get::<PersistentVolume>().
    ("", "persistentvolumes", "list"),
    ("", "persistentvolumes", "watch"),
    // `add_finalizer`, `sync_pv`: merge patch of metadata.finalizers.
    ("", "persistentvolumes", "patch"),
    // `run`: informers.get::<CSINode>().
    ("storage.k8s.io", "csinodes", "list"),
    ("storage.k8s.io", "csinodes", "watch"),
    // `secrets`: Api::<Secret>::get (controllerPublishSecretRef).
    ("", "secrets", "get"),
];

#[test]
fn attacher_cluster_role_is_exactly_what_the_code_calls() {
    let role = doc("attacher.yaml", "ClusterRole", "csi-sidecar-attacher");
    assert_eq!(triples(&role), set(ATTACHER_CALLS));
    let lease = doc("attacher.yaml", "Role", "csi-sidecar-attacher-leader-election");
    assert_eq!(lease["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&lease), set(LEADER_ELECTION_CALLS));
}

/// What the resizer module calls (src/modules/resizer/mod.rs). No `get`
/// on claims, PVs, pods or classes: informer caches only.
const RESIZER_CALLS: &[(&str, &str, &str)] = &[
    // `run`: views::bound_claims.
    ("", "persistentvolumeclaims", "list"),
    ("", "persistentvolumeclaims", "watch"),
    // `patch_status`: the resize and modify status (and the
    // node-expansion-not-required annotation, through /status as upstream).
    ("", "persistentvolumeclaims/status", "patch"),
    // `run`: views::driver_pvs.
    ("", "persistentvolumes", "list"),
    ("", "persistentvolumes", "watch"),
    // `patch_pv`: capacity, pre-resize annotation, volumeAttributesClassName.
    ("", "persistentvolumes", "patch"),
    // `run`: views::pods_using_claims (offline-only driver).
    ("", "pods", "list"),
    ("", "pods", "watch"),
    // `run`: informers.get::<VolumeAttributesClass>() (the driver can modify).
    ("storage.k8s.io", "volumeattributesclasses", "list"),
    ("storage.k8s.io", "volumeattributesclasses", "watch"),
    // `expand`, `sync_modify`: Api::<Secret>::get (controllerExpandSecretRef).
    ("", "secrets", "get"),
    // src/kube/events.rs `write`: create, and a repeat's PATCH.
    ("", "events", "create"),
    ("", "events", "patch"),
];

/// What the snapshotter module calls (src/modules/snapshotter/mod.rs). No
/// VolumeSnapshots, claims or PVs, no `update`: every write is a patch.
const SNAPSHOTTER_CALLS: &[(&str, &str, &str)] = &[
    // `run`: views::driver_snapshot_contents.
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "list"),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "watch"),
    // `write_status`, `delete`: the fresh read before a status write.
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
    // `patch`: the being-created annotation; kube/finalizers.rs: the finalizer.
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "patch"),
    // `patch_status`: handle, readyToUse, creationTime, restoreSize, error.
    ("snapshot.storage.k8s.io", "volumesnapshotcontents/status", "patch"),
    // `run`: views::snapshot_classes.
    ("snapshot.storage.k8s.io", "volumesnapshotclasses", "list"),
    ("snapshot.storage.k8s.io", "volumesnapshotclasses", "watch"),
    // `run` with group snapshots: views::driver_group_snapshot_contents, views::group_snapshot_classes.
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "list"),
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "watch"),
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "list"),
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "watch"),
    // group.rs `write_status`, `delete`: the fresh read; `patch`: the group
    // being-created annotation and the group finalizer; `patch_status`.
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "get"),
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "patch"),
    ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch"),
    // `secrets`: Api::<Secret>::get (deletion-secret annotations, list secret).
    ("", "secrets", "get"),
    // src/kube/events.rs `write`: create, and a repeat's PATCH.
    ("", "events", "create"),
    ("", "events", "patch"),
];

#[test]
fn snapshotter_cluster_role_is_exactly_what_the_code_calls() {
    let role = doc("snapshotter.yaml", "ClusterRole", "csi-sidecar-snapshotter");
    assert_eq!(triples(&role), set(SNAPSHOTTER_CALLS));
    let lease = doc("snapshotter.yaml", "Role", "csi-sidecar-snapshotter-leader-election");
    assert_eq!(lease["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&lease), set(LEADER_ELECTION_CALLS));
}

#[test]
fn resizer_cluster_role_is_exactly_what_the_code_calls() {
    let role = doc("resizer.yaml", "ClusterRole", "csi-sidecar-resizer");
    assert_eq!(triples(&role), set(RESIZER_CALLS));
    let lease = doc("resizer.yaml", "Role", "csi-sidecar-resizer-leader-election");
    assert_eq!(lease["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&lease), set(LEADER_ELECTION_CALLS));
}

/// What the health monitor calls (src/modules/health/). No `get` on
/// claims, PVs, nodes or pods (informer caches only), no watch of events:
/// its own past events are listed once when it starts leading.
const HEALTH_MONITOR_CALLS: &[(&str, &str, &str)] = &[
    // mod.rs `run`: views::bound_claims.
    ("", "persistentvolumeclaims", "list"),
    ("", "persistentvolumeclaims", "watch"),
    // mod.rs `run`: views::driver_pvs.
    ("", "persistentvolumes", "list"),
    ("", "persistentvolumes", "watch"),
    // nodes.rs `NodeWatcher::new` (--enable-node-watcher): informers.get::<CachedNode>()
    // and the view of pods on a node using claims.
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    // monitor.rs `recall`: this monitor's past events, by reason and source.
    ("", "events", "list"),
    // src/kube/events.rs `write`: create, and a repeat's PATCH.
    ("", "events", "create"),
    ("", "events", "patch"),
];

/// The health monitor's optional rule, commented out in the manifest (and
/// off in the chart unless `patchClaimStatus`): status_api.rs `probe`, the
/// dry-run question whether status.healthStatus is served (CSI 1.13
/// driver), and monitor.rs `write_status` where it is. Without it the probe
/// is refused and the monitor reports events (one info line says so).
const HEALTH_MONITOR_CLAIM_STATUS: (&str, &str, &str) = ("", "persistentvolumeclaims/status", "patch");

/// The info line of a health monitor without the optional rule: the one
/// refusal it expects, and answers with events.
const CLAIM_STATUS_REFUSED: &str = "Not allowed to patch persistentvolumeclaims/status";

/// The rules `file` leaves commented out (`  # - apiGroups: ...` and the
/// lines under it), as triples.
fn commented_out(file: &str) -> BTreeSet<Triple> {
    let text = std::fs::read_to_string(rbac_file(file)).expect("manifest");
    let yaml: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("  # "))
        .filter(|l| l.starts_with("- ") || l.starts_with("  "))
        .map(|l| format!("{l}\n"))
        .collect();
    let rules: Value = serde_saphyr::from_str(&yaml).expect("commented-out rules");
    triples(&serde_json::json!({ "rules": rules }))
}

#[test]
fn health_monitor_cluster_role_is_exactly_what_the_code_calls() {
    let role = doc("health-monitor.yaml", "ClusterRole", "csi-sidecar-health-monitor");
    assert_eq!(triples(&role), set(HEALTH_MONITOR_CALLS));
    // The optional claim status rule: in the file, commented out.
    assert_eq!(commented_out("health-monitor.yaml"), set(&[HEALTH_MONITOR_CLAIM_STATUS]));
    let lease = doc("health-monitor.yaml", "Role", "csi-sidecar-health-monitor-leader-election");
    assert_eq!(lease["metadata"]["namespace"], "default", "namespace placeholder");
    assert_eq!(triples(&lease), set(LEADER_ELECTION_CALLS));
}

/// The kinds a piece of source touches: typed `Api<K>`, informers of a
/// kind, and the kinds of the shared cache's views (the type of the filter's
/// argument in `informers.view(..)` and `informers.scoped(..)`).
fn kinds_in(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for marker in ["Api<", "Api::<", "informers.get::<", "informers.metadata::<"] {
        for (i, _) in code.match_indices(marker) {
            let before = code[..i].chars().next_back().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' {
                continue; // FakeApi<, MyApi::<
            }
            let rest = &code[i + marker.len()..];
            let kind: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            found.insert(cached_kind(&kind).to_string());
        }
    }
    for marker in ["informers.view(", "informers.scoped("] {
        for (i, _) in code.match_indices(marker) {
            // The filter's argument, `|name: &Kind|` or `|name: &path::Kind|`.
            let Some(arg) = code[i + marker.len()..].split('|').nth(1) else { continue };
            let Some((_, ty)) = arg.split_once(':') else { continue };
            let ty = ty.trim().trim_start_matches('&').trim();
            let last = ty.rsplit("::").next().unwrap_or(ty);
            let kind: String = last.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            found.insert(cached_kind(&kind).to_string());
        }
    }
    found
}

/// The API kind of one of the compact cached types (`kube::cached`); any
/// other name as it is (a new cached type then shows as itself).
fn cached_kind(name: &str) -> &str {
    match name {
        "CachedPv" => "PersistentVolume",
        "CachedPvc" => "PersistentVolumeClaim",
        "CachedVa" => "VolumeAttachment",
        "CachedPod" => "Pod",
        "CachedNode" => "Node", // src/kube/cached_node.rs
        other => other,
    }
}

/// A tripwire for new API calls: the kinds the controller modules and the
/// shared Kubernetes runtime touch (typed `Api<K>` and informers). A new kind
/// here needs a new RBAC rule (and a new entry in the lists above).
#[test]
fn the_code_touches_no_kind_the_rbac_does_not_cover() {
    let root = workspace_root().join("src");
    let mut found = BTreeSet::new();
    for dir in [
        "modules",
        "modules/provisioner",
        "modules/provisioner/capacity",
        "modules/attacher",
        "modules/resizer",
        "modules/snapshotter",
        "modules/health",
        "kube",
        "kube/leader",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            // Test modules use fakes; only the code before them counts.
            found.extend(kinds_in(text.split("#[cfg(test)]").next().unwrap_or_default()));
        }
    }
    let covered: BTreeSet<String> = [
        "K", // src/kube/informers.rs: the generic informer (its kinds are listed here by their modules)
        "PersistentVolumeClaim",
        "PersistentVolume",
        "StorageClass",
        "VolumeAttachment",
        "CSINode",
        "Node",
        "Secret",
        "Event",
        "Lease",
        "VolumeAttributesClass",
        "VolumeSnapshot",
        "VolumeSnapshotContent",
        "VolumeSnapshotClass",
        "VolumeGroupSnapshotContent",
        "VolumeGroupSnapshotClass",
        // The provisioner's gate-only rule, commented out in manifests/rbac/provisioner.yaml.
        "ReferenceGrant",
        // Capacity tracking: its Role in provisioner.yaml; the owner walk's
        // objects above the pod (replicasets: a commented-out rule).
        "CSIStorageCapacity",
        "Pod",
        "DynamicObject",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    let new: Vec<_> = found.difference(&covered).collect();
    assert!(
        new.is_empty(),
        "kinds used in src/ that manifests/rbac does not cover: {new:?} (found {found:?}). Grant the verbs the \
         code uses in manifests/rbac/<module>.yaml and manifests/helm/csi-sidecar/templates/rbac.yaml, list them \
         in PROVISIONER_CALLS / ATTACHER_CALLS above, and add the kind here"
    );
}

/// The tripwire's scanner sees a kind however the code asks for it: a kind
/// only ever watched through a view of the shared cache (`modules/views.rs`)
/// or a scoped watch needs RBAC as much as a typed `Api`.
#[test]
fn the_tripwire_sees_kinds_declared_through_views() {
    let sample = r#"
        let a: Api<Secret> = Api::all(client);
        let n = informers.metadata::<Node>();
        let m = informers.get::<CachedNode>();
        pub fn new_view(informers: &Informers) -> Informer<NewKind> {
            informers.view("all", |n: &NewKind| n.ok())
        }
        let v = informers.view(&format!("driver={d}"), move |c: &CachedPvc| keep(c));
        let s = informers.scoped(scope, "x", move |c: &k8s_openapi::api::storage::v1::ScopedKind| true);
        let f: FakeApi<Ignored> = FakeApi::default();
    "#;
    let want: BTreeSet<String> =
        ["Secret", "Node", "NewKind", "PersistentVolumeClaim", "ScopedKind"].into_iter().map(String::from).collect();
    assert_eq!(kinds_in(sample), want);
}

#[test]
fn no_wildcards_and_every_binding_resolves() {
    let dir = workspace_root().join("manifests/rbac");
    let mut all = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("manifests/rbac") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            all.extend(load(&path));
        }
    }
    let roles: BTreeSet<(String, String)> = all
        .iter()
        .filter(|d| matches!(kind(d), "ClusterRole" | "Role"))
        .map(|d| (kind(d).to_string(), name(d).to_string()))
        .collect();
    for d in &all {
        if matches!(kind(d), "ClusterRole" | "Role") {
            for (g, r, v) in triples(d) {
                assert!(
                    !g.contains('*') && !r.contains('*') && !v.contains('*'),
                    "{}: wildcard in ({g}, {r}, {v})",
                    name(d)
                );
            }
            assert!(d.get("aggregationRule").is_none(), "{}: aggregation", name(d));
        }
        if matches!(kind(d), "ClusterRoleBinding" | "RoleBinding") {
            let r = &d["roleRef"];
            let target = (
                r["kind"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
            );
            assert!(roles.contains(&target), "{} refers to {target:?}, which manifests/rbac does not define", name(d));
            for s in d["subjects"].as_array().expect("subjects") {
                assert_eq!(s["kind"], "ServiceAccount", "{}", name(d));
                assert_eq!(s["name"], "csi-sidecar-controller", "{}: only the controller is bound", name(d));
            }
        }
        if kind(d) != "ClusterRole" && kind(d) != "ClusterRoleBinding" {
            assert_eq!(d["metadata"]["namespace"], "default", "{} {}: namespace placeholder", kind(d), name(d));
        }
    }
}

#[test]
fn node_service_account_has_no_token_and_no_binding() {
    let sa = doc("node.yaml", "ServiceAccount", "csi-sidecar-node");
    assert_eq!(sa["automountServiceAccountToken"], false);
    assert_eq!(load(&rbac_file("node.yaml")).len(), 1, "node.yaml holds the ServiceAccount only");
}

// ---------------------------------------------------------------------------
// Live: each controller module under exactly the manifests' RBAC.

const CONTROLLER_SA: &str = "csi-sidecar-controller";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The mock driver's topology key (`--enable-topology`).
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";
const STEP: Duration = Duration::from_secs(45);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Module {
    Provisioner,
    Attacher,
    Resizer,
    Snapshotter,
    HealthMonitor,
}

impl Module {
    fn name(self) -> &'static str {
        match self {
            Module::Provisioner => "provisioner",
            Module::Attacher => "attacher",
            Module::Resizer => "resizer",
            Module::Snapshotter => "snapshotter",
            Module::HealthMonitor => "health-monitor",
        }
    }

    /// The control plane a run needs: with the snapshot CRDs and
    /// snapshot-controller for the snapshotter; without streaming lists when
    /// `list` is what is shown needed.
    fn control_plane(self, list: bool) -> &'static ControlPlane {
        match (self, list) {
            // The provisioner's restores need the snapshot CRDs too.
            (Module::Snapshotter | Module::Provisioner, false) => ControlPlane::with_snapshots(),
            (Module::Snapshotter | Module::Provisioner, true) => snapshots_without_streaming_lists(),
            (_, false) => ControlPlane::shared(),
            (_, true) => without_streaming_lists(),
        }
    }

    /// The triples the live run exercises: all of the module's.
    fn exercised(self) -> Vec<Triple> {
        let calls = match self {
            Module::Provisioner => PROVISIONER_CALLS,
            Module::Attacher => ATTACHER_CALLS,
            Module::Resizer => RESIZER_CALLS,
            Module::Snapshotter => SNAPSHOTTER_CALLS,
            Module::HealthMonitor => HEALTH_MONITOR_CALLS,
        };
        // The mock driver has no GroupController: the snapshotter's live run
        // lists and watches the group kinds but writes no group content.
        // Those writes are proven sufficient and needed under this manifest by
        // integration/tests/group_snapshots.rs (fault driver).
        let unexercised = [
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "get"),
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "patch"),
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch"),
        ];
        let skip = set(&unexercised);
        let capacity = if self == Module::Provisioner { CAPACITY_CALLS } else { &[] };
        set(calls)
            .into_iter()
            .filter(|t| !skip.contains(t))
            .chain(set(LEADER_ELECTION_CALLS))
            .chain(set(capacity))
            .collect()
    }
}

/// Applies the module's file of manifests/rbac plus the ServiceAccount and
/// the module's bindings from controller.yaml (only this module's rules, so
/// another module's cannot mask a missing verb) into namespace `ns`:
/// namespaced objects move to `ns`, cluster-scoped names get `ns` as prefix.
/// How the rules of a cycle differ from the manifest's.
#[derive(Clone, Copy, Debug)]
enum Rules<'a> {
    /// Exactly the manifest's.
    Manifest,
    /// Without one triple.
    Without(&'a Triple),
    /// With one more triple in the module's ClusterRole (a rule the
    /// manifest leaves commented out).
    With(&'a Triple),
}

/// `change`: the manifest's rules, or without or with one triple.
async fn apply_rbac(client: &Client, ns: &str, module: Module, change: Rules<'_>) {
    let mut docs = load(&rbac_file(&format!("{}.yaml", module.name())));
    docs.extend(load(&rbac_file("controller.yaml")));
    let mut applied = 0;
    for mut d in docs {
        let component = d["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap_or_default();
        if component != module.name() && component != "controller" {
            continue;
        }
        let k = kind(&d).to_string();
        if matches!(k.as_str(), "ClusterRole" | "ClusterRoleBinding") {
            d["metadata"]["name"] = format!("{ns}-{}", name(&d)).into();
        } else {
            d["metadata"]["namespace"] = ns.into();
        }
        if let Some(subjects) = d["subjects"].as_array_mut() {
            for s in subjects {
                s["namespace"] = ns.into();
            }
        }
        if d["roleRef"]["kind"] == "ClusterRole" {
            d["roleRef"]["name"] = format!("{ns}-{}", d["roleRef"]["name"].as_str().unwrap_or_default()).into();
        }
        if let (Rules::With((g, r, v)), "ClusterRole", Some(rules)) = (change, k.as_str(), d["rules"].as_array_mut()) {
            rules.push(serde_json::json!({ "apiGroups": [g], "resources": [r], "verbs": [v] }));
        }
        if let (Rules::Without((g, r, v)), Some(rules)) = (change, d["rules"].as_array_mut()) {
            // Exactly the one triple: a rule naming more resources (nodes
            // and pods) keeps them with all their verbs, and `r` gets a
            // rule of its own without `v`.
            let mut own = Vec::new();
            for rule in rules.iter_mut() {
                let has = |field: &str, x: &str| rule[field].as_array().is_some_and(|a| a.iter().any(|e| e == x));
                if has("apiGroups", g) && has("resources", r) {
                    assert_eq!(rule["apiGroups"].as_array().map(Vec::len), Some(1), "one group per rule: {rule}");
                    let mut split = rule.clone();
                    split["resources"] = serde_json::json!([r]);
                    split["verbs"].as_array_mut().expect("verbs").retain(|e| e != v.as_str());
                    rule["resources"].as_array_mut().expect("resources").retain(|e| e != r.as_str());
                    own.push(split);
                }
            }
            rules.extend(own);
            let non_empty = |rule: &Value, field: &str| rule[field].as_array().is_some_and(|a| !a.is_empty());
            rules.retain(|rule| non_empty(rule, "verbs") && non_empty(rule, "resources"));
        }
        let pp = PostParams::default();
        let what = format!("{k} {}", name(&d));
        let r = match k.as_str() {
            "ServiceAccount" => Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(d).expect("ServiceAccount"))
                .await
                .map(drop_ok),
            "Role" => Api::<Role>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(d).expect("Role"))
                .await
                .map(drop_ok),
            "RoleBinding" => Api::<RoleBinding>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(d).expect("RoleBinding"))
                .await
                .map(drop_ok),
            "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                .create(&pp, &serde_json::from_value(d).expect("ClusterRole"))
                .await
                .map(drop_ok),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                .create(&pp, &serde_json::from_value(d).expect("ClusterRoleBinding"))
                .await
                .map(drop_ok),
            other => panic!("unexpected kind {other} in manifests/rbac"),
        };
        r.unwrap_or_else(|e| panic!("create {what}: {e}"));
        applied += 1;
    }
    // The provisioner also has the capacity Role and its binding.
    let want = if module == Module::Provisioner { 7 } else { 5 };
    assert_eq!(applied, want, "ServiceAccount, ClusterRole, Role(s) and their bindings");
}

fn drop_ok<T>(_: T) {}

/// Upstream's Lease name sanitizing (csi-lib-utils).
fn sanitize(name: &str) -> String {
    let mut s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    if s.ends_with('-') {
        s.push('X');
    }
    s
}

/// A refusal the code expects and works around, in a log line: a streaming
/// list refused (the informer lists instead), and the health monitor's
/// dry-run claim status question without the optional rule (events
/// instead).
fn tolerated_refusal(line: &str) -> bool {
    line.contains("refuses streaming lists") || line.contains(CLAIM_STATUS_REFUSED)
}

/// One run of a module under the manifests' RBAC. Err carries the reason
/// (for a refused verb: the apiserver's message) and the sidecar's log.
struct Cycle {
    module: Module,
    ns: TestNamespace,
    driver: Driver,
    sidecar: Proc,
    driver_name: String,
    node_name: String,
    _dir: tempfile::TempDir,
}

/// The driver of a cycle: the Kubernetes CSI mock driver (a process), or,
/// for the health monitor, the in-process fault driver (the mock reports no
/// volume health).
enum Driver {
    Mock(Proc),
    Fault(FaultDriver),
}

impl Driver {
    /// The mock's log (its gRPC calls); the fault driver keeps counters instead.
    fn logs(&self) -> String {
        match self {
            Driver::Mock(p) => p.logs(),
            Driver::Fault(f) => format!("{:?}", f.counters),
        }
    }

    fn fault(&self) -> &FaultDriver {
        match self {
            Driver::Fault(f) => f,
            Driver::Mock(_) => panic!("not the fault driver"),
        }
    }
}

#[derive(Debug)]
struct Failure {
    reason: String,
    log: String,
}

impl Cycle {
    async fn start(cp: &ControlPlane, module: Module, change: Rules<'_>) -> Cycle {
        let admin = cp.client().await;
        let ns = TestNamespace::new(&admin, &format!("rbac-{}", &module.name()[..4])).await;
        apply_rbac(&admin, ns.name(), module, change).await;
        let kubeconfig = cp.mint(&Identity::service_account(ns.name(), CONTROLLER_SA));
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = format!("{}.csi.example.com", unique_name("rbac"));
        let node_name = ns.scoped("node");
        let csi = dir.path().join("csi.sock");
        // Attach enabled (the default): ControllerPublish for the attacher,
        // and the provisioner also watches VolumeAttachments. Topology for
        // the provisioner: it also watches Nodes and CSINodes.
        let mut driver_args = vec![
            format!("--endpoint=unix://{}", csi.display()),
            format!("--name={driver_name}"),
            format!("--node-id={node_name}"),
        ];
        if module == Module::Provisioner {
            driver_args.push("--enable-topology".into());
        }
        if module == Module::Resizer {
            // Offline-only expansion: the resizer also watches pods.
            driver_args.push("--disable-online-expansion".into());
        }
        let driver = if module == Module::HealthMonitor {
            // The CSI 1.13 health form: the dry-run status question is asked
            // (persistentvolumeclaims/status patch).
            let script = Script {
                name: driver_name.clone(),
                controller: true,
                health: HealthForms::V1_13,
                ..Default::default()
            };
            Driver::Fault(FaultDriver::start(&csi, Transport::Grpc, script))
        } else {
            Driver::Mock(Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path()))
        };
        let mut args = vec![
            format!("--csi-address={}", csi.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            module.name().to_string(),
            "--leader-election".into(),
            format!("--leader-election-namespace={}", ns.name()),
            "--leader-election-retry-period=1s".into(),
            "-v=5".into(),
        ];
        if module == Module::HealthMonitor {
            args.extend(
                [
                    "--list-volumes-interval=1s",
                    "--monitor-interval=1s",
                    "--enable-node-watcher",
                    "--node-list-add-interval=1s",
                    "--timeout=5s",
                ]
                .map(String::from),
            );
        } else {
            args.extend(["--retry-interval-start=200ms", "--retry-interval-max=2s"].map(String::from));
        }
        if module == Module::Attacher {
            args.push("--reconcile-sync=2s".into());
        }
        // Capacity tracking, owned by a pod of the namespace (the owner walk's GET).
        let mut env = Vec::new();
        if module == Module::Provisioner {
            let p = Pod {
                metadata: kube::api::ObjectMeta { name: Some("provisioner-0".into()), ..Default::default() },
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![k8s_openapi::api::core::v1::Container {
                        name: "c".into(),
                        image: Some("example.invalid/none".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            create(&Api::<Pod>::namespaced(admin.clone(), ns.name()), &p).await;
            args.extend(
                ["--enable-capacity", "--capacity-ownerref-level=0", "--capacity-poll-interval=1s"].map(String::from),
            );
            env = vec![("NAMESPACE", ns.name().to_string()), ("POD_NAME", "provisioner-0".to_string())];
        }
        let env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, Some(v.as_str()))).collect();
        let sidecar = Proc::spawn_env("csi-sidecar", &sidecar_bin(), &args, &env, dir.path());
        Cycle { module, ns, driver, sidecar, driver_name, node_name, _dir: dir }
    }

    fn fail(&self, reason: impl Into<String>) -> Failure {
        Failure { reason: reason.into(), log: self.sidecar.logs() }
    }

    /// Messages the apiserver's answers may end up in: Events of this cycle
    /// (those in its namespace, and those about its cluster-scoped PVs,
    /// which go to `default` as upstream's do and name this cycle's
    /// ServiceAccount when they carry a refusal), and its VolumeAttachments'
    /// attach and detach errors.
    async fn messages(&self) -> Vec<String> {
        let client = self.ns.client().clone();
        let mut out = Vec::new();
        for ns in [self.ns.name(), "default"] {
            let list = Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await;
            out.extend(
                list.map(|l| l.items).unwrap_or_default().into_iter().filter_map(|e| e.message).filter(|m| {
                    ns == self.ns.name() || m.contains(&format!("system:serviceaccount:{}:", self.ns.name()))
                }),
            );
        }
        if self.module == Module::Attacher {
            let vas = Api::<VolumeAttachment>::all(client).list(&ListParams::default()).await;
            for va in vas.map(|l| l.items).unwrap_or_default() {
                if va.spec.node_name != self.node_name {
                    continue;
                }
                let st = va.status.unwrap_or_default();
                out.extend(st.attach_error.and_then(|e| e.message));
                out.extend(st.detach_error.and_then(|e| e.message));
            }
        }
        out
    }

    /// Refusals by the apiserver, in the sidecar's log or in a message. When
    /// there is one, waits a second and returns all of them: the first
    /// symptom of a missing verb is not always the refusal of that verb
    /// (an Event about it may be aggregated first), so the evidence is
    /// looked for among all of them.
    async fn forbidden(&self) -> Option<String> {
        let found = async || {
            let log = self.sidecar.logs();
            let messages = self.messages().await;
            let lines: Vec<String> = log
                .lines()
                .chain(messages.iter().map(String::as_str))
                // (An apiserver without WatchList answers a streaming list
                // "sendInitialEvents: Forbidden": not RBAC, and the informer
                // lists instead. A health monitor without the optional claim
                // status rule is refused its dry-run question and reports
                // events instead.)
                .filter(|l| l.to_lowercase().contains("forbidden") && !tolerated_refusal(l))
                .map(str::to_string)
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        };
        found().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        found().await
    }

    /// Polls `probe` until it yields a value; fails early on any refusal or
    /// on the sidecar's exit.
    async fn until<T>(&mut self, what: &str, mut probe: impl AsyncFnMut(&Self) -> Option<T>) -> Result<T, Failure> {
        let start = Instant::now();
        loop {
            if let Some(line) = self.forbidden().await {
                return Err(self.fail(format!("refused while waiting for {what}: {line}")));
            }
            if let Some(v) = probe(self).await {
                return Ok(v);
            }
            if let Some(status) = self.sidecar.try_exit() {
                return Err(self.fail(format!("csi-sidecar exited ({status}) while waiting for {what}")));
            }
            if start.elapsed() > STEP {
                return Err(self.fail(format!("timed out after {STEP:?} waiting for {what}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn calls_ok(&self, method: &str) -> usize {
        self.driver.logs().lines().filter(|l| l.contains(&format!("/{method} -> OK"))).count()
    }

    async fn run(&mut self) -> Result<(), Failure> {
        match self.module {
            Module::Provisioner => self.run_provisioner().await?,
            Module::Attacher => self.run_attacher().await?,
            Module::Resizer => self.run_resizer().await?,
            Module::Snapshotter => self.run_snapshotter().await?,
            Module::HealthMonitor => self.run_health_monitor().await?,
        }
        // One more look for refusals after the last step.
        tokio::time::sleep(Duration::from_millis(500)).await;
        match self.forbidden().await {
            Some(line) => Err(self.fail(format!("refused: {line}"))),
            None => Ok(()),
        }
    }

    /// The Lease exists, is held, and is renewed (PUT).
    async fn lease_renewed(&mut self, lease: &str) -> Result<(), Failure> {
        let leases: Api<Lease> = Api::namespaced(self.ns.client().clone(), self.ns.name());
        let first = self
            .until(&format!("the Lease {lease}"), async |_| {
                let spec = leases.get(lease).await.ok()?.spec?;
                spec.holder_identity.filter(|h| !h.is_empty())?;
                spec.renew_time
            })
            .await?;
        self.until("a Lease renewal", async |_| {
            let renewed = leases.get(lease).await.ok()?.spec?.renew_time?;
            (renewed != first).then_some(())
        })
        .await
    }

    fn secret(name: &str) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            data: Some(BTreeMap::from([("password".to_string(), ByteString(b"hunter2".to_vec()))])),
            ..Default::default()
        }
    }

    /// Provision (with a provisioner secret and topology), bind, renew the
    /// Lease, aggregate a repeated event, delete and clean up.
    async fn run_provisioner(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let classes: Api<StorageClass> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());

        // A provisioner secret, read at CreateVolume and again at DeleteVolume.
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("provisioner-creds")).await;
        // A node of the topology-aware driver: its CSINode names the mock's
        // topology key, its labels the value (accessibility requirements).
        create(&Api::<Node>::all(client.clone()), &node(&self.node_name, &[(TOPOLOGY_KEY, "some-mock-node")])).await;
        create(
            &Api::<CSINode>::all(client.clone()),
            &csi_node(&self.node_name, &self.driver_name, &self.node_name, &[TOPOLOGY_KEY]),
        )
        .await;
        let with_secret = |sc_name: &str, secret_name: &str| {
            let mut sc = storage_class(sc_name, &self.driver_name);
            sc.parameters = Some(BTreeMap::from([
                ("csi.storage.k8s.io/provisioner-secret-name".to_string(), secret_name.to_string()),
                ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), "${pvc.namespace}".to_string()),
            ]));
            sc
        };
        let good = self.ns.scoped("sc");
        let broken = self.ns.scoped("sc-broken");
        create(&classes, &with_secret(&good, "provisioner-creds")).await;
        // Names a secret that does not exist: provisioning fails the same way
        // on every retry, so the repeated event is aggregated (a PATCH).
        create(&classes, &with_secret(&broken, "no-such-secret")).await;
        // "data" names a VolumeAttributesClass of the driver (read with a GET).
        let class = self.ns.scoped("vac");
        let vac = VolumeAttributesClass {
            metadata: kube::api::ObjectMeta { name: Some(class.clone()), ..Default::default() },
            driver_name: self.driver_name.clone(),
            parameters: Some(BTreeMap::from([("iops".to_string(), "100".to_string())])),
        };
        create(&Api::<VolumeAttributesClass>::all(client.clone()), &vac).await;
        let mut data = pvc("data", Some(&good), "1Mi");
        if let Some(spec) = data.spec.as_mut() {
            spec.volume_attributes_class_name = Some(class.clone());
        }
        create(&pvcs, &data).await;
        create(&pvcs, &pvc("broken", Some(&broken), "1Mi")).await;
        // Late binding on a node that does not exist: the provisioner asks
        // the scheduler again by removing the selected-node annotation (PATCH).
        let mut late = storage_class(&self.ns.scoped("sc-late"), &self.driver_name);
        late.volume_binding_mode = Some("WaitForFirstConsumer".into());
        create(&classes, &late).await;
        let mut moved = pvc("moved", late.metadata.name.as_deref(), "1Mi");
        moved.metadata.annotations = Some(BTreeMap::from([(SELECTED_NODE.to_string(), self.ns.scoped("gone-node"))]));
        create(&pvcs, &moved).await;

        let pv_name = self
            .until("PVC data bound", async |_| {
                let c = pvcs.get("data").await.ok()?;
                (c.status?.phase.as_deref() == Some("Bound")).then_some(())?;
                c.spec?.volume_name
            })
            .await?;
        let pv = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV {pv_name}: {e}")))?;
        let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref());
        if !serde_json::to_string(&affinity).unwrap_or_default().contains(TOPOLOGY_KEY) {
            return Err(self.fail(format!("the PV has no topology nodeAffinity: {affinity:?}")));
        }
        let ann = pv.metadata.annotations.clone().unwrap_or_default();
        if ann.get("volume.kubernetes.io/provisioner-deletion-secret-name").map(String::as_str)
            != Some("provisioner-creds")
        {
            return Err(self.fail(format!("the PV does not name the deletion secret: {ann:?}")));
        }

        // Leader election: upstream's Lease name, the driver's.
        self.lease_renewed(&sanitize(&self.driver_name.replace('/', "-"))).await?;

        // Events: written, and a repeat aggregated into one Event (count >= 2).
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        self.until("ProvisioningSucceeded for data", async |_| {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.involved_object.name.as_deref() == Some("data")
                        && e.reason.as_deref() == Some("ProvisioningSucceeded")
                })
                .then_some(())
        })
        .await?;
        let mut first_seen: BTreeMap<String, i32> = BTreeMap::new();
        let aggregated = self
            .until("a repeated ProvisioningFailed on broken, aggregated by a PATCH", async |_| {
                let list = events.list(&ListParams::default()).await.ok()?;
                let failed: Vec<&Event> = list
                    .items
                    .iter()
                    .filter(|e| {
                        e.involved_object.name.as_deref() == Some("broken")
                            && e.reason.as_deref() == Some("ProvisioningFailed")
                    })
                    .collect();
                // Aggregation is per message: a first failure with another
                // message (the class not yet in the cache) is its own Event.
                let mut per_message: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
                for e in &failed {
                    per_message.entry(e.message.as_deref().unwrap_or_default()).or_default().push(e);
                }
                if let Some(dup) = per_message.values().find(|v| v.len() > 1) {
                    // A second Event object for the same repeat: the count
                    // could not be patched.
                    return Some(Err(dup.len()));
                }
                // The count grew on an Event already written: it was
                // patched (repeats merged before the first write are
                // created with their count, which proves no PATCH).
                let mut grew = false;
                for v in per_message.values() {
                    let (name, count) = (v[0].metadata.name.clone().unwrap_or_default(), v[0].count.unwrap_or(0));
                    let first = *first_seen.entry(name).or_insert(count);
                    grew |= count > first;
                }
                grew.then_some(Ok(()))
            })
            .await?;
        if let Err(n) = aggregated {
            return Err(self.fail(format!(
                "{n} ProvisioningFailed Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        // A clone of data: the source claim and its PV read, the
        // cloning-protection finalizer put on data (and, at data's
        // deletion, removed).
        let mut copy = pvc("copy", Some(&good), "1Mi");
        copy.spec.as_mut().expect("spec").data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "data".into(),
        });
        create(&pvcs, &copy).await;
        // A restore from a pre-provisioned snapshot (the mock's snapshot
        // "1"), made ready as a snapshotter would: the snapshot and its
        // content read, the provisioner's finalizer added and removed.
        let kind = |k: &str| ApiResource::from_gvk(&GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", k));
        let contents: Api<DynamicObject> = Api::all_with(client.clone(), &kind("VolumeSnapshotContent"));
        let snapshots: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kind("VolumeSnapshot"));
        let content = self.ns.scoped("content");
        let obj = |k: &str, mut v: Value| -> DynamicObject {
            v["apiVersion"] = "snapshot.storage.k8s.io/v1".into();
            v["kind"] = k.into();
            serde_json::from_value(v).expect("object")
        };
        let spec = serde_json::json!({
            "metadata": {"name": content},
            "spec": {"deletionPolicy": "Retain", "driver": self.driver_name, "source": {"snapshotHandle": "1"},
                     "volumeSnapshotRef": {"name": "snap", "namespace": ns}}
        });
        create(&contents, &obj("VolumeSnapshotContent", spec)).await;
        let status = serde_json::json!({"status": {"snapshotHandle": "1", "readyToUse": true, "restoreSize": 1 << 20}});
        contents
            .patch_status(&content, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| self.fail(format!("content status: {e}")))?;
        let snap = serde_json::json!({"metadata": {"name": "snap"}, "spec": {"source": {"volumeSnapshotContentName": content}}});
        create(&snapshots, &obj("VolumeSnapshot", snap)).await;
        let mut restored = pvc("restored", Some(&good), "1Mi");
        restored.spec.as_mut().expect("spec").data_source =
            Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: "snap".into(),
            });
        create(&pvcs, &restored).await;
        for claim in ["copy", "restored"] {
            self.until(&format!("PVC {claim} bound"), async |_| {
                (pvcs.get(claim).await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
            })
            .await?;
        }
        self.until("the provisioner's finalizer removed from snap", async |_| {
            let s = snapshots.get("snap").await.ok()?;
            (!s.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f.starts_with("provisioner.storage.kubernetes.io/")))
            .then_some(())
        })
        .await?;
        let data = pvcs.get("data").await.map_err(|e| self.fail(format!("get PVC data: {e}")))?;
        if !data
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "provisioner.storage.kubernetes.io/cloning-protection")
        {
            return Err(self.fail(format!("no cloning-protection finalizer on data: {:?}", data.metadata.finalizers)));
        }
        for claim in ["copy", "restored"] {
            pvcs.delete(claim, &DeleteParams::default())
                .await
                .map_err(|e| self.fail(format!("delete PVC {claim}: {e}")))?;
        }

        self.until("selected-node removed from PVC moved", async |_| {
            let c = pvcs.get("moved").await.ok()?;
            (!c.metadata.annotations.unwrap_or_default().contains_key(SELECTED_NODE)).then_some(())
        })
        .await?;
        pvcs.delete("moved", &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete PVC moved: {e}")))?;

        // Capacity: one object for the late-binding class on the node's
        // segment (created), owned by the pod (its GET); an admin's wrong
        // capacity corrected by the next poll (patch); gone with its class
        // (delete).
        let capacities: Api<k8s_openapi::api::storage::v1::CSIStorageCapacity> = Api::namespaced(client.clone(), &ns);
        let late_name = late.metadata.name.clone().unwrap_or_default();
        let object = self
            .until("a CSIStorageCapacity for the late-binding class", async |_| {
                let list = capacities.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|c| c.storage_class_name == late_name)
            })
            .await?;
        let obj_name = object.metadata.name.clone().unwrap_or_default();
        let owner = object.metadata.owner_references.clone().unwrap_or_default();
        if owner.first().map(|o| (o.kind.as_str(), o.name.as_str())) != Some(("Pod", "provisioner-0")) {
            return Err(self.fail(format!("the CSIStorageCapacity is not owned by the pod: {owner:?}")));
        }
        capacities
            .patch(&obj_name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"capacity": "1"})))
            .await
            .map_err(|e| self.fail(format!("patch the capacity: {e}")))?;
        self.until("the capacity corrected by a poll", async |_| {
            let c = capacities.get(&obj_name).await.ok()?;
            (c.capacity.map(|q| q.0).as_deref() != Some("1")).then_some(())
        })
        .await?;
        classes
            .delete(&late_name, &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete class: {e}")))?;
        self.until("the CSIStorageCapacity deleted with its class", async |_| {
            matches!(capacities.get_opt(&obj_name).await, Ok(None)).then_some(())
        })
        .await?;
        pvcs.delete("broken", &DeleteParams::default())
            .await
            .map_err(|e| self.fail(format!("delete PVC broken: {e}")))?;

        // Delete: DeleteVolume (with the secret), PV deleted, finalizer removed.
        pvcs.delete("data", &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PVC data: {e}")))?;
        self.until("the PV gone", async |_| matches!(pvs.get_opt(&pv_name).await, Ok(None)).then_some(())).await?;
        // data's, copy's and restored's volumes; data went only once the
        // cloning-protection controller released it.
        self.until("DeleteVolume", async |c| (c.calls_ok("DeleteVolume") >= 3).then_some(())).await?;
        if self.calls_ok("CreateVolume") != 3 || self.calls_ok("DeleteVolume") != 3 {
            return Err(self.fail(format!("driver calls:\n{}", self.driver.logs())));
        }
        Ok(())
    }

    /// A pre-bound PV (with a controller-publish secret) used by a Pod on a
    /// Node: the real attach-detach controller creates the VolumeAttachment,
    /// the attacher attaches it (finalizers, node-id annotation, status),
    /// renews its Lease; the Pod goes, the VolumeAttachment is detached and
    /// deleted; the PV is deleted and the attacher releases its finalizer.
    async fn run_attacher(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("publish-creds")).await;
        create(&Api::<Node>::all(client.clone()), &node(&self.node_name, &[])).await;
        create(
            &Api::<CSINode>::all(client.clone()),
            &csi_node(&self.node_name, &self.driver_name, &self.node_name, &[]),
        )
        .await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start.
        let mut pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        if let Some(spec) = pv.spec.as_mut() {
            spec.claim_ref =
                Some(ObjectReference { namespace: Some(ns.clone()), name: Some("data".into()), ..Default::default() });
            if let Some(csi) = spec.csi.as_mut() {
                csi.controller_publish_secret_ref =
                    Some(SecretReference { name: Some("publish-creds".into()), namespace: Some(ns.clone()) });
            }
        }
        create(&pvs, &pv).await;
        let mut claim = pvc("data", None, "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_name = Some(pv_name.clone());
        }
        create(&pvcs, &claim).await;
        self.until("PVC data bound", async |_| {
            (pvcs.get("data").await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
        create(&Api::namespaced(client.clone(), &ns), &pod("app", &self.node_name, "data")).await;

        let finalizer = format!("external-attacher/{}", sanitize(&self.driver_name));
        let va_name = self
            .until("the VolumeAttachment attached", async |_| {
                let list = vas.list(&ListParams::default()).await.ok()?;
                let va = list
                    .items
                    .into_iter()
                    .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()))?;
                va.status.as_ref().is_some_and(|s| s.attached).then_some(())?;
                va.metadata.name
            })
            .await?;
        let va = vas.get(&va_name).await.map_err(|e| self.fail(format!("get VA: {e}")))?;
        if !va.metadata.finalizers.iter().flatten().any(|f| *f == finalizer) {
            return Err(self.fail(format!("the VA lacks {finalizer}: {:?}", va.metadata.finalizers)));
        }
        let pv_now = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV: {e}")))?;
        if !pv_now.metadata.finalizers.iter().flatten().any(|f| *f == finalizer) {
            return Err(self.fail(format!("the PV lacks {finalizer}: {:?}", pv_now.metadata.finalizers)));
        }
        // The controller-publish secret reached the driver.
        if self.calls_ok("ControllerPublishVolume") < 1 {
            return Err(self.fail(format!("no ControllerPublishVolume:\n{}", self.driver.logs())));
        }

        self.lease_renewed(&sanitize(&format!("external-attacher-leader-{}", self.driver_name))).await?;

        // Pod gone: the attach-detach controller deletes the VA, the attacher
        // detaches and removes its finalizer.
        Api::<Pod>::namespaced(client.clone(), &ns)
            .delete("app", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .map_err(|e| self.fail(format!("delete Pod: {e}")))?;
        self.until("the VolumeAttachment gone", async |_| {
            matches!(vas.get_opt(&va_name).await, Ok(None)).then_some(())
        })
        .await?;
        if self.calls_ok("ControllerUnpublishVolume") < 1 {
            return Err(self.fail(format!("no ControllerUnpublishVolume:\n{}", self.driver.logs())));
        }
        // PV deleted: no VA references it, so the attacher releases it.
        pvcs.delete("data", &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PVC: {e}")))?;
        pvs.delete(&pv_name, &DeleteParams::default()).await.map_err(|e| self.fail(format!("delete PV: {e}")))?;
        self.until("the PV gone", async |_| matches!(pvs.get_opt(&pv_name).await, Ok(None)).then_some(())).await?;
        Ok(())
    }

    /// A pre-bound PV (with a controller-expand secret) of an expandable
    /// class: its claim is expanded (PV and claim status), the Lease is
    /// renewed, and a class that does not exist, named again after another
    /// one, gives a repeated (aggregated) event. The driver expands offline only, so pods are watched, and it
    /// can modify, so VolumeAttributesClasses are watched.
    async fn run_resizer(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("expand-creds")).await;
        let sc_name = self.ns.scoped("sc");
        let mut sc = storage_class(&sc_name, &self.driver_name);
        sc.allow_volume_expansion = Some(true);
        create(&Api::<StorageClass>::all(client.clone()), &sc).await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start (100 GiB).
        let mut pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        if let Some(spec) = pv.spec.as_mut() {
            spec.storage_class_name = Some(sc_name.clone());
            spec.claim_ref =
                Some(ObjectReference { namespace: Some(ns.clone()), name: Some("data".into()), ..Default::default() });
            if let Some(csi) = spec.csi.as_mut() {
                csi.controller_expand_secret_ref =
                    Some(SecretReference { name: Some("expand-creds".into()), namespace: Some(ns.clone()) });
            }
        }
        create(&pvs, &pv).await;
        let mut claim = pvc("data", Some(&sc_name), "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_name = Some(pv_name.clone());
        }
        create(&pvcs, &claim).await;
        self.until("PVC data bound", async |_| {
            (pvcs.get("data").await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "200Gi"}}}});
        pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.fail(format!("request 200Gi: {e}")))?;
        self.until("the claim expanded", async |_| {
            let c = pvcs.get("data").await.ok()?;
            (c.status?.capacity?.get("storage")?.0 == "200Gi").then_some(())
        })
        .await?;
        let pv_now = pvs.get(&pv_name).await.map_err(|e| self.fail(format!("get PV: {e}")))?;
        let cap = pv_now.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        if cap.map(|q| q.0).as_deref() != Some("200Gi") {
            return Err(self.fail("the PV capacity was not updated"));
        }
        if self.calls_ok("ControllerExpandVolume") != 1 {
            return Err(self.fail(format!(
                "not one ControllerExpandVolume:
{}",
                self.driver.logs()
            )));
        }
        self.lease_renewed(&sanitize(&format!("external-resizer-{}", sanitize(&self.driver_name)))).await?;
        // A class that does not exist: a Warning and a Pending mark, no retry
        // (as upstream). The same class named again after another one gives
        // the same Warning again, aggregated (events PATCH).
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let missing_failures = async |class: &str| -> Option<Vec<Event>> {
            let list = events.list(&ListParams::default()).await.ok()?;
            let text = format!("VAC \"{class}\" does not exist.");
            Some(
                list.items
                    .into_iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some("VolumeModifyFailed") && e.message.as_deref() == Some(&text)
                    })
                    .collect(),
            )
        };
        for class in ["missing", "missing-too"] {
            let patch = serde_json::json!({"spec": {"volumeAttributesClassName": class}});
            pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await
                .map_err(|e| self.fail(format!("set the class {class}: {e}")))?;
            self.until(&format!("a VolumeModifyFailed event for {class}"), async |_| {
                (!missing_failures(class).await?.is_empty()).then_some(())
            })
            .await?;
        }
        let patch = serde_json::json!({"spec": {"volumeAttributesClassName": "missing"}});
        pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.fail(format!("set the class missing again: {e}")))?;
        // Aggregated: one Event whose count grows. Without the PATCH the
        // recorder creates a new Event per repeat instead.
        let aggregated = self
            .until("a repeated VolumeModifyFailed event", async |_| {
                let failed = missing_failures("missing").await?;
                if failed.len() >= 2 {
                    return Some(Err(failed.len()));
                }
                failed.iter().any(|e| e.count.unwrap_or(1) >= 2).then_some(Ok(()))
            })
            .await?;
        if let Err(n) = aggregated {
            return Err(self.fail(format!(
                "{n} VolumeModifyFailed Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        Ok(())
    }

    /// A snapshot of a bound claim with a snapshotter secret: created
    /// (annotation, status), the Lease renewed, deleted through the driver
    /// (status cleared, finalizer removed); then a pre-provisioned content
    /// whose deletion secret is missing gives a repeated (aggregated)
    /// SnapshotDeleteError until the secret appears.
    async fn run_snapshotter(&mut self) -> Result<(), Failure> {
        use csi_sidecar_integration::snapshots::{SnapApis, obj, ready};
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let snaps = SnapApis::new(&client, &ns);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("snap-creds")).await;
        let sc_name = self.ns.scoped("sc");
        create(&Api::<StorageClass>::all(client.clone()), &storage_class(&sc_name, &self.driver_name)).await;
        let pv_name = self.ns.scoped("pv");
        // Volume "1" exists in the mock driver from its start.
        let mut pv = csi_pv(&pv_name, &self.driver_name, "1", "1Mi");
        if let Some(spec) = pv.spec.as_mut() {
            spec.storage_class_name = Some(sc_name.clone());
            spec.claim_ref =
                Some(ObjectReference { namespace: Some(ns.clone()), name: Some("data".into()), ..Default::default() });
        }
        create(&pvs, &pv).await;
        let mut claim = pvc("data", Some(&sc_name), "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_name = Some(pv_name.clone());
        }
        create(&pvcs, &claim).await;
        self.until("PVC data bound", async |_| {
            (pvcs.get("data").await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
        let class = self.ns.scoped("vsc");
        let params = serde_json::json!({
            "csi.storage.k8s.io/snapshotter-secret-name": "snap-creds",
            "csi.storage.k8s.io/snapshotter-secret-namespace": ns,
        });
        snaps.class(&class, &self.driver_name, "Delete", params).await;
        let retain = self.ns.scoped("vsc-retain");
        snaps.class(&retain, &self.driver_name, "Retain", serde_json::Value::Null).await;
        let content = snaps.snapshot_of("snap", &class, "data").await;
        let kept = snaps.snapshot_of("kept", &retain, "data").await;
        let handle = self
            .until("both contents ready", async |_| {
                let a = snaps.contents.get(&content).await.ok()?;
                let b = snaps.contents.get(&kept).await.ok()?;
                (ready(&a) && ready(&b)).then(|| b.data["status"]["snapshotHandle"].as_str().map(str::to_string))?
            })
            .await?;
        self.lease_renewed(&sanitize(&format!("external-snapshotter-leader-{}", self.driver_name))).await?;
        let gone = async |name: &str| snaps.contents.get_opt(name).await.ok().and_then(|c| c.is_none().then_some(()));
        snaps.delete_snapshot("snap").await;
        self.until("the Delete content gone", async |_| gone(&content).await).await?;
        if self.calls_ok("DeleteSnapshot") != 1 {
            return Err(self.fail(format!("not one DeleteSnapshot:\n{}", self.driver.logs())));
        }
        // A pre-provisioned content of the retained snapshot, whose deletion
        // secret does not exist (yet): each deletion attempt fails the same way.
        let stat = self.ns.scoped("static");
        let v = serde_json::json!({"metadata": {"name": stat,
                "finalizers": ["snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"],
                "annotations": {"snapshot.storage.kubernetes.io/deletion-secret-name": "late-creds",
                                "snapshot.storage.kubernetes.io/deletion-secret-namespace": ns}},
            "spec": {"deletionPolicy": "Delete", "driver": self.driver_name, "source": {"snapshotHandle": handle},
                     "volumeSnapshotRef": {"name": "nobody", "namespace": ns}}});
        snaps
            .contents
            .create(&PostParams::default(), &obj("VolumeSnapshotContent", v))
            .await
            .map_err(|e| self.fail(format!("create the static content: {e}")))?;
        self.until("the static content ready (ListSnapshots)", async |_| {
            snaps.contents.get(&stat).await.ok().filter(ready).map(|_| ())
        })
        .await?;
        let _ = snaps.contents.delete(&stat, &DeleteParams::default()).await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let aggregated = self
            .until("a repeated SnapshotDeleteError event", async |_| {
                let lp = ListParams::default().fields(&format!("involvedObject.name={stat}"));
                let list = events.list(&lp).await.ok()?;
                let failed: Vec<_> =
                    list.items.iter().filter(|e| e.reason.as_deref() == Some("SnapshotDeleteError")).collect();
                if failed.len() >= 2 {
                    return Some(Err(failed.len()));
                }
                failed.iter().any(|e| e.count.unwrap_or(1) >= 2).then_some(Ok(()))
            })
            .await?;
        if let Err(n) = aggregated {
            return Err(self.fail(format!(
                "{n} SnapshotDeleteError Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        create(&Api::namespaced(client.clone(), &ns), &Self::secret("late-creds")).await;
        self.until("the static content gone", async |_| gone(&stat).await).await?;
        snaps.delete_snapshot("kept").await;
        let _ = snaps.contents.delete(&kept, &DeleteParams::default()).await;
        self.until("the retained content gone", async |_| gone(&kept).await).await?;
        if self.calls_ok("DeleteSnapshot") != 2 {
            return Err(self.fail(format!("not two DeleteSnapshot calls:\n{}", self.driver.logs())));
        }
        snaps.delete_class(&class).await;
        snaps.delete_class(&retain).await;
        Ok(())
    }

    /// The health monitor with a CSI 1.13 driver and the node watcher: a
    /// pre-bound claim of the driver (the dry-run status question asked),
    /// its volume abnormal, healthy, abnormal again with the same message
    /// (events, the repeat aggregated by a PATCH; `status.healthStatus`
    /// where the apiserver serves it), a pod of the claim on a node that
    /// fails, recovers and fails again (NodeFailed, aggregated), the Lease
    /// renewed.
    async fn run_health_monitor(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let nodes: Api<Node> = Api::all(client.clone());
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let claims_status: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<PersistentVolumeClaim>(&()));
        // A volume given a health is known to the fault driver's health calls.
        let volume = "health-1";
        self.driver.fault().set_volume_health(volume, vec![]);
        let pv_name = self.ns.scoped("pv");
        let mut pv = csi_pv(&pv_name, &self.driver_name, volume, "1Mi");
        if let Some(spec) = pv.spec.as_mut() {
            spec.claim_ref =
                Some(ObjectReference { namespace: Some(ns.clone()), name: Some("data".into()), ..Default::default() });
        }
        create(&pvs, &pv).await;
        let mut claim = pvc("data", None, "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_name = Some(pv_name.clone());
        }
        create(&pvcs, &claim).await;
        self.until("PVC data bound", async |_| {
            (pvcs.get("data").await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await?;
        // The dry-run question, asked at the first pass over the claim (and
        // refused without the optional claim status rule: events).
        let served = self
            .until("the answer whether status.healthStatus is served", async |c| {
                let log = c.sidecar.logs();
                if log.contains("status.healthStatus is served") {
                    Some(true)
                } else {
                    (log.contains("status.healthStatus is not served") || log.contains(CLAIM_STATUS_REFUSED))
                        .then_some(false)
                }
            })
            .await?;
        let of_data = async |reason: &str| -> Option<Vec<Event>> {
            let list = events.list(&ListParams::default()).await.ok()?;
            let mine = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("data") && e.reason.as_deref() == Some(reason));
            Some(mine.collect())
        };
        let health_status = async || -> Option<Value> {
            let c = claims_status.get("data").await.ok()?;
            Some(c.data["status"]["healthStatus"].clone())
        };
        let abnormal =
            || vec![HealthCondition { status: HealthStatus::Degraded, reason: String::new(), message: "gone".into() }];
        self.driver.fault().set_volume_health(volume, abnormal());
        if served {
            self.until("status.healthStatus written", async |_| {
                health_status().await?["healthConditions"].as_array().filter(|a| !a.is_empty()).map(|_| ())
            })
            .await?;
        } else {
            self.until("a VolumeConditionAbnormal event", async |_| {
                (!of_data("VolumeConditionAbnormal").await?.is_empty()).then_some(())
            })
            .await?;
        }
        self.driver.fault().set_volume_health(volume, vec![]);
        if served {
            self.until("status.healthStatus cleared", async |_| health_status().await?.is_null().then_some(())).await?;
        } else {
            self.until("a VolumeConditionNormal event", async |_| {
                (!of_data("VolumeConditionNormal").await?.is_empty()).then_some(())
            })
            .await?;
        }
        // Abnormal again with the same message: on the events form the same
        // Event again, aggregated (a PATCH of its count).
        self.driver.fault().set_volume_health(volume, abnormal());
        let aggregated = async |reason: &str| -> Option<Result<(), usize>> {
            let seen = of_data(reason).await?;
            if seen.len() >= 2 {
                // A second Event for the same repeat: the count could not be patched.
                return Some(Err(seen.len()));
            }
            seen.iter().any(|e| e.count.unwrap_or(1) >= 2).then_some(Ok(()))
        };
        if served {
            self.until("status.healthStatus written again", async |_| {
                health_status().await?["healthConditions"].as_array().filter(|a| !a.is_empty()).map(|_| ())
            })
            .await?;
        } else {
            let repeat = self
                .until("a repeated VolumeConditionAbnormal event", async |_| {
                    aggregated("VolumeConditionAbnormal").await
                })
                .await?;
            if let Err(n) = repeat {
                return Err(self.fail(format!(
                    "{n} VolumeConditionAbnormal Events with one message for one repeated report: the \
                     aggregation PATCH failed"
                )));
            }
        }
        // The node watcher: a pod of the claim on a node NotReady for ten
        // minutes (heartbeat now: the node lifecycle controller leaves it be).
        let node_name = self.node_name.clone();
        create(&nodes, &node(&node_name, &[])).await;
        let set_ready = async |status: &str, minutes_ago: i64| {
            let now = k8s_openapi::jiff::Timestamp::now();
            let since = now - k8s_openapi::jiff::SignedDuration::from_mins(minutes_ago);
            let patch = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": status,
                "reason": "Test", "lastHeartbeatTime": now.to_string(), "lastTransitionTime": since.to_string()}]}});
            nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(drop_ok)
        };
        set_ready("True", 60).await.map_err(|e| self.fail(format!("node Ready: {e}")))?;
        create(&Api::<Pod>::namespaced(client.clone(), &ns), &pod("app", &node_name, "data")).await;
        set_ready("False", 10).await.map_err(|e| self.fail(format!("node NotReady: {e}")))?;
        self.until("a NodeFailed event", async |_| (!of_data("NodeFailed").await?.is_empty()).then_some(())).await?;
        // Recovered, then failed again: the same NodeFailed Event, aggregated
        // (a PATCH whichever form the volume health takes).
        set_ready("True", 0).await.map_err(|e| self.fail(format!("node Ready again: {e}")))?;
        self.until("a NodeRecovered event", async |_| (!of_data("NodeRecovered").await?.is_empty()).then_some(()))
            .await?;
        set_ready("False", 10).await.map_err(|e| self.fail(format!("node NotReady again: {e}")))?;
        let repeat = self.until("a repeated NodeFailed event", async |_| aggregated("NodeFailed").await).await?;
        if let Err(n) = repeat {
            return Err(self.fail(format!(
                "{n} NodeFailed Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        self.lease_renewed(&sanitize(&format!("external-health-monitor-leader-{}", self.driver_name))).await?;
        let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
        Ok(())
    }

    async fn finish(mut self) {
        self.sidecar.terminate().await;
        self.ns.delete().await;
    }
}

async fn runs_under_the_manifests(module: Module) {
    let cp = module.control_plane(false);
    let mut c = Cycle::start(cp, module, Rules::Manifest).await;
    if let Err(f) = c.run().await {
        panic!(
            "the {} under manifests/rbac failed: {}\n----- csi-sidecar log -----\n{}",
            module.name(),
            f.reason,
            f.log
        );
    }
    let log = c.sidecar.logs();
    let refused: Vec<&str> = log.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
    if module == Module::HealthMonitor {
        // Without the optional claim status rule: refused once, one info
        // line, and the volume health went out as events.
        assert_eq!(refused.len(), 1, "{log}");
        assert!(refused[0].contains(CLAIM_STATUS_REFUSED) && refused[0].contains(" INFO "), "{log}");
    } else {
        assert!(refused.is_empty(), "{log}");
    }
    assert!(log.contains("successfully acquired lease"), "{log}");
    c.finish().await;
}

/// The health monitor with the optional claim status rule (the chart's
/// `patchClaimStatus: true`): its dry-run question is answered, nothing is
/// refused.
#[tokio::test]
async fn health_monitor_runs_with_the_optional_claim_status_rule() {
    let status = set(&[HEALTH_MONITOR_CLAIM_STATUS]).into_iter().next().expect("the rule");
    let mut c = Cycle::start(ControlPlane::shared(), Module::HealthMonitor, Rules::With(&status)).await;
    if let Err(f) = c.run().await {
        panic!("the health monitor with the claim status rule failed: {}\n----- log -----\n{}", f.reason, f.log);
    }
    let log = c.sidecar.logs();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    assert!(
        log.contains("status.healthStatus is served") || log.contains("status.healthStatus is not served"),
        "{log}"
    );
    c.finish().await;
}

#[tokio::test]
async fn provisioner_runs_under_exactly_the_manifests_rbac() {
    runs_under_the_manifests(Module::Provisioner).await;
}

#[tokio::test]
async fn attacher_runs_under_exactly_the_manifests_rbac() {
    runs_under_the_manifests(Module::Attacher).await;
}

#[tokio::test]
async fn snapshotter_runs_under_exactly_the_manifests_rbac() {
    runs_under_the_manifests(Module::Snapshotter).await;
}

#[tokio::test]
async fn resizer_runs_under_exactly_the_manifests_rbac() {
    runs_under_the_manifests(Module::Resizer).await;
}

#[tokio::test]
async fn health_monitor_runs_under_exactly_the_manifests_rbac() {
    runs_under_the_manifests(Module::HealthMonitor).await;
}

/// A control plane whose kube-apiserver runs without the WatchList feature
/// (the informers fall back to LIST there), shared by this binary's tests.
fn without_streaming_lists() -> &'static ControlPlane {
    static CP: std::sync::OnceLock<ControlPlane> = std::sync::OnceLock::new();
    CP.get_or_init(|| {
        ControlPlane::spawn_launcher(&launcher_bin(), &["--apiserver-arg", "--feature-gates=WatchList=false"])
            .unwrap_or_else(|e| panic!("a control plane without WatchList: {e:#}"))
    })
}

/// Like [`without_streaming_lists`], with the snapshot CRDs and
/// snapshot-controller.
fn snapshots_without_streaming_lists() -> &'static ControlPlane {
    static CP: std::sync::OnceLock<ControlPlane> = std::sync::OnceLock::new();
    CP.get_or_init(|| {
        ControlPlane::spawn_launcher(
            &launcher_bin(),
            &["--snapshots", "--apiserver-arg", "--feature-gates=WatchList=false"],
        )
        .unwrap_or_else(|e| panic!("a control plane with snapshots without WatchList: {e:#}"))
    })
}

/// Every verb the live run exercises is needed: without it, the run fails
/// with the apiserver refusing exactly that verb.
async fn every_exercised_verb_is_needed(module: Module) {
    let exercised = module.exercised();
    // A few at a time: each run starts a driver and a csi-sidecar.
    let mut failures = Vec::new();
    for batch in exercised.chunks(4) {
        let runs = batch.iter().map(|t| async move {
            // The informers list only where the apiserver refuses streaming
            // lists: `list` is shown needed on such an apiserver.
            let cp = module.control_plane(t.2 == "list");
            let mut c = Cycle::start(cp, module, Rules::Without(t)).await;
            let outcome = c.run().await;
            c.finish().await;
            (t.clone(), outcome)
        });
        for (t, outcome) in futures::future::join_all(runs).await {
            let (g, r, v) = &t;
            let evidence = if (r.as_str(), v.as_str()) == ("events", "patch") {
                // The recorder falls back to a new Event when the PATCH fails.
                "the aggregation PATCH failed".to_string()
            } else {
                format!("cannot {v} resource \"{r}\" in API group \"{g}\"")
            };
            match outcome {
                Ok(()) => failures.push(format!("({g:?}, {r}, {v}) removed, yet the run succeeded")),
                // Some refusals are logged in Debug form (quotes escaped).
                Err(f) if f.reason.replace("\\\"", "\"").contains(&evidence) => {
                    eprintln!("{}: ({g:?}, {r}, {v}) removed: {}", module.name(), f.reason)
                }
                Err(f) => failures.push(format!(
                    "({g:?}, {r}, {v}) removed: failed without the expected evidence {evidence:?}: {}\n{}",
                    f.reason, f.log
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// 36 triples: all of the provisioner's (6 of capacity tracking).
#[tokio::test]
async fn provisioner_fails_without_any_one_exercised_verb() {
    assert_eq!(Module::Provisioner.exercised().len(), 36);
    every_exercised_verb_is_needed(Module::Provisioner).await;
}

/// 13 triples: all of the attacher's.
#[tokio::test]
async fn attacher_fails_without_any_one_exercised_verb() {
    assert_eq!(Module::Attacher.exercised().len(), 13);
    every_exercised_verb_is_needed(Module::Attacher).await;
}

/// 16 triples: all of the resizer's.
#[tokio::test]
async fn resizer_fails_without_any_one_exercised_verb() {
    assert_eq!(Module::Resizer.exercised().len(), 16);
    every_exercised_verb_is_needed(Module::Resizer).await;
}

/// 17 triples: the snapshotter's but the three group-content writes.
#[tokio::test]
async fn snapshotter_fails_without_any_one_exercised_verb() {
    assert_eq!(Module::Snapshotter.exercised().len(), 17);
    every_exercised_verb_is_needed(Module::Snapshotter).await;
}

/// 14 triples: all of the health monitor's (the optional claim status
/// rule is not one: without it, events).
#[tokio::test]
async fn health_monitor_fails_without_any_one_exercised_verb() {
    assert_eq!(Module::HealthMonitor.exercised().len(), 14);
    every_exercised_verb_is_needed(Module::HealthMonitor).await;
}
