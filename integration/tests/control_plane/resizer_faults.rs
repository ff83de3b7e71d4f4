//! resizer failures the mock driver cannot show, with the fault driver:
//! infeasible sizes and the user's shrink-back, timeouts retried at the
//! same size, a driver answering less than asked, a claim whose PV is gone.
//! The provisioner and resizer run in one csi-sidecar process.

use std::time::Duration;

use csi_sidecar_integration::{
    deref_fault_env,
    fault_driver::{CallKind, CallOutcome, FaultDriver, FaultEnv, Script, Transport},
    kube_support::{create, event_messages, events_for, pvc, wait_for},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::{
    core::v1::{ModifyVolumeStatus, PersistentVolume, PersistentVolumeClaim},
    storage::v1::VolumeAttributesClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use tonic::Code;

const T: Duration = Duration::from_secs(60);
const MI: i64 = 1 << 20;

struct Env {
    base: FaultEnv,
    sc: String,
}

deref_fault_env!(Env);

impl Env {
    async fn new(prefix: &str) -> Env {
        let base = FaultEnv::new(prefix).await;
        let sc = base.storage_class("sc", |c| c.allow_volume_expansion = Some(true)).await;
        Env { base, sc }
    }

    /// A driver that expands (after `script`'s changes) and csi-sidecar
    /// running provisioner and resizer (`resizer_args` after the resizer).
    fn start(&self, script: impl FnOnce(Script) -> Script, resizer_args: &[&str]) -> (FaultDriver, Proc) {
        self.start_with_provisioner("resizer", script(Script { expand: true, ..self.script() }), resizer_args)
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }

    async fn bound_claim(&self, name: &str) -> String {
        self.base.bound_claim(name, &self.sc, T).await
    }

    async fn request(&self, name: &str, size: &str) {
        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": size}}}});
        self.pvcs().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("request");
    }

    async fn event_messages(&self, reason: &str) -> Vec<String> {
        event_messages(&self.ns, reason).await
    }

    async fn wait_event(&self, reason: &str, containing: &str) -> Vec<String> {
        wait_until(&format!("event {reason} containing {containing:?}"), T, async || {
            let e = self.event_messages(reason).await;
            (e.iter().any(|m| m.contains(containing)), e)
        })
        .await
    }
}

fn capacity(c: &PersistentVolumeClaim) -> Option<String> {
    Some(c.status.as_ref()?.capacity.as_ref()?.get("storage")?.0.clone())
}

fn allocation_state(c: &PersistentVolumeClaim) -> Option<String> {
    c.status.as_ref()?.allocated_resource_statuses.as_ref()?.get("storage").cloned()
}

fn condition<'a>(
    c: &'a PersistentVolumeClaim,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PersistentVolumeClaimCondition> {
    c.status.as_ref()?.conditions.as_ref()?.iter().find(|x| x.type_ == type_)
}

#[tokio::test]
async fn an_infeasible_size_recovers_when_the_user_shrinks_the_request_back() {
    let env = Env::new("rszf-oor").await;
    let (driver, sidecar) = env.start(|s| Script { expand_limit: Some(4 * MI), ..s }, &[]);
    env.bound_claim("data").await;
    env.request("data", "10Mi").await;
    let c = wait_for(&env.pvcs(), "data", T, |c| allocation_state(c).as_deref() == Some("ControllerResizeInfeasible"))
        .await;
    let cond = condition(&c, "ControllerResizeError").expect("ControllerResizeError");
    assert_eq!(cond.status, "True");
    assert!(
        cond.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("failed to expand pvc with rpc error: code = OutOfRange"),
        "{cond:?}"
    );
    env.wait_event("VolumeResizeFailed", "code = OutOfRange").await;
    // Held back: no second call at the infeasible size within the slow-set window.
    let calls = driver.expand_calls();
    assert!(calls.iter().all(|c| c.bytes == 10 * MI), "{calls:?}");

    env.request("data", "3Mi").await;
    let c = wait_for(&env.pvcs(), "data", T, |c| capacity(c).as_deref() == Some("3Mi")).await;
    assert_eq!(allocation_state(&c), None);
    assert!(condition(&c, "ControllerResizeError").is_none(), "error condition cleared");
    let calls = driver.expand_calls();
    assert_eq!(calls.last().map(|c| (c.bytes, c.outcome.clone())), Some((3 * MI, Some(CallOutcome::Ok))));
    assert!(driver.overlaps().is_empty());
    drop(sidecar);
}

#[tokio::test]
async fn a_timed_out_expansion_is_retried_at_the_same_size_even_if_the_request_changes() {
    let env = Env::new("rszf-timeout").await;
    let (driver, _sidecar) = env.start(|s| Script { expand_delay: Duration::from_secs(3), ..s }, &["--timeout=1s"]);
    env.bound_claim("data").await;
    env.request("data", "2Mi").await;
    wait_until("two timed-out expansions", T, async || {
        let calls = driver.expand_calls();
        (calls.iter().filter(|c| c.outcome == Some(CallOutcome::Cancelled)).count() >= 2, calls)
    })
    .await;
    // The user asks for more while 2Mi may still be running on the backend.
    env.request("data", "3Mi").await;
    let c = wait_for(&env.pvcs(), "data", T, |c| allocation_state(c).as_deref() == Some("ControllerResizeInProgress"))
        .await;
    assert_eq!(c.status.as_ref().unwrap().allocated_resources.as_ref().unwrap()["storage"].0, "2Mi");
    wait_until("a third attempt after the change", T, async || {
        let calls = driver.expand_calls();
        (calls.len() >= 3 && calls.iter().all(|c| c.end.is_some()), calls)
    })
    .await;
    driver.update(|s| s.expand_delay = Duration::ZERO);
    wait_for(&env.pvcs(), "data", T, |c| capacity(c).as_deref() == Some("3Mi")).await;
    let calls = driver.expand_calls();
    let first_ok = calls.iter().position(|c| c.outcome == Some(CallOutcome::Ok)).expect("a successful call");
    assert!(calls[..=first_ok].iter().all(|c| c.bytes == 2 * MI), "2Mi until it succeeded: {calls:?}");
    assert_eq!(calls.last().map(|c| c.bytes), Some(3 * MI), "{calls:?}");
    assert!(driver.overlaps().is_empty(), "never two calls at once: {:?}", driver.overlaps());
}

#[tokio::test]
async fn a_driver_answering_less_than_asked_is_an_error_not_a_smaller_volume() {
    let env = Env::new("rszf-short").await;
    let (driver, _sidecar) = env.start(|s| Script { expand_shortfall: 4096, ..s }, &[]);
    let pv_name = env.bound_claim("data").await;
    env.request("data", "2Mi").await;
    let msgs = env.wait_event("VolumeResizeFailed", "less than the requested").await;
    assert!(msgs.iter().any(|m| m.contains(&format!("resize volume \"{pv_name}\""))), "{msgs:?}");
    let pv = Api::<PersistentVolume>::all(env.ns.client().clone()).get(&pv_name).await.expect("pv");
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "1Mi", "PV not shrunk to the answer");
    // Fixed driver: the retry succeeds.
    driver.update(|s| s.expand_shortfall = 0);
    wait_for(&env.pvcs(), "data", T, |c| capacity(c).as_deref() == Some("2Mi")).await;
}

#[tokio::test]
async fn a_claim_whose_pv_is_gone_gets_an_event_and_no_call() {
    let env = Env::new("rszf-nopv").await;
    let (driver, mut sidecar) =
        env.start(|s| Script { expand_error: Some((Code::Unavailable, "backend busy".into())), ..s }, &[]);
    let pv_name = env.bound_claim("data").await;
    env.request("data", "2Mi").await;
    wait_until("an expansion attempt", T, async || (!driver.expand_calls().is_empty(), ())).await;
    // The PV goes (its finalizers stripped), the claim still asks for more.
    let pvs: Api<PersistentVolume> = Api::all(env.ns.client().clone());
    pvs.delete(&pv_name, &DeleteParams::default()).await.expect("delete pv");
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    pvs.patch(&pv_name, &PatchParams::default(), &Patch::Merge(&strip)).await.expect("strip finalizers");
    env.wait_event("VolumeResizeFailed", &format!("PersistentVolume {pv_name} of claim")).await;
    let calls = driver.expand_calls().len();
    env.wait_event("VolumeResizeFailed", "not found; cannot resize").await;
    assert!(sidecar.try_exit().is_none(), "the sidecar keeps running");
    assert!(driver.expand_calls().len() <= calls + 1, "no calls for a volume that is gone");
}

fn vac(name: &str, driver: &str, params: &[(&str, &str)]) -> VolumeAttributesClass {
    VolumeAttributesClass {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        driver_name: driver.into(),
        parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
    }
}

fn modify_state(c: &PersistentVolumeClaim) -> Option<(String, String)> {
    let st = c.status.as_ref()?.modify_volume_status.as_ref()?;
    Some((st.status.clone(), st.target_volume_attributes_class_name.clone().unwrap_or_default()))
}

fn current_vac(c: &PersistentVolumeClaim) -> Option<String> {
    c.status.as_ref()?.current_volume_attributes_class_name.clone()
}

impl Env {
    async fn set_vac(&self, claim: &str, vac: Option<&str>) -> Result<PersistentVolumeClaim, kube::Error> {
        let patch = serde_json::json!({"spec": {"volumeAttributesClassName": vac}});
        self.pvcs().patch(claim, &PatchParams::default(), &Patch::Merge(&patch)).await
    }

    async fn create_vac(&self, name: &str, driver: &str, params: &[(&str, &str)]) -> String {
        let name = self.ns.scoped(name);
        create(&Api::<VolumeAttributesClass>::all(self.ns.client().clone()), &vac(&name, driver, params)).await;
        name
    }
}

#[tokio::test]
async fn a_volume_attributes_class_change_modifies_the_volume_with_its_parameters() {
    let env = Env::new("rszf-vac").await;
    let (driver, _sidecar) = env.start(|s| Script { modify: true, ..s }, &["--extra-modify-metadata"]);
    let pv_name = env.bound_claim("data").await;
    let gold = env.create_vac("gold", &env.driver_name, &[("iops", "3000")]).await;
    env.set_vac("data", Some(&gold)).await.expect("set class");
    let c = wait_for(&env.pvcs(), "data", T, |c| current_vac(c).as_deref() == Some(gold.as_str())).await;
    assert_eq!(modify_state(&c), None, "modifyVolumeStatus cleared");
    assert!(condition(&c, "ModifyingVolume").is_none() && condition(&c, "ModifyVolumeError").is_none());
    let pv = Api::<PersistentVolume>::all(env.ns.client().clone()).get(&pv_name).await.expect("pv");
    assert_eq!(pv.spec.unwrap().volume_attributes_class_name.as_deref(), Some(gold.as_str()));
    let params = driver.modify_parameters();
    assert_eq!(params.len(), 1, "{params:?}");
    assert_eq!(params[0]["iops"], "3000");
    assert_eq!(params[0]["csi.storage.k8s.io/pvc/name"], "data");
    assert_eq!(params[0]["csi.storage.k8s.io/pvc/namespace"], env.ns.name());
    assert_eq!(params[0]["csi.storage.k8s.io/pv/name"], pv_name);
    let msgs = env.wait_event("VolumeModifySuccessful", "successfully").await;
    assert_eq!(msgs[0], format!("external resizer modified volume data with vac {gold} successfully"));
    env.wait_event("VolumeModify", &format!("is modifying volume data with vac {gold}")).await;
}

#[tokio::test]
async fn invalid_argument_is_infeasible_and_the_user_can_roll_back() {
    let env = Env::new("rszf-vacbad").await;
    let (driver, _sidecar) = env.start(
        |s| Script { modify: true, modify_error: Some((Code::InvalidArgument, "iops out of range".into())), ..s },
        &[],
    );
    env.bound_claim("data").await;
    let fast = env.create_vac("fast", &env.driver_name, &[("iops", "999999")]).await;
    // Created long before it is used: a class the resizer has not seen yet
    // is a missing one, Pending until the user changes the class again.
    let other = env.create_vac("other", "other.example.com", &[("tier", "x")]).await;
    env.set_vac("data", Some(&fast)).await.expect("set class");
    let c = wait_for(&env.pvcs(), "data", T, |c| modify_state(c).is_some_and(|s| s.0 == "Infeasible")).await;
    let err = condition(&c, "ModifyVolumeError").expect("ModifyVolumeError");
    assert_eq!((err.reason.as_deref(), err.message.as_deref()), (Some("InvalidArgument"), Some("iops out of range")));
    let modifying = condition(&c, "ModifyingVolume").expect("ModifyingVolume");
    assert_eq!(
        modifying.message.as_deref(),
        Some(format!("Modifying volume to \"{fast}\" failed. Waiting for retry.").as_str())
    );
    env.wait_event("VolumeModifyFailed", "code = InvalidArgument").await;
    // Rollback: the class was never applied, so the user may clear it.
    env.set_vac("data", None).await.expect("clear the class");
    let c = wait_for(&env.pvcs(), "data", T, |c| condition(c, "ModifyingVolume").is_none()).await;
    assert_eq!(current_vac(&c), None);
    env.wait_event("VolumeModifyCanceled", "Cancelled modify.").await;
    let calls = driver.modify_parameters().len();
    assert!(calls >= 1);
    // A class of another driver: an event, no call.
    env.set_vac("data", Some(&other)).await.expect("set another driver's class");
    env.wait_event("VolumeModifyFailed", &format!("VAC \"{other}\" is for driver other.example.com")).await;
    let c = wait_for(&env.pvcs(), "data", T, |c| modify_state(c).is_some_and(|s| s.0 == "Pending")).await;
    // Pending names no target: the one of the last attempt stays.
    assert_eq!(modify_state(&c).map(|s| s.1), Some(fast));
    assert_eq!(driver.modify_parameters().len(), calls, "no call for another driver's class");
}

fn modify_status(c: &PersistentVolumeClaim) -> Option<ModifyVolumeStatus> {
    c.status.as_ref()?.modify_volume_status.clone()
}

impl Env {
    /// Like [`Env::start`] with modify, but infeasible classes are held back
    /// for a minute (`--retry-interval-max=1m`): longer than any step here.
    fn start_modify(&self) -> (FaultDriver, Proc) {
        let script = Script { expand: true, modify: true, ..self.script() };
        let driver = FaultDriver::start(&self.socket(), Transport::Grpc, script);
        let args = ["-v=5", "provisioner", "resizer", "--retry-interval-start=200ms", "--retry-interval-max=1m"];
        (driver, self.sidecar("csi-sidecar", &sidecar_bin(), &args))
    }

    /// Sets the class and waits until the claim has it applied.
    async fn apply_vac(&self, claim: &str, vac: &str) -> PersistentVolumeClaim {
        self.set_vac(claim, Some(vac)).await.expect("set class");
        wait_for(&self.pvcs(), claim, T, |c| current_vac(c).as_deref() == Some(vac)).await
    }

    /// How many times the events of `claim` said `message` (an aggregated
    /// event counts each time).
    async fn times_said(&self, claim: &str, message: &str) -> i32 {
        let events = events_for(&self.ns, claim).await;
        events.iter().filter(|e| e.message.as_deref() == Some(message)).map(|e| e.count.unwrap_or(1)).sum()
    }
}

/// Upstream's numbers: a class that does not exist is `{status: Pending}`
/// (no target, no condition, one event, no retry) and no call; the user's
/// correction is one call, at once.
#[tokio::test]
async fn a_missing_class_is_pending_without_a_target_and_costs_no_call() {
    let env = Env::new("rszf-vacmiss").await;
    let (driver, _sidecar) = env.start_modify();
    env.bound_claim("data").await;
    let gold = env.create_vac("gold", &env.driver_name, &[("iops", "3000")]).await;
    let silver = env.create_vac("silver", &env.driver_name, &[("iops", "1000")]).await;
    env.apply_vac("data", &gold).await;
    assert_eq!(driver.modify_parameters().len(), 1);

    let bogus = env.ns.scoped("bogus");
    env.set_vac("data", Some(&bogus)).await.expect("set a missing class");
    let c = wait_for(&env.pvcs(), "data", T, |c| modify_status(c).is_some()).await;
    assert_eq!(
        modify_status(&c),
        Some(ModifyVolumeStatus { status: "Pending".into(), target_volume_attributes_class_name: None })
    );
    assert!(condition(&c, "ModifyingVolume").is_none() && condition(&c, "ModifyVolumeError").is_none());
    assert_eq!(current_vac(&c).as_deref(), Some(gold.as_str()));
    let missing = format!("VAC \"{bogus}\" does not exist.");
    env.wait_event("VolumeModifyFailed", &missing).await;

    let c = env.apply_vac("data", &silver).await;
    assert_eq!(modify_status(&c), None);
    let params = driver.modify_parameters();
    assert_eq!(params.len(), 2, "gold, then silver: {params:?}");
    assert_eq!(params[1]["iops"], "1000");
    // The Pending write ended the sync: no retry said it again.
    assert_eq!(env.times_said("data", &missing).await, 1);
}

/// Upstream's numbers: an infeasible class is one call, then held back (the
/// retry that follows makes none) until the user picks another class, which
/// is one call at once.
#[tokio::test]
async fn an_infeasible_class_is_called_once_and_held_back_until_the_user_picks_another() {
    let env = Env::new("rszf-vacheld").await;
    let (driver, sidecar) = env.start_modify();
    env.bound_claim("data").await;
    let gold = env.create_vac("gold", &env.driver_name, &[("iops", "3000")]).await;
    let fast = env.create_vac("fast", &env.driver_name, &[("iops", "999999")]).await;
    let silver = env.create_vac("silver", &env.driver_name, &[("iops", "1000")]).await;
    env.apply_vac("data", &gold).await;
    assert_eq!(driver.modify_parameters().len(), 1);

    driver.update(|s| s.modify_error = Some((Code::InvalidArgument, "iops out of range".into())));
    env.set_vac("data", Some(&fast)).await.expect("set an infeasible class");
    let c = wait_for(&env.pvcs(), "data", T, |c| modify_state(c).is_some_and(|s| s.0 == "Infeasible")).await;
    assert_eq!(
        modify_status(&c),
        Some(ModifyVolumeStatus {
            status: "Infeasible".into(),
            target_volume_attributes_class_name: Some(fast.clone())
        })
    );
    // The retry after the failure ran and was held back.
    let key = format!("{}/data", env.ns.name());
    let skipped = format!(
        "skipping volume modification for pvc {key}, because modification previously failed with infeasible error"
    );
    wait_until("the retry is held back", T, async || (sidecar.logs().contains(&skipped), ())).await;
    assert_eq!(driver.modify_parameters().len(), 2, "gold, then fast once");

    driver.update(|s| s.modify_error = None);
    let c = env.apply_vac("data", &silver).await;
    assert_eq!(modify_status(&c), None);
    assert!(condition(&c, "ModifyingVolume").is_none() && condition(&c, "ModifyVolumeError").is_none());
    let params = driver.modify_parameters();
    assert_eq!(params.len(), 3, "gold, fast, silver: {params:?}");
    assert_eq!(params[2]["iops"], "1000");
}

/// A modification that runs while the kubelet finishes a file-system
/// resize: the resizer writes the claim's conditions by type, so the
/// `FileSystemResizePending` the kubelet removed meanwhile is not written
/// back from the copy the modification started with.
#[tokio::test]
async fn a_slow_modification_does_not_write_back_a_condition_the_kubelet_removed() {
    let env = Env::new("rszf-stale").await;
    let (driver, _sidecar) = env.start(|s| Script { modify: true, node_expansion_required: true, ..s }, &[]);
    env.bound_claim("data").await;
    env.request("data", "2Mi").await;
    wait_for(&env.pvcs(), "data", T, |c| condition(c, "FileSystemResizePending").is_some()).await;
    driver.update(|s| s.modify_hold = true);
    let gold = env.create_vac("gold", &env.driver_name, &[("iops", "3000")]).await;
    env.set_vac("data", Some(&gold)).await.expect("set class");
    wait_until("the modification running in the driver", T, async || {
        let calls = driver.controller_calls();
        (calls.iter().any(|c| c.kind == CallKind::Modify && c.end.is_none()), calls.len())
    })
    .await;
    // The kubelet finishes the file system meanwhile: its condition goes.
    let c = env.pvcs().get_status("data").await.expect("claim");
    let conditions: Vec<_> = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x.type_ != "FileSystemResizePending")
        .collect();
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": c.metadata.resource_version},
        "status": {"conditions": conditions, "capacity": {"storage": "2Mi"}, "allocatedResourceStatuses": null},
    });
    env.pvcs().patch_status("data", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the kubelet's write");
    driver.update(|s| s.modify_hold = false);
    let c = wait_for(&env.pvcs(), "data", T, |c| current_vac(c).as_deref() == Some(gold.as_str())).await;
    assert!(
        condition(&c, "FileSystemResizePending").is_none(),
        "written back from a stale copy: {:?}",
        c.status.and_then(|s| s.conditions)
    );
    assert!(condition(&c, "ModifyingVolume").is_none() && condition(&c, "ModifyVolumeError").is_none());
}

/// Two resizer replicas; the leader is killed with SIGKILL while 30 claims
/// are being expanded: every claim ends at its size, and no volume ever had
/// two ControllerExpandVolume calls at once.
#[tokio::test]
async fn leader_killed_during_expansions_finishes_every_claim_without_overlaps() {
    let env = Env::new("rszf-kill").await;
    let driver = FaultDriver::start(
        &env.socket(),
        Transport::Grpc,
        Script { expand: true, expand_delay: Duration::from_millis(300), ..env.script() },
    );
    let provisioner = env.sidecar("provisioner", &sidecar_bin(), &["provisioner"]);
    const N: usize = 30;
    for i in 0..N {
        create(&env.pvcs(), &pvc(&format!("c{i}"), Some(&env.sc), "1Mi")).await;
    }
    wait_until("all claims bound", T, async || {
        let bound = env
            .pvcs()
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items.iter().filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).count()
            })
            .unwrap_or(0);
        (bound == N, bound)
    })
    .await;
    let mut args: Vec<String> = csi_sidecar_integration::failover::fast_leader_election(env.ns.name());
    args.extend(
        ["resizer", "--workers=3", "--retry-interval-start=200ms", "--retry-interval-max=2s"].map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = env.sidecar("resizer-a", &sidecar_bin(), &args);
    let mut b = env.sidecar("resizer-b", &sidecar_bin(), &args);
    csi_sidecar_integration::failover::wait_one_leader(&a, &b).await;
    for i in 0..N {
        env.request(&format!("c{i}"), "2Mi").await;
    }
    wait_until("some expansions done", T, async || {
        let n = driver.expand_calls().iter().filter(|c| c.outcome == Some(CallOutcome::Ok)).count();
        (n >= 5, n)
    })
    .await;
    csi_sidecar_integration::failover::kill_leader(&mut a, &mut b).await;
    wait_until("every claim at 2Mi", Duration::from_secs(120), async || {
        let done = env
            .pvcs()
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|c| capacity(c).as_deref() == Some("2Mi")).count())
            .unwrap_or(0);
        (done == N, done)
    })
    .await;
    let calls = driver.expand_calls();
    assert!(calls.iter().all(|c| c.bytes == 2 * MI), "only the requested size: {calls:?}");
    assert!(driver.overlaps().is_empty(), "two calls at once on one volume: {:?}", driver.overlaps());
    let volumes: std::collections::BTreeSet<_> = calls.iter().map(|c| c.volume_id.clone()).collect();
    assert_eq!(volumes.len(), N, "every volume expanded");
    drop(provisioner);
}
