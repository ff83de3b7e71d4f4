//! The live runs' harness: a cycle, one run of a controller module under
//! the manifests' RBAC (or with one triple less or more), and the control
//! planes it runs on.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use csi_sidecar_integration::yaml::{documents as load, kind};
use csi_sidecar_integration::{
    cluster::{ControlPlane, Identity, launcher_bin},
    component_bin,
    fault_driver::{FaultDriver, HealthForms, Script, Transport},
    kube_support::{TestNamespace, create, pvc, unique_name},
    process::Proc,
    sidecar_bin, workspace_root,
};
use k8s_openapi::{
    ByteString,
    api::{
        coordination::v1::Lease,
        core::v1::{Event, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
        storage::v1::VolumeAttachment,
    },
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::Value;

use super::{CAPACITY_CALLS, CLAIM_STATUS_REFUSED, LEADER_ELECTION_CALLS, Triple, name, rbac_file, row_calls, set};

pub const CONTROLLER_SA: &str = "csi-sidecar-controller";
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The mock driver's topology key (`--enable-topology`).
pub const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";
const STEP: Duration = Duration::from_secs(45);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Module {
    Provisioner,
    Attacher,
    Resizer,
    Snapshotter,
    HealthMonitor,
}

impl Module {
    pub fn name(self) -> &'static str {
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
    pub fn control_plane(self, list: bool) -> &'static ControlPlane {
        match (self, list) {
            // The provisioner's restores need the snapshot CRDs too.
            (Module::Snapshotter | Module::Provisioner, false) => ControlPlane::with_snapshots(),
            (Module::Snapshotter | Module::Provisioner, true) => snapshots_without_streaming_lists(),
            (_, false) => ControlPlane::shared(),
            (_, true) => without_streaming_lists(),
        }
    }

    /// The triples the live run exercises: all of the module's.
    pub fn exercised(self) -> Vec<Triple> {
        let calls = row_calls(self.name());
        // The mock driver has no GroupController: the snapshotter's live run
        // lists and watches the group kinds but writes no group content.
        // Those writes are proven sufficient and needed under this manifest by
        // integration/tests/snapshots/group_snapshots.rs (fault driver).
        let unexercised = [
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "get"),
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "patch"),
            ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch"),
        ];
        let skip = set(&unexercised);
        let capacity = if self == Module::Provisioner { CAPACITY_CALLS } else { &[] };
        calls.into_iter().filter(|t| !skip.contains(t)).chain(set(LEADER_ELECTION_CALLS)).chain(set(capacity)).collect()
    }
}

/// How the rules of a cycle differ from the manifest's.
#[derive(Clone, Copy, Debug)]
pub enum Rules<'a> {
    /// Exactly the manifest's.
    Manifest,
    /// Without one triple.
    Without(&'a Triple),
    /// With one more triple in the module's ClusterRole (a rule the
    /// manifest leaves commented out).
    With(&'a Triple),
    /// The module's ClusterRole with upstream's rules instead of ours (the
    /// `rules` of a file in integration/testdata/upstream-rbac/).
    Upstream(&'a str),
}

/// Applies the module's file of manifests/rbac plus the ServiceAccount and
/// the module's bindings from controller.yaml (only this module's rules, so
/// another module's cannot mask a missing verb) into namespace `ns`:
/// namespaced objects move to `ns`, cluster-scoped names get `ns` as prefix.
/// `change`: the manifest's rules, or without or with one triple.
pub async fn apply_rbac(client: &Client, ns: &str, module: &str, change: Rules<'_>) {
    let mut docs = load(&rbac_file(&format!("{module}.yaml")));
    docs.extend(load(&rbac_file("controller.yaml")));
    let mut applied = 0;
    for mut d in docs {
        let component = d["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap_or_default().to_string();
        if component != module && component != "controller" {
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
        if let (Rules::Upstream(file), "ClusterRole", true) = (change, k.as_str(), component == module) {
            let path = workspace_root().join("integration/testdata/upstream-rbac").join(file);
            let upstream =
                load(&path).into_iter().next().unwrap_or_else(|| panic!("no document in {}", path.display()));
            d["rules"] = upstream["rules"].clone();
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
    // ServiceAccount, ClusterRole and its binding; a module that leads (its
    // row says) has the Lease Role and its binding; the provisioner also the
    // capacity Role and its binding.
    let leads = csi_sidecar::modules::lookup(module).is_some_and(|m| m.leads());
    let want = 3 + if leads { 2 } else { 0 } + if module == "provisioner" { 2 } else { 0 };
    assert_eq!(applied, want, "{module}: ServiceAccount, ClusterRole, Role(s) and their bindings");
}

pub fn drop_ok<T>(_: T) {}

/// Upstream's Lease name sanitizing (csi-lib-utils).
pub fn sanitize(name: &str) -> String {
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
pub fn tolerated_refusal(line: &str) -> bool {
    line.contains("refuses streaming lists") || line.contains(CLAIM_STATUS_REFUSED)
}

/// One run of a module under the manifests' RBAC. Err carries the reason
/// (for a refused verb: the apiserver's message) and the sidecar's log.
pub struct Cycle {
    module: Module,
    pub ns: TestNamespace,
    pub driver: Driver,
    pub sidecar: Proc,
    pub driver_name: String,
    pub node_name: String,
    /// Refusals this run expects besides [`tolerated_refusal`]'s (phrases of
    /// the lines that report them).
    pub expected_refusals: &'static [&'static str],
    _dir: tempfile::TempDir,
}

/// The driver of a cycle: the Kubernetes CSI mock driver (a process), or,
/// for the health monitor, the in-process fault driver (the mock reports no
/// volume health).
pub enum Driver {
    Mock(Proc),
    Fault(FaultDriver),
}

impl Driver {
    /// The mock's log (its gRPC calls); the fault driver keeps counters instead.
    pub fn logs(&self) -> String {
        match self {
            Driver::Mock(p) => p.logs(),
            Driver::Fault(f) => format!("{:?}", f.counters),
        }
    }

    pub fn fault(&self) -> &FaultDriver {
        match self {
            Driver::Fault(f) => f,
            Driver::Mock(_) => panic!("not the fault driver"),
        }
    }
}

#[derive(Debug)]
pub struct Failure {
    pub reason: String,
    pub log: String,
}

impl Cycle {
    pub async fn start(cp: &ControlPlane, module: Module, change: Rules<'_>) -> Cycle {
        let admin = cp.client().await;
        let ns = TestNamespace::new(&admin, &format!("rbac-{}", &module.name()[..4])).await;
        apply_rbac(&admin, ns.name(), module.name(), change).await;
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
        Cycle { module, ns, driver, sidecar, driver_name, node_name, expected_refusals: &[], _dir: dir }
    }

    pub fn fail(&self, reason: impl Into<String>) -> Failure {
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
                .filter(|l| !self.expected_refusals.iter().any(|phrase| l.contains(phrase)))
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
    pub async fn until<T>(&mut self, what: &str, mut probe: impl AsyncFnMut(&Self) -> Option<T>) -> Result<T, Failure> {
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

    pub fn calls_ok(&self, method: &str) -> usize {
        self.driver.logs().lines().filter(|l| l.contains(&format!("/{method} -> OK"))).count()
    }

    pub async fn run(&mut self) -> Result<(), Failure> {
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
    pub async fn lease_renewed(&mut self, lease: &str) -> Result<(), Failure> {
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

    /// Waits until a failure repeated on one object shows as one Event of
    /// `reason` whose count grows (the recorder's aggregation PATCH); fails
    /// when it shows as several Events instead. `events` lists the
    /// candidates.
    pub async fn until_aggregated(
        &mut self,
        reason: &str,
        mut events: impl AsyncFnMut() -> Option<Vec<Event>>,
    ) -> Result<(), Failure> {
        let aggregated = self
            .until(&format!("a repeated {reason} event"), async |_| {
                let failed: Vec<Event> =
                    events().await?.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect();
                if failed.len() >= 2 {
                    return Some(Err(failed.len()));
                }
                failed.iter().any(|e| e.count.unwrap_or(1) >= 2).then_some(Ok(()))
            })
            .await?;
        if let Err(n) = aggregated {
            return Err(self.fail(format!(
                "{n} {reason} Events with one message for one repeated failure: the aggregation PATCH failed"
            )));
        }
        Ok(())
    }

    /// Creates `pv` bound in advance to the claim `data` of the cycle's
    /// namespace (of `class`, if any), then that claim, and waits until it
    /// is Bound.
    pub async fn pre_bound_claim(&mut self, mut pv: PersistentVolume, class: Option<&str>) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        if let Some(spec) = pv.spec.as_mut() {
            if let Some(class) = class {
                spec.storage_class_name = Some(class.to_string());
            }
            spec.claim_ref =
                Some(ObjectReference { namespace: Some(ns.clone()), name: Some("data".into()), ..Default::default() });
        }
        create(&Api::<PersistentVolume>::all(client.clone()), &pv).await;
        let mut claim = pvc("data", class, "1Mi");
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_name = Some(pv_name);
        }
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, &ns);
        create(&pvcs, &claim).await;
        self.until("PVC data bound", async |_| {
            (pvcs.get("data").await.ok()?.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await
    }

    pub fn secret(name: &str) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            data: Some(BTreeMap::from([("password".to_string(), ByteString(b"hunter2".to_vec()))])),
            ..Default::default()
        }
    }

    pub async fn finish(mut self) {
        self.sidecar.terminate().await;
        self.ns.delete().await;
    }
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
pub fn snapshots_without_streaming_lists() -> &'static ControlPlane {
    static CP: std::sync::OnceLock<ControlPlane> = std::sync::OnceLock::new();
    CP.get_or_init(|| {
        ControlPlane::spawn_launcher(
            &launcher_bin(),
            &["--snapshots", "--apiserver-arg", "--feature-gates=WatchList=false"],
        )
        .unwrap_or_else(|e| panic!("a control plane with snapshots without WatchList: {e:#}"))
    })
}
