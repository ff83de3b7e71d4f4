//! provisioner failures a real driver cannot be made to show, with the
//! fault-injecting driver, against the real control plane.

use std::{sync::Arc, time::Duration};

use csi_sidecar_integration::{
    deref_fault_env,
    failover::{assert_lease_held, fast_leader_election, kill_leader, wait_one_leader},
    fault_driver::{FaultDriver, FaultEnv, Script, Transport},
    kube_support::{create, event_messages, pvc, storage_class, wait_for},
    process::Proc,
    symlinked_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use tonic::Code;

const T: Duration = Duration::from_secs(60);

/// The fault-driver environment plus a StorageClass of the driver.
struct Env {
    base: FaultEnv,
    sc: String,
}

deref_fault_env!(Env);

impl Env {
    async fn new(prefix: &str) -> Env {
        let base = FaultEnv::new(prefix).await;
        let sc = base.storage_class("sc", |_| {}).await;
        Env { base, sc }
    }

    fn provisioner(&self, name: &str, extra: &[&str]) -> Proc {
        let args: Vec<&str> = ["-v=4"].into_iter().chain(extra.iter().copied()).collect();
        self.sidecar(name, &symlinked_bin(self.dir.path(), "csi-provisioner"), &args)
    }

    /// A driver whose CreateVolume takes 3 s (plus `script`'s changes) and a
    /// provisioner that gives up after 1 s: every create is uncertain until
    /// the test speeds the driver up.
    fn slow_creates(&self, script: impl FnOnce(Script) -> Script) -> (FaultDriver, Proc) {
        let base = Script { create_delay: Duration::from_secs(3), ..self.script() };
        let driver = FaultDriver::start(&self.socket(), Transport::Grpc, script(base));
        let args = ["--timeout=1s", "--retry-interval-start=500ms", "--retry-interval-max=2s"];
        (driver, self.provisioner("provisioner", &args))
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        event_messages(&self.ns, reason).await
    }

    async fn wait_all_bound(&self, n: usize) {
        let pvcs: Api<PersistentVolumeClaim> = self.ns.api();
        wait_until(&format!("all {n} PVCs Bound"), Duration::from_secs(120), async || {
            let bound = pvcs
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                        .count()
                })
                .unwrap_or(0);
            (bound == n, bound)
        })
        .await;
    }

    async fn our_pvs(&self) -> Vec<PersistentVolume> {
        Api::<PersistentVolume>::all(self.ns.client().clone())
            .list(&ListParams::default())
            .await
            .expect("list PVs")
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|c| c.driver == self.driver_name))
            .collect()
    }
}

/// external-provisioner#311: a CreateVolume that timed out may still create
/// the volume; if the PVC is deleted meanwhile the volume must not leak.
#[tokio::test]
async fn a_timed_out_create_is_finished_and_cleaned_up_after_the_pvc_is_deleted() {
    let env = Env::new("timeout").await;
    let (driver, _p) = env.slow_creates(|s| s);
    create(&env.ns.api(), &pvc("slow", Some(&env.sc), "1Mi")).await;
    wait_until("a DeadlineExceeded event", T, async || {
        let e = env.events("ProvisioningFailed").await;
        (e.iter().any(|m| m.contains("DeadlineExceeded")), e)
    })
    .await;
    // The backend created the volume after the caller gave up.
    wait_until("the volume to exist in the backend", T, async || {
        let v = driver.volume_names();
        (!v.is_empty(), v)
    })
    .await;
    Api::<PersistentVolumeClaim>::namespaced(env.ns.client().clone(), env.ns.name())
        .delete("slow", &DeleteParams::default())
        .await
        .expect("delete PVC");
    driver.update(|s| s.create_delay = Duration::ZERO);
    wait_until("the backend to be empty again", T, async || {
        let v = driver.volume_names();
        (v.is_empty(), (v, driver.counters.deletes.load(std::sync::atomic::Ordering::SeqCst)))
    })
    .await;
    assert!(env.our_pvs().await.is_empty(), "no PV for a deleted PVC");
}

/// A claim deleted and re-created under the same name while the first
/// one's CreateVolume is still undecided is another claim: it gets its own
/// volume (named after its UID, of its size), and the first claim's volume
/// is cleaned up.
#[tokio::test]
async fn a_claim_recreated_under_the_same_name_during_an_uncertain_create_gets_its_own_volume() {
    let env = Env::new("recreate").await;
    let (driver, _p) = env.slow_creates(|s| s);
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    let first = create(&pvcs, &pvc("same", Some(&env.sc), "1Mi")).await;
    let first_uid = first.metadata.uid.clone().expect("uid");
    wait_until("the first volume to exist in the backend", T, async || {
        let v = driver.volume_names();
        (!v.is_empty(), v)
    })
    .await;
    pvcs.delete("same", &DeleteParams::default()).await.expect("delete PVC");
    csi_sidecar_integration::kube_support::wait_deleted(&pvcs, "same", T).await;
    let second = create(&pvcs, &pvc("same", Some(&env.sc), "2Mi")).await;
    let second_uid = second.metadata.uid.clone().expect("uid");
    assert_ne!(first_uid, second_uid);
    // The backend answers in time from now on.
    driver.update(|s| s.create_delay = Duration::ZERO);
    let bound =
        wait_for(&pvcs, "same", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
    let pv_name = bound.spec.as_ref().and_then(|s| s.volume_name.clone()).expect("bound to a PV");
    assert_eq!(pv_name, format!("pvc-{second_uid}"), "the PV is named after the new claim's UID");
    let pv = Api::<PersistentVolume>::all(env.ns.client().clone()).get(&pv_name).await.expect("PV");
    let capacity =
        pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.clone());
    assert_eq!(capacity.as_deref(), Some("2Mi"), "the new claim's size");
    wait_until("only the new claim's volume in the backend", T, async || {
        let v = driver.volume_names();
        (v == vec![format!("pvc-{second_uid}")], v)
    })
    .await;
    let stale = format!("pvc-{first_uid}");
    let succeeded = env.events("ProvisioningSucceeded").await;
    assert!(
        !succeeded.iter().any(|m| m.contains(&stale)),
        "the first claim's plan was never used for the second: {succeeded:?}"
    );
}

/// The volume of a claim deleted (with its templated secret, as when their
/// namespace is deleted) while its CreateVolume was undecided is cleaned up with the
/// secret resolved at the first attempt: the backend needs it, and the
/// volume would leak without it.
#[tokio::test]
async fn an_orphaned_volume_is_cleaned_up_with_the_secret_of_its_first_attempt() {
    let env = Env::new("orphan-secret").await;
    let (driver, _p) =
        env.slow_creates(|s| Script { required_secret: Some(("password".into(), "s3cr3t".into())), ..s });
    // The class templates the secret's namespace from the claim's.
    let client = env.ns.client().clone();
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta { name: Some("backend".into()), ..Default::default() },
        string_data: Some([("password".to_string(), "s3cr3t".to_string())].into()),
        ..Default::default()
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = env.ns.api();
    create(&secrets, &secret).await;
    let sc_name = env.ns.scoped("secret-sc");
    let mut sc = storage_class(&sc_name, &env.driver_name);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name".to_string(), "backend".to_string()),
            ("csi.storage.k8s.io/provisioner-secret-namespace".to_string(), "${pvc.namespace}".to_string()),
        ]
        .into(),
    );
    create(&Api::<StorageClass>::all(client.clone()), &sc).await;
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("doomed", Some(&sc_name), "1Mi")).await;
    wait_until("the volume to exist in the backend", T, async || {
        let v = driver.volume_names();
        (!v.is_empty(), v)
    })
    .await;
    // The claim and its secret go (as when their namespace is deleted).
    pvcs.delete("doomed", &DeleteParams::default()).await.expect("delete PVC");
    secrets.delete("backend", &DeleteParams::default()).await.expect("delete secret");
    csi_sidecar_integration::kube_support::wait_deleted(&pvcs, "doomed", T).await;
    driver.update(|s| s.create_delay = Duration::ZERO);
    wait_until("the backend to be empty again", T, async || {
        let v = driver.volume_names();
        (v.is_empty(), (v, driver.counters.deletes.load(std::sync::atomic::Ordering::SeqCst)))
    })
    .await;
    assert!(env.our_pvs().await.is_empty(), "no PV for a deleted claim");
}

#[tokio::test]
async fn invalid_argument_is_retried_only_after_the_maximum_interval() {
    let env = Env::new("invalid").await;
    let driver = FaultDriver::start(
        &env.socket(),
        Transport::Grpc,
        Script { create_error: Some((Code::InvalidArgument, "bad size".into())), ..env.script() },
    );
    let _p = env.provisioner("provisioner", &["--retry-interval-start=100ms", "--retry-interval-max=4s"]);
    create(&env.ns.api(), &pvc("infeasible", Some(&env.sc), "1Mi")).await;
    wait_until("the first CreateVolume", T, async || (driver.creates() >= 1, driver.creates())).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(driver.creates(), 1, "InvalidArgument must wait --retry-interval-max, not the 100 ms backoff");
    let msgs = env.events("ProvisioningFailed").await;
    let infeasible = "Volume provisioning failed with infeasible error. Retries will be delayed. \
                      rpc error: code = InvalidArgument desc = bad size";
    assert!(msgs.iter().any(|m| m == infeasible), "{msgs:?}");
    driver.update(|s| s.create_error = None);
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    wait_for(&pvcs, "infeasible", T, |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).await;
}

/// Claim events do not bring an infeasible CreateVolume (InvalidArgument)
/// forward: until `--retry-interval-max` has passed the claim's syncs do
/// not call the driver, unless its StorageClass changed (upstream's rule).
#[tokio::test]
async fn claim_events_do_not_retry_an_infeasible_create_before_its_delay_unless_the_class_changes() {
    let env = Env::new("infeasible-ev").await;
    let driver = FaultDriver::start(
        &env.socket(),
        Transport::Grpc,
        Script { create_error: Some((Code::InvalidArgument, "bad size".into())), ..env.script() },
    );
    let p = env.provisioner("provisioner", &["--retry-interval-start=100ms", "--retry-interval-max=10m"]);
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("infeasible", Some(&env.sc), "1Mi")).await;
    wait_until("the infeasible event", T, async || {
        let e = env.events("ProvisioningFailed").await;
        (e.iter().any(|m| m.contains("infeasible error")), e)
    })
    .await;
    assert_eq!(driver.creates(), 1);
    let poke = async |n: usize| {
        let patch = serde_json::json!({"metadata": {"annotations": {"example.com/poke": n.to_string()}}});
        pvcs.patch("infeasible", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate the claim");
    };
    // A claim event: a sync that must not call CreateVolume.
    poke(1).await;
    wait_until("a sync of the claim after the event", T, async || {
        let skipped = p.logs().contains("Infeasible CreateVolume: not retried yet");
        (skipped || driver.creates() > 1, driver.creates())
    })
    .await;
    assert_eq!(driver.creates(), 1, "a claim event retried an infeasible CreateVolume before --retry-interval-max");
    // The class changes (an administrator's fix): the next sync tries again.
    driver.update(|s| s.create_error = None);
    let classes: Api<StorageClass> = Api::all(env.ns.client().clone());
    let fixed = serde_json::json!({"metadata": {"annotations": {"example.com/fixed": "true"}}});
    classes.patch(&env.sc, &PatchParams::default(), &Patch::Merge(&fixed)).await.expect("change the class");
    let mut n = 1;
    wait_until("the claim Bound after the class changed", T, async || {
        n += 1;
        poke(n).await;
        let c = pvcs.get("infeasible").await.expect("claim");
        let phase = c.status.and_then(|s| s.phase);
        (phase.as_deref() == Some("Bound"), phase)
    })
    .await;
}

/// A CreateVolume answer that cannot become a PV (a volume smaller than
/// asked) is deleted again with one DeleteVolume per attempt, not a burst:
/// a failing delete is retried with the queue's backoff, the volume still
/// tracked, and deleted once the driver allows it (the claim gone meanwhile).
#[tokio::test]
async fn an_unusable_volume_gets_one_delete_volume_per_attempt() {
    let env = Env::new("unusable").await;
    let script =
        Script { create_shortfall: 1, delete_error: Some((Code::Unavailable, "restarting".into())), ..env.script() };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    let _p = env.provisioner("provisioner", &["--retry-interval-start=100ms", "--retry-interval-max=500ms"]);
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("unusable", Some(&env.sc), "1Mi")).await;
    wait_until("three attempts", T, async || (driver.creates() >= 3, driver.creates())).await;
    let deletes = driver.counters.deletes.load(std::sync::atomic::Ordering::SeqCst);
    let creates = driver.creates();
    assert!(deletes <= creates, "{deletes} DeleteVolume calls for {creates} attempts: a burst per attempt");
    let msgs = env.events("ProvisioningFailed").await;
    assert!(msgs.iter().any(|m| m.contains("failed, volume is orphaned")), "{msgs:?}");
    assert!(!driver.volume_names().is_empty(), "the volume exists while its deletion fails");
    pvcs.delete("unusable", &DeleteParams::default()).await.expect("delete the claim");
    driver.update(|s| s.delete_error = None);
    wait_until("the backend to be empty again", T, async || {
        let v = driver.volume_names();
        (v.is_empty(), v)
    })
    .await;
    assert!(env.our_pvs().await.is_empty(), "no PV for an unusable volume");
}

/// A driver restart in the middle of a burst of 50 PVCs: every PVC ends
/// Bound, with exactly one backend volume each.
#[tokio::test]
async fn driver_restart_mid_burst_binds_everything_once() {
    let env = Env::new("burst").await;
    let script = Script { create_delay: Duration::from_millis(20), ..env.script() };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script.clone());
    let volumes = driver.volumes.clone();
    let _p = env.provisioner(
        "provisioner",
        &["--retry-interval-start=200ms", "--retry-interval-max=2s", "--worker-threads=10"],
    );
    for i in 0..50 {
        create(&env.ns.api(), &pvc(&format!("burst-{i}"), Some(&env.sc), "1Mi")).await;
    }
    wait_until("some volumes before the restart", T, async || {
        let n = volumes.lock().expect("volumes").len();
        (n >= 5, n)
    })
    .await;
    drop(driver);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _driver = FaultDriver::start_with(&env.socket(), Transport::Grpc, script, Arc::clone(&volumes));
    env.wait_all_bound(50).await;
    let pvs = env.our_pvs().await;
    assert_eq!(pvs.len(), 50);
    let mut handles: Vec<String> =
        pvs.iter().filter_map(|p| p.spec.as_ref()?.csi.as_ref().map(|c| c.volume_handle.clone())).collect();
    handles.sort();
    handles.dedup();
    assert_eq!(handles.len(), 50, "every PV has its own backend volume");
    assert_eq!(volumes.lock().expect("volumes").len(), 50, "no duplicate backend volumes");
}

/// Two replicas with leader election; the leader is killed with SIGKILL in
/// the middle of a burst: the other takes over within the lease duration and
/// every PVC ends Bound with exactly one backend volume.
#[tokio::test]
async fn leader_killed_mid_burst_hands_over_without_duplicates() {
    let env = Env::new("failover").await;
    let script = Script { create_delay: Duration::from_millis(100), ..env.script() };
    let driver = FaultDriver::start(&env.socket(), Transport::Grpc, script);
    let mut le = fast_leader_election(env.ns.name());
    le.extend(["--worker-threads=4", "--retry-interval-start=200ms", "--retry-interval-max=2s"].map(String::from));
    let le: Vec<&str> = le.iter().map(String::as_str).collect();
    let mut a = env.provisioner("provisioner-a", &le);
    let mut b = env.provisioner("provisioner-b", &le);
    wait_one_leader(&a, &b).await;
    assert_lease_held(&env.ns, &env.driver_name.replace('.', "-")).await;

    for i in 0..30 {
        create(&env.ns.api(), &pvc(&format!("ha-{i}"), Some(&env.sc), "1Mi")).await;
    }
    wait_until("provisioning under way", T, async || {
        let n = driver.volume_names().len();
        (n >= 5, n)
    })
    .await;
    kill_leader(&mut a, &mut b).await;

    env.wait_all_bound(30).await;
    let pvs = env.our_pvs().await;
    assert_eq!(pvs.len(), 30);
    assert_eq!(driver.volume_names().len(), 30, "exactly one backend volume per PVC");
}

/// ResourceExhausted for a late-binding PVC with a selected node: the
/// provisioner gives the PVC back to the scheduler (annotation removed).
#[tokio::test]
async fn resource_exhausted_on_the_selected_node_reschedules() {
    use csi_sidecar_integration::kube_support::{csi_node, node};
    use k8s_openapi::api::{core::v1::Node, storage::v1::CSINode};
    const KEY: &str = "topology.fault.example.com/node";
    let env = Env::new("exhausted").await;
    let driver = FaultDriver::start(
        &env.socket(),
        Transport::Grpc,
        Script {
            topology: true,
            create_error: Some((Code::ResourceExhausted, "no space on this node".into())),
            ..env.script()
        },
    );
    let node_name = env.ns.scoped("node");
    create(&Api::<Node>::all(env.ns.client().clone()), &node(&node_name, &[(KEY, "n1")])).await;
    create(&Api::<CSINode>::all(env.ns.client().clone()), &csi_node(&node_name, &env.driver_name, "n1", &[KEY])).await;
    let wffc = env.ns.scoped("wffc");
    let mut sc = storage_class(&wffc, &env.driver_name);
    sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
    create(&Api::<StorageClass>::all(env.ns.client().clone()), &sc).await;
    let _p = env.provisioner("provisioner", &["--retry-interval-start=200ms", "--retry-interval-max=1s"]);
    // What the scheduler would do: the PV binder hands the PVC to the
    // provisioner once a node is selected.
    let mut claim = pvc("exhausted", Some(&wffc), "1Mi");
    claim.metadata.annotations = Some([("volume.kubernetes.io/selected-node".to_string(), node_name.clone())].into());
    create(&env.ns.api(), &claim).await;
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    wait_for(&pvcs, "exhausted", T, |c| {
        c.metadata.annotations.as_ref().is_none_or(|a| !a.contains_key("volume.kubernetes.io/selected-node"))
    })
    .await;
    assert!(driver.creates() >= 1);
    wait_until("the ResourceExhausted event", T, async || {
        let msgs = env.events("ProvisioningFailed").await;
        (msgs.iter().any(|m| m.contains("ResourceExhausted")), msgs)
    })
    .await;
    assert!(env.our_pvs().await.is_empty());
}

/// Invariant 8 with a clone: a clone whose CreateVolume timed out is deleted
/// while the driver may still be copying its source; the source, deleted
/// too, keeps its cloning-protection finalizer until that create has a
/// final answer (and its volume is cleaned up), then goes.
#[tokio::test]
async fn a_clone_source_stays_protected_while_an_orphaned_clone_create_is_unfinished() {
    let env = Env::new("clone").await;
    let (driver, p) = env.slow_creates(|s| Script { clone: true, create_delay: Duration::ZERO, ..s });
    let pvcs: Api<PersistentVolumeClaim> = env.ns.api();
    create(&pvcs, &pvc("src", Some(&env.sc), "1Mi")).await;
    env.wait_all_bound(1).await;
    // From now on every create outlives the provisioner's 1 s timeout.
    driver.update(|s| s.create_delay = Duration::from_secs(3));
    let mut copy = pvc("copy", Some(&env.sc), "1Mi");
    copy.spec.as_mut().expect("spec").data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "src".into(),
    });
    create(&pvcs, &copy).await;
    wait_until("a DeadlineExceeded event for the clone", T, async || {
        let e = env.events("ProvisioningFailed").await;
        (e.iter().any(|m| m.contains("DeadlineExceeded")), e)
    })
    .await;
    pvcs.delete("copy", &DeleteParams::default()).await.expect("delete clone");
    pvcs.delete("src", &DeleteParams::default()).await.expect("delete source");
    // The controller looked at the deleting source and kept it for the
    // unfinished create.
    wait_until("the source kept for the unfinished create", T, async || {
        (p.logs().contains("a CreateVolume cloning it is unfinished"), ())
    })
    .await;
    let src = pvcs.get("src").await.expect("the source is still there");
    assert!(
        src.metadata.finalizers.iter().flatten().any(|f| f == "provisioner.storage.kubernetes.io/cloning-protection"),
        "{:?}",
        src.metadata.finalizers
    );
    // The backend answers in time: the orphaned clone is finished and
    // deleted, then the source is released and goes, and its volume too.
    driver.update(|s| s.create_delay = Duration::ZERO);
    csi_sidecar_integration::kube_support::wait_deleted(&pvcs, "src", T).await;
    wait_until("the backend to be empty again", T, async || {
        let v = driver.volume_names();
        (v.is_empty(), v)
    })
    .await;
    // The backend volume goes before the PV's own finalizer: wait for both.
    wait_until("the source's PV deleted", T, async || {
        let pvs = env.our_pvs().await;
        (pvs.is_empty(), pvs.len())
    })
    .await;
}
