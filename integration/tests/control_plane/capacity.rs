//! Storage capacity tracking (`provisioner --enable-capacity`) against the
//! real control plane, with the fault driver (the CSI mock driver answers
//! GetCapacity with one constant, whatever the segment, and cannot give a
//! bad answer): CSIStorageCapacity objects per segment × class, following
//! provisioning and deletion, going with their class, coming with a new
//! node; the owner walk; unusable answers and bad start-up input.

use std::{collections::BTreeMap, time::Duration};

use csi_sidecar_integration::{
    deref_fault_env,
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    kube_support::{create, csi_node, node, pvc},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Node, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, CSIStorageCapacity, StorageClass},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};

const T: Duration = Duration::from_secs(60);
const GI: i64 = 1 << 30;

fn gib(n: i64) -> String {
    format!("{n}Gi")
}

struct Env {
    base: FaultEnv,
    /// The driver's topology key (unique to the test: other tests' nodes
    /// on the shared control plane must not add segments).
    key: String,
}

deref_fault_env!(Env);

impl Env {
    async fn new(prefix: &str) -> Env {
        let base = FaultEnv::new(prefix).await;
        let key = format!("topology.{}/zone", base.driver_name);
        Env { base, key }
    }

    fn script(&self) -> Script {
        Script {
            capacity: true,
            topology: true,
            capacity_total: Some(10 * GI),
            capacity_maximum: Some(5 * GI),
            ..self.base.script()
        }
    }

    /// A Node in `zone` with the driver's CSINode.
    async fn add_node(&self, name: &str, zone: &str) -> String {
        let client = self.ns.client().clone();
        let n = self.ns.scoped(name);
        create(&Api::<Node>::all(client.clone()), &node(&n, &[(&self.key, zone)])).await;
        create(&Api::<CSINode>::all(client), &csi_node(&n, &self.driver_name, &n, &[&self.key])).await;
        n
    }

    async fn add_class(&self, name: &str, mode: &str) -> String {
        self.storage_class(name, |sc| sc.volume_binding_mode = Some(mode.into())).await
    }

    fn provisioner(&self, extra: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut args =
            vec!["provisioner", "-v=5", "--enable-capacity", "--retry-interval-start=200ms", "--retry-interval-max=2s"];
        args.extend(extra);
        let mut all_env = vec![("NAMESPACE", self.ns.name())];
        all_env.extend(env);
        self.sidecar_env("provisioner", &sidecar_bin(), &args, &all_env)
    }

    async fn objects(&self) -> Vec<CSIStorageCapacity> {
        self.ns.api::<CSIStorageCapacity>().list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
    }

    /// (class, zone) → (capacity, maximum), for the objects of the test.
    async fn table(&self) -> BTreeMap<(String, String), (String, String)> {
        self.objects()
            .await
            .into_iter()
            .map(|o| {
                let zone = o
                    .node_topology
                    .as_ref()
                    .and_then(|t| t.match_labels.as_ref())
                    .and_then(|l| l.get(&self.key).cloned())
                    .unwrap_or_default();
                let q = |q: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                    q.map(|q| q.0).unwrap_or_default()
                };
                ((o.storage_class_name.clone(), zone), (q(o.capacity), q(o.maximum_volume_size)))
            })
            .collect()
    }

    async fn wait_table(&self, what: &str, want: &BTreeMap<(String, String), (String, String)>) {
        wait_until(what, T, async || {
            let got = self.table().await;
            (got == *want, got)
        })
        .await;
    }
}

fn row(class: &str, zone: &str, cap: i64) -> ((String, String), (String, String)) {
    ((class.to_string(), zone.to_string()), (gib(cap), gib(5)))
}

/// Objects per segment × late-binding class appear (the Immediate class
/// gets none), follow a provisioning and a deletion in that segment (the
/// poll interval is an hour: only the event-driven refresh can show it),
/// go with their class, and come with a new node's segment.
#[tokio::test]
async fn objects_per_segment_and_class_follow_provisioning_deletion_classes_and_nodes() {
    let env = Env::new("cap").await;
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, env.script());
    let n1 = env.add_node("n1", "z1").await;
    env.add_node("n2", "z2").await;
    let fast = env.add_class("fast", "WaitForFirstConsumer").await;
    let slow = env.add_class("slow", "WaitForFirstConsumer").await;
    env.add_class("imm", "Immediate").await;
    let mut p = env.provisioner(&["--capacity-poll-interval=1h", "--capacity-ownerref-level=-1"], &[]);

    let mut want: BTreeMap<_, _> =
        [row(&fast, "z1", 10), row(&fast, "z2", 10), row(&slow, "z1", 10), row(&slow, "z2", 10)].into();
    env.wait_table("4 objects: 2 segments x 2 late-binding classes", &want).await;
    for o in env.objects().await {
        assert!(o.metadata.name.as_deref().is_some_and(|n| n.starts_with("csisc-")), "{:?}", o.metadata.name);
        let labels = o.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("csi.storage.k8s.io/drivername"), Some(&env.driver_name));
        assert_eq!(labels.get("csi.storage.k8s.io/managed-by").map(String::as_str), Some("external-provisioner"));
        assert_eq!(o.metadata.owner_references, None, "--capacity-ownerref-level=-1: no owner");
    }

    // A 2 GiB volume in z1 (selected node n1): both classes' z1 objects
    // drop to 8 GiB (the backend's pool is per segment).
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    let mut claim = pvc("data", Some(&fast), "2Gi");
    claim.metadata.annotations = Some(BTreeMap::from([("volume.kubernetes.io/selected-node".to_string(), n1.clone())]));
    create(&pvcs, &claim).await;
    want.insert(row(&fast, "z1", 8).0, row(&fast, "z1", 8).1);
    want.insert(row(&slow, "z1", 8).0, row(&slow, "z1", 8).1);
    env.wait_table("z1 refreshed after the provisioning", &want).await;

    // Deleted: the volume's segment refreshed again.
    pvcs.delete("data", &DeleteParams::default()).await.expect("delete PVC");
    want.insert(row(&fast, "z1", 10).0, row(&fast, "z1", 10).1);
    want.insert(row(&slow, "z1", 10).0, row(&slow, "z1", 10).1);
    env.wait_table("z1 refreshed after the deletion", &want).await;

    // A class goes: its objects go.
    Api::<StorageClass>::all(env.ns.client().clone()).delete(&slow, &DeleteParams::default()).await.expect("delete");
    want.retain(|(c, _), _| *c != slow);
    env.wait_table("slow's objects deleted", &want).await;

    // A node in a new zone: its segment gets an object.
    env.add_node("n3", "z3").await;
    want.insert(row(&fast, "z3", 10).0, row(&fast, "z3", 10).1);
    env.wait_table("z3's object created", &want).await;

    // Someone deletes an object: it is created again.
    let victim = env.objects().await.into_iter().next().and_then(|o| o.metadata.name).expect("an object");
    env.ns.api::<CSIStorageCapacity>().delete(&victim, &DeleteParams::default()).await.expect("delete object");
    wait_until("the deleted object re-created", T, async || {
        let names: Vec<String> = env.objects().await.into_iter().filter_map(|o| o.metadata.name).collect();
        (names.len() == want.len() && !names.contains(&victim), names)
    })
    .await;
    env.wait_table("everything as before", &want).await;
    assert!(driver.get_capacities() >= 9, "GetCapacity per item and refresh: {}", driver.get_capacities());
    assert!(p.try_exit().is_none(), "{}", p.logs());
    p.terminate().await;
}

/// `--capacity-ownerref-level=2` from a pod of a Deployment: the
/// Deployment (pod → ReplicaSet → Deployment, read with GETs). The chain
/// is made by hand: the test control plane runs neither the workload
/// controllers nor the garbage collector.
#[tokio::test]
async fn objects_are_owned_by_the_object_at_the_owner_level() {
    let env = Env::new("capown").await;
    let _driver = FaultDriver::start(&env.socket(), Transport::Grpc, env.script());
    let template = serde_json::json!({"metadata": {"labels": {"app": "ctrl"}},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}});
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ctrl"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ctrl"}}, "template": template}
    }))
    .expect("deployment");
    let deployment = create(&env.ns.api(), &deployment).await;
    let owner = |kind: &str, o: &kube::api::ObjectMeta| serde_json::json!([{"apiVersion": "apps/v1", "kind": kind, "name": o.name, "uid": o.uid, "controller": true}]);
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ctrl-5d4f", "ownerReferences": owner("Deployment", &deployment.metadata)},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ctrl"}}, "template": template}
    }))
    .expect("replicaset");
    let rs = create(&env.ns.api(), &rs).await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ctrl-5d4f-x7k2p", "ownerReferences": owner("ReplicaSet", &rs.metadata)},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}
    }))
    .expect("pod");
    create(&env.ns.api(), &pod).await;
    env.add_node("n1", "z1").await;
    env.add_class("fast", "WaitForFirstConsumer").await;
    let mut p = env.provisioner(&["--capacity-ownerref-level=2"], &[("POD_NAME", "ctrl-5d4f-x7k2p")]);
    let owners = wait_until("an owned object", T, async || {
        let o = env.objects().await.into_iter().next().and_then(|o| o.metadata.owner_references);
        (o.is_some(), o)
    })
    .await
    .unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("Deployment", "ctrl"));
    assert_eq!(Some(&owners[0].uid), deployment.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    assert!(p.try_exit().is_none(), "{}", p.logs());
    p.terminate().await;
}

/// Bad input: a negative capacity and an unknown segment are refused with
/// clear errors (nothing published for them, no exit, no panic), and
/// publishing resumes once the driver answers sensibly; a missing
/// `$NAMESPACE` or a driver without GET_CAPACITY stops the start with a
/// message naming the flag.
#[tokio::test]
async fn unusable_answers_and_bad_start_up_input_give_clear_errors() {
    let env = Env::new("capbad").await;
    let script = Script {
        capacity_total: None,
        capacity_segments: BTreeMap::from([(format!("{}=z1", env.key), 10 * GI)]),
        capacity_garbage: Some(-5),
        ..env.script()
    };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    env.add_node("n1", "z1").await;
    env.add_node("n2", "unknown-zone").await;
    let fast = env.add_class("fast", "WaitForFirstConsumer").await;
    let mut p = env.provisioner(&["--capacity-ownerref-level=-1"], &[]);
    wait_until("both errors logged", T, async || {
        let log = p.logs();
        let seen = (
            log.contains("the driver reported a negative available_capacity -5 for"),
            log.contains("unknown topology segment"),
        );
        (seen.0 && seen.1, seen)
    })
    .await;
    assert!(env.objects().await.is_empty(), "nothing published from garbage");
    assert!(p.try_exit().is_none(), "still running:\n{}", p.logs());
    driver.update(|s| s.capacity_garbage = None);
    let want: BTreeMap<_, _> = [row(&fast, "z1", 10)].into();
    env.wait_table("z1's object once the answer is sane (unknown-zone still refused)", &want).await;
    assert!(!p.logs().contains("panicked"), "{}", p.logs());
    p.terminate().await;

    // Start-up input: no $NAMESPACE; a driver without the capability.
    let args = ["provisioner", "--enable-capacity"];
    let mut no_ns = env.sidecar("no-namespace", &sidecar_bin(), &args);
    let status = wait_until("exit without NAMESPACE", T, async || {
        let s = no_ns.try_exit();
        (s.is_some(), s)
    })
    .await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", no_ns.logs());
    assert!(no_ns.logs().contains("--enable-capacity needs the NAMESPACE environment variable"), "{}", no_ns.logs());
    driver.update(|s| s.capacity = false);
    let mut no_cap = env.sidecar_env("no-capability", &sidecar_bin(), &args, &[("NAMESPACE", env.ns.name())]);
    let status = wait_until("exit without GET_CAPACITY", T, async || {
        let s = no_cap.try_exit();
        (s.is_some(), s)
    })
    .await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", no_cap.logs());
    assert!(no_cap.logs().contains("does not report the GET_CAPACITY controller capability"), "{}", no_cap.logs());
}

/// With `--node-deployment` (TopoLVM-style node-local storage) each node's
/// instance publishes only its own node's segment, from `NodeGetInfo`, with
/// its own managed-by label, as upstream's static topology does; before,
/// every instance published every segment, asking its local driver about
/// other nodes' storage.
#[tokio::test]
async fn a_node_deployment_publishes_only_its_own_nodes_segment() {
    let env = Env::new("capnode").await;
    let n1 = env.add_node("n1", "z1").await;
    env.add_node("n2", "z2").await;
    let script =
        Script { node_info: Some((n1.clone(), BTreeMap::from([(env.key.clone(), "z1".to_string())]))), ..env.script() };
    let _driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    let fast = env.add_class("fast", "WaitForFirstConsumer").await;
    let _p = env.provisioner(
        &["--node-deployment", "--capacity-poll-interval=1h", "--capacity-ownerref-level=-1"],
        &[("NODE_NAME", n1.as_str())],
    );
    let want: BTreeMap<_, _> = [row(&fast, "z1", 10)].into();
    env.wait_table("one object: this node's segment x 1 class", &want).await;
    let objects = env.objects().await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    let labels = objects[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("csi.storage.k8s.io/managed-by").map(String::as_str),
        Some(format!("external-provisioner-{n1}").as_str())
    );
}
