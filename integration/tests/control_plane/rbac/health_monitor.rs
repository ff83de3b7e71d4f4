//! The health monitor's live run under the manifests' RBAC.

use csi_sidecar::csi::{HealthCondition, HealthStatus};
use csi_sidecar_integration::kube_support::{create, csi_pv, node, pod};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
};
use serde_json::Value;

use super::CLAIM_STATUS_REFUSED;
use super::cycle::{Cycle, Failure, drop_ok, sanitize};

impl Cycle {
    /// The health monitor with a CSI 1.13 driver and the node watcher: a
    /// pre-bound claim of the driver (the dry-run status question asked),
    /// its volume abnormal, healthy, abnormal again with the same message
    /// (events, the repeat aggregated by a PATCH; `status.healthStatus`
    /// where the apiserver serves it), a pod of the claim on a node that
    /// fails, recovers and fails again (NodeFailed, aggregated), the Lease
    /// renewed.
    pub async fn run_health_monitor(&mut self) -> Result<(), Failure> {
        let client = self.ns.client().clone();
        let ns = self.ns.name().to_string();
        let nodes: Api<Node> = Api::all(client.clone());
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let claims_status: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<PersistentVolumeClaim>(&()));
        // A volume given a health is known to the fault driver's health calls.
        let volume = "health-1";
        self.driver.fault().set_volume_health(volume, vec![]);
        let pv_name = self.ns.scoped("pv");
        let pv = csi_pv(&pv_name, &self.driver_name, volume, "1Mi");
        self.pre_bound_claim(pv, None).await?;
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
}
