//! The health monitor against the fault driver (both health forms,
//! switchable per volume) and the real control plane of this run's
//! Kubernetes version: events for a CSI <= 1.12 driver, and for a CSI 1.13
//! driver `status.healthStatus` where the apiserver serves it (1.37+ with
//! `CSIVolumeHealth`, which the test world turns on), else the same events
//! with a log line naming the missing field. Nothing is written while
//! nothing changes; a standby that takes over repeats nothing; the node
//! watcher reports a failed node; a driver without health capabilities
//! exits with a message naming what it lacks.

use std::time::Duration;

use csi_sidecar::csi::{HealthCondition, HealthStatus};
use csi_sidecar_integration::{
    deref_fault_env,
    fault_driver::{FaultDriver, FaultEnv, HealthForms, Script, Transport},
    free_port,
    kube_support::{create, node, wait_for},
    process::Proc,
    sidecar_bin, wait_until,
};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
const ABNORMAL: &str = "VolumeConditionAbnormal";
const NORMAL: &str = "VolumeConditionNormal";

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

    /// The driver with `form`, and csi-sidecar running the provisioner and
    /// the health monitor with one-second intervals (`args` after them).
    fn start(&self, form: HealthForms, args: &[&str]) -> (FaultDriver, Proc) {
        let driver = FaultDriver::start(&self.socket(), Transport::Grpc, Script { health: form, ..self.script() });
        let mut all = vec!["-v=5", "provisioner", "--retry-interval-start=200ms", "--retry-interval-max=2s"];
        all.extend(["health-monitor", "--monitor-interval=1s", "--list-volumes-interval=1s", "--timeout=5s"]);
        all.extend(args);
        (driver, self.sidecar("csi-sidecar", &sidecar_bin(), &all))
    }

    /// A bound claim; its volume ID.
    async fn volume(&self, claim: &str) -> String {
        let pv = self.base.bound_claim(claim, &self.sc, T).await;
        let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.ns.client().clone());
        let pv = pvs.get(&pv).await.expect("pv");
        pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).expect("volume handle")
    }

    /// The claim's events of `reason`, each with its count.
    async fn events(&self, claim: &str, reason: &str) -> Vec<(String, i32, String)> {
        let api: Api<Event> = self.ns.api();
        let fields = format!("involvedObject.name={claim},reason={reason}");
        let list = api.list(&ListParams::default().fields(&fields)).await.expect("events");
        list.items
            .into_iter()
            .map(|e| (e.message.unwrap_or_default(), e.count.unwrap_or(1), e.type_.unwrap_or_default()))
            .collect()
    }

    async fn wait_event(&self, claim: &str, reason: &str, containing: &str) {
        wait_until(&format!("{reason} on {claim} containing {containing:?}"), T, async || {
            let e = self.events(claim, reason).await;
            (e.iter().any(|(m, _, _)| m.contains(containing)), e)
        })
        .await;
    }

    /// Waits until the driver has answered `n` more health calls than now
    /// (passes that had the chance to write).
    async fn passes(&self, driver: &FaultDriver, n: u64) {
        let start = health_calls(driver);
        wait_until(&format!("{n} more health calls"), T, async || {
            let now = health_calls(driver);
            (now >= start + n, now)
        })
        .await;
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }
}

fn health_calls(driver: &FaultDriver) -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    let c = &driver.counters;
    c.list_volumes.load(SeqCst)
        + c.controller_get_volumes.load(SeqCst)
        + c.list_volume_healths.load(SeqCst)
        + c.get_volume_healths.load(SeqCst)
}

fn entry(status: HealthStatus, reason: &str, message: &str) -> HealthCondition {
    HealthCondition { status, reason: reason.into(), message: message.into() }
}

const LIST_CONDITION: HealthForms = HealthForms { legacy_list: true, ..HealthForms::NONE };
const GET_CONDITION: HealthForms = HealthForms { legacy_get: true, ..HealthForms::NONE };

/// Whether this run's apiserver keeps `status.healthStatus` (asked with a
/// dry-run patch, as the module does, not from the version number).
async fn status_field_served(env: &Env, claim: &str) -> bool {
    let patch = json!({"status": {"healthStatus": {
        "healthConditions": [{"status": "Degraded", "reason": "t", "message": "t"}],
        "lastTransitionTime": "2000-01-01T00:00:00Z"}}});
    let pp = PatchParams { dry_run: true, ..Default::default() };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        env.ns.client().clone(),
        env.ns.name(),
        &kube::api::ApiResource::erase::<PersistentVolumeClaim>(&()),
    );
    let c = api.patch_status(claim, &pp, &Patch::Merge(&patch)).await.expect("dry-run status patch");
    c.data["status"]["healthStatus"].is_object()
}

async fn health_status(env: &Env, claim: &str) -> (serde_json::Value, String) {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        env.ns.client().clone(),
        env.ns.name(),
        &kube::api::ApiResource::erase::<PersistentVolumeClaim>(&()),
    );
    let c = api.get(claim).await.expect("claim");
    (c.data["status"]["healthStatus"].clone(), c.metadata.resource_version.unwrap_or_default())
}

/// The released form, list and get mode: one abnormal event, nothing while
/// it stays abnormal, one recovery event, nothing while it stays healthy.
async fn events_on_change_only(prefix: &str, form: HealthForms) {
    let env = Env::new(prefix).await;
    let port = free_port();
    let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
    let (driver, sidecar) = env.start(form, &[&endpoint]);
    let volume = env.volume("data").await;
    env.passes(&driver, 2).await;
    assert!(env.events("data", ABNORMAL).await.is_empty(), "healthy: no event");

    let gone = "The source path of the volume doesn't exist";
    let before = health_calls(&driver);
    driver.set_volume_health(&volume, vec![entry(HealthStatus::Degraded, "", gone)]);
    env.wait_event("data", ABNORMAL, gone).await;
    // Within one interval: the pass under way when the volume changed, or
    // the next one, wrote it.
    assert!(health_calls(&driver) <= before + 3, "{} health calls before the event", health_calls(&driver) - before);
    let metrics = csi_sidecar_integration::http::get(&format!("127.0.0.1:{port}"), "/metrics").await.expect("metrics");
    assert!(
        metrics.body.lines().any(|l| l.starts_with("csi_sidecar_volume_health_abnormal{")
            && l.contains("persistentvolumeclaim=\"data\"")
            && l.contains("condition=\"Degraded\"")),
        "{}",
        metrics.body
    );
    env.passes(&driver, 3).await;
    let abnormal = env.events("data", ABNORMAL).await;
    assert_eq!(abnormal.iter().map(|(_, c, _)| c).sum::<i32>(), 1, "reported once: {abnormal:?}");
    assert_eq!(abnormal[0].2, "Warning");

    driver.set_volume_health(&volume, vec![]);
    env.wait_event("data", NORMAL, "The Volume returns to the healthy state").await;
    env.passes(&driver, 3).await;
    let normal = env.events("data", NORMAL).await;
    assert_eq!(normal.iter().map(|(_, c, _)| c).sum::<i32>(), 1, "{normal:?}");
    assert_eq!(normal[0].2, "Normal");
    assert_eq!(env.events("data", ABNORMAL).await.iter().map(|(_, c, _)| c).sum::<i32>(), 1);
    let metrics = csi_sidecar_integration::http::get(&format!("127.0.0.1:{port}"), "/metrics").await.expect("metrics");
    assert!(!metrics.body.contains("persistentvolumeclaim=\"data\""), "healthy: no series");
    drop(sidecar);
}

#[tokio::test]
async fn list_mode_reports_a_volume_condition_as_events_on_change_only() {
    events_on_change_only("hm-list", LIST_CONDITION).await;
}

#[tokio::test]
async fn get_mode_reports_a_volume_condition_as_events_on_change_only() {
    events_on_change_only("hm-get", GET_CONDITION).await;
}

/// A CSI 1.13 driver: `status.healthStatus` where the apiserver serves it,
/// written on change only and cleared when healthy; elsewhere (Kubernetes
/// before 1.37) the same health as events, with a log line naming the
/// missing field and no status writes beyond the one dry-run question.
#[tokio::test]
async fn a_csi_1_13_driver_writes_the_claim_status_where_served_else_events() {
    let env = Env::new("hm-113").await;
    let (driver, sidecar) = env.start(HealthForms::V1_13, &[]);
    let volume = env.volume("data").await;
    let served = status_field_served(&env, "data").await;
    driver.set_volume_health(
        &volume,
        vec![entry(HealthStatus::Inaccessible, "NoPath", "no path"), entry(HealthStatus::Degraded, "", "slow")],
    );
    if served {
        let c = wait_until("status.healthStatus written", T, async || {
            let (h, _) = health_status(&env, "data").await;
            (h["healthConditions"].as_array().is_some_and(|a| a.len() == 2), h)
        })
        .await;
        assert_eq!(c["healthConditions"][0]["status"], "Degraded", "sorted: {c}");
        assert_eq!(c["healthConditions"][1]["status"], "Inaccessible", "{c}");
        assert_eq!(c["healthConditions"][1]["reason"], "NoPath", "{c}");
        let logs = sidecar.logs();
        assert!(logs.contains("status.healthStatus is served: volume health is written there"), "{logs}");
        let (_, version) = health_status(&env, "data").await;
        env.passes(&driver, 3).await;
        let (_, after) = health_status(&env, "data").await;
        assert_eq!(version, after, "nothing written while nothing changes");
        assert!(env.events("data", ABNORMAL).await.is_empty(), "the status form writes no events");

        driver.set_volume_health(&volume, vec![]);
        wait_until("status.healthStatus cleared", T, async || {
            let (h, _) = health_status(&env, "data").await;
            (h.is_null(), h)
        })
        .await;
    } else {
        env.wait_event("data", ABNORMAL, "Inaccessible (NoPath): no path").await;
        let logs = sidecar.logs();
        assert!(
            logs.contains("status.healthStatus is not served by this apiserver"),
            "the log names the missing field: {logs}"
        );
        env.passes(&driver, 3).await;
        assert_eq!(env.events("data", ABNORMAL).await.iter().map(|(_, c, _)| c).sum::<i32>(), 1);
        let (h, _) = health_status(&env, "data").await;
        assert!(h.is_null(), "no field on this version: {h}");
        // One dry-run question, then never again (no retry storm): the
        // apiserver counted two status patches in all, this test's own
        // question and the module's, and no more after three more passes.
        let status_patches = async || {
            let snap =
                csi_sidecar_integration::bench::snapshot(env.ns.client(), None).await.expect("apiserver metrics");
            snap.requests
                .iter()
                .filter(|(k, _)| k.starts_with("PATCH persistentvolumeclaims/status "))
                .map(|(_, n)| n)
                .sum::<f64>()
        };
        let counted = status_patches().await;
        assert_eq!(counted, 2.0, "status patches");
        env.passes(&driver, 3).await;
        assert_eq!(status_patches().await, counted, "no status patch while the field is not served");
        let logs = sidecar.logs();
        assert_eq!(logs.matches("status.healthStatus is not served").count(), 1, "{logs}");
        driver.set_volume_health(&volume, vec![]);
        env.wait_event("data", NORMAL, "The Volume returns to the healthy state").await;
    }
    drop(sidecar);
}

#[tokio::test]
async fn a_driver_without_health_capabilities_exits_naming_what_it_lacks() {
    let env = Env::new("hm-none").await;
    let (_driver, mut sidecar) = env.start(HealthForms::NONE, &[]);
    let status = sidecar.wait_exit(T).await.expect("the sidecar exits");
    assert_eq!(status.code(), Some(1), "{}", sidecar.logs());
    let logs = sidecar.logs();
    assert!(logs.contains("CSI driver does not report volume health"), "{logs}");
    assert!(logs.contains("VOLUME_CONDITION") && logs.contains("LIST_VOLUME_HEALTH"), "{logs}");
}

/// Leader election: the standby that takes over after the leader's SIGKILL
/// recalls the abnormal report from the leader's event and repeats nothing.
#[tokio::test]
async fn a_standby_taking_over_reports_no_duplicate_event() {
    let env = Env::new("hm-lead").await;
    let lease = ["--leader-election", "--leader-election-lease-duration=3s", "--leader-election-renew-deadline=2s"];
    let lease_args: Vec<&str> = lease.iter().copied().chain(["--leader-election-retry-period=500ms"]).collect();
    let (driver, mut leader) = env.start(LIST_CONDITION, &lease_args);
    let volume = env.volume("data").await;
    let gone = "gone";
    driver.set_volume_health(&volume, vec![entry(HealthStatus::Degraded, "", gone)]);
    env.wait_event("data", ABNORMAL, gone).await;

    let mut args = vec!["-v=5", "health-monitor", "--list-volumes-interval=1s", "--timeout=5s"];
    args.extend(lease_args.iter().copied());
    let standby = env.sidecar("standby", &sidecar_bin(), &args);
    leader.kill();
    wait_until("the standby leads", T, async || {
        let logs = standby.logs();
        (logs.contains("monitoring volume health"), logs.len())
    })
    .await;
    env.passes(&driver, 4).await;
    let abnormal = env.events("data", ABNORMAL).await;
    assert_eq!(abnormal.iter().map(|(_, c, _)| c).sum::<i32>(), 1, "no duplicate: {abnormal:?}");
    driver.set_volume_health(&volume, vec![]);
    env.wait_event("data", NORMAL, "The Volume returns to the healthy state").await;
    drop(standby);
}

/// The node watcher: a node NotReady for more than five minutes gives
/// NodeFailed on the claims of its pods; Ready again gives NodeRecovered.
#[tokio::test]
async fn the_node_watcher_reports_a_failed_and_a_recovered_node() {
    let env = Env::new("hm-node").await;
    let (_driver, mut sidecar) = env.start(LIST_CONDITION, &["--enable-node-watcher", "--node-list-add-interval=1s"]);
    env.volume("data").await;
    let nodes: Api<Node> = Api::all(env.ns.client().clone());
    let node_name = env.ns.scoped("node");
    create(&nodes, &node(&node_name, &[])).await;
    let set_ready = async |status: &str, minutes_ago: i64| {
        let at = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(minutes_ago);
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test",
            "lastHeartbeatTime": at.to_string(), "lastTransitionTime": at.to_string()}]}});
        nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Strategic(&patch)).await.expect("node status");
    };
    set_ready("True", 60).await;
    let pods: Api<Pod> = env.ns.api();
    create(&pods, &csi_sidecar_integration::kube_support::pod("app", &node_name, "data")).await;
    set_ready("False", 10).await;
    let failed = format!(
        "Pods: [ app ] consuming PVC: data in namespace: {} are now on a failed node: {node_name}",
        env.ns.name()
    );
    env.wait_event("data", "NodeFailed", &failed).await;
    set_ready("True", 0).await;
    env.wait_event("data", "NodeRecovered", &format!("Node: {node_name} recovered")).await;
    // A deleted Node is a failed one, and never crashes the monitor.
    nodes.delete(&node_name, &Default::default()).await.expect("delete node");
    wait_until("NodeFailed again for the deleted node", T, async || {
        let e = env.events("data", "NodeFailed").await;
        (e.iter().map(|(_, c, _)| c).sum::<i32>() >= 2, e)
    })
    .await;
    assert!(sidecar.try_exit().is_none(), "{}", sidecar.logs());
    let _ = wait_for(&env.claims(), "data", T, |_| true).await;
}
