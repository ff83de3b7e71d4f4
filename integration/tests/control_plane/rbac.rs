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
//! * snapshot-metadata (`rbac/snapshot_metadata.rs`): a backup's calls
//!   answered under exactly its ClusterRole, and refused without any one of
//!   its triples.

use std::{collections::BTreeSet, path::PathBuf};

use csi_sidecar_integration::yaml::{documents as load, kind};
use csi_sidecar_integration::{cluster::ControlPlane, workspace_root};
use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

mod attacher;
mod cycle;
mod health_monitor;
mod provisioner;
mod resizer;
mod snapshot_metadata;
mod snapshotter;

use cycle::{Cycle, Module, Rules};

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

/// src/k8s/leader.rs: `get_opt`, `create`, `replace` of the Lease.
const LEADER_ELECTION_CALLS: &[(&str, &str, &str)] = &[
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
];

/// What a controller module calls cluster-wide: its row's ClusterRole
/// rules (each with where the code calls it, in the module's
/// `config.rs`), as triples. `manifests.rs` checks the manifests against
/// the rows; the live runs here prove each triple needed and sufficient.
fn row_calls(module: &str) -> BTreeSet<Triple> {
    let row = csi_sidecar::modules::lookup(module).unwrap_or_else(|| panic!("no module {module}"));
    let triples = row.cluster_rules.iter().flat_map(|rule| rule.triples());
    triples.map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect()
}

/// Each controller module's Lease Role is exactly what the elector calls.
#[test]
fn each_controllers_leader_election_role_is_exactly_what_the_code_calls() {
    let controllers = csi_sidecar::modules::MODULES.iter().filter(|m| m.leads());
    for m in controllers {
        let role = doc(&format!("{}.yaml", m.name), "Role", &format!("csi-sidecar-{}-leader-election", m.name));
        assert_eq!(role["metadata"]["namespace"], "default", "{}: namespace placeholder", m.name);
        assert_eq!(triples(&role), set(LEADER_ELECTION_CALLS), "{}", m.name);
        assert!(!row_calls(m.name).is_empty(), "{}: a controller row without rules", m.name);
    }
}

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

/// The health monitor's optional claim status rule: in the manifest,
/// commented out.
#[test]
fn the_health_monitors_optional_rule_is_commented_out() {
    assert_eq!(commented_out("health-monitor.yaml"), set(&[HEALTH_MONITOR_CLAIM_STATUS]));
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
        "CachedNode" => "Node", // src/k8s/cached_node.rs
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
        "modules/snapshot_metadata",
        "k8s",
        "k8s/leader",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            // snapshot-metadata's client and lister tool run with the
            // caller's credentials (a backup's, an operator's), not the
            // module's.
            let tool = ["client.rs", "lister.rs"].iter().any(|f| path.ends_with(format!("snapshot_metadata/{f}")));
            if tool {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            // Test modules use fakes; only the code before them counts.
            found.extend(kinds_in(text.split("#[cfg(test)]").next().unwrap_or_default()));
        }
    }
    let covered: BTreeSet<String> = [
        "K", // src/k8s/informers.rs: the generic informer (its kinds are listed here by their modules)
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
        // snapshot-metadata: each request's reviews, the CR.
        "TokenReview",
        "SubjectAccessReview",
        "SnapshotMetadataService",
        // src/k8s/access.rs: what the process's own role allows, a question
        // every authenticated user may ask (system:basic-user): no rule.
        "SelfSubjectAccessReview",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    let new: Vec<_> = found.difference(&covered).collect();
    assert!(
        new.is_empty(),
        "kinds used in src/ that manifests/rbac does not cover: {new:?} (found {found:?}). Grant the verbs the \
         code uses in manifests/rbac/<module>.yaml and manifests/helm/csi-sidecar/templates/rbac.yaml, list them \
         in the module's CLUSTER_RULES (its config.rs), and add the kind here"
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

/// The debug line of a patch the role refused, written as an update.
const PATCH_REFUSED_UPDATE_INSTEAD: &str = "Patch refused; writing the object with an update instead";
/// The info line of a restore whose snapshot the role may not write.
const RESTORE_WITHOUT_SNAPSHOT_FINALIZER: &str = "Restoring without the snapshot's source-protection finalizer";

/// Drop-in: an operator who swaps the image keeps upstream's RBAC. The
/// provisioner's whole run (the reschedule's claim write included) works
/// under upstream external-provisioner's ClusterRole, which grants `update`
/// where csi-sidecar's grants `patch` on claims, and no `watch` on
/// VolumeSnapshots.
#[tokio::test]
async fn provisioner_runs_under_upstreams_rbac() {
    let module = Module::Provisioner;
    let mut c = Cycle::start(module.control_plane(false), module, Rules::Upstream("external-provisioner.yaml")).await;
    let sweep_off = csi_sidecar::modules::provisioner::SWEEP_OFF_WITHOUT_WATCH;
    const EXPECTED: &[&str] = &[
        PATCH_REFUSED_UPDATE_INSTEAD,
        RESTORE_WITHOUT_SNAPSHOT_FINALIZER,
        csi_sidecar::modules::provisioner::SWEEP_OFF_WITHOUT_WATCH,
    ];
    c.expected_refusals = EXPECTED;
    if let Err(f) = c.run().await {
        panic!("the provisioner under upstream's RBAC failed: {}\n----- csi-sidecar log -----\n{}", f.reason, f.log);
    }
    let log = c.sidecar.logs();
    // The claim writes went out as updates (the reschedule, the clone
    // source's finalizer on and off), the restore went on without writing
    // its snapshot, and the sweep said once that it is off.
    let updates = log.lines().filter(|l| l.contains(PATCH_REFUSED_UPDATE_INSTEAD)).count();
    assert!(updates >= 3, "{updates} claim writes fell back to an update:\n{log}");
    assert!(log.contains(RESTORE_WITHOUT_SNAPSHOT_FINALIZER), "{log}");
    assert_eq!(log.matches(sweep_off).count(), 1, "{log}");
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

/// What a run of `module` without triple `t` shows: None when it failed
/// with the apiserver refusing exactly that triple (printed), else why not.
fn without_triple_verdict(module: &str, t: &Triple, outcome: Result<(), cycle::Failure>) -> Option<String> {
    let (g, r, v) = t;
    let evidence = if (r.as_str(), v.as_str()) == ("events", "patch") {
        // The recorder falls back to a new Event when the PATCH fails.
        "the aggregation PATCH failed".to_string()
    } else if r == "volumesnapshots" && matches!(v.as_str(), "list" | "watch") {
        // The provisioner asks first, and leaves the sweep off.
        format!("{} verb=\"{v}\"", csi_sidecar::modules::provisioner::SWEEP_OFF_WITHOUT_WATCH)
    } else {
        format!("cannot {v} resource \"{r}\" in API group \"{g}\"")
    };
    match outcome {
        Ok(()) => Some(format!("({g:?}, {r}, {v}) removed, yet the run succeeded")),
        // Some refusals are logged in Debug form (quotes escaped).
        Err(f) if f.reason.replace("\\\"", "\"").contains(&evidence) => {
            eprintln!("{module}: ({g:?}, {r}, {v}) removed: {}", f.reason);
            None
        }
        Err(f) => Some(format!(
            "({g:?}, {r}, {v}) removed: failed without the expected evidence {evidence:?}: {}\n{}",
            f.reason, f.log
        )),
    }
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
            failures.extend(without_triple_verdict(module.name(), &t, outcome));
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
