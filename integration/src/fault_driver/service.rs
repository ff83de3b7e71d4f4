//! The state every CSI service of the driver shares, and its common helpers.

use std::sync::{Arc, Mutex};

use csi_sidecar::csi::proto::csi::v1 as csi;
use tonic::{Response, Status};

use super::{
    Allocations, CallLog, Counters, GroupCall, Groups, HealthBook, ModifyLog, PublishCall, PublishLog, Published,
    Script, SnapshotCall, Snapshots, Volumes,
};

#[derive(Clone)]
pub(super) struct Service {
    pub(super) groups: Groups,
    pub(super) group_log: Arc<Mutex<Vec<GroupCall>>>,
    pub(super) snapshots: Snapshots,
    pub(super) snapshot_log: Arc<Mutex<Vec<SnapshotCall>>>,
    pub(super) script: Arc<Mutex<Script>>,
    pub(super) counters: Arc<Counters>,
    pub(super) volumes: Volumes,
    pub(super) published: Published,
    pub(super) publish_log: Arc<Mutex<PublishLog>>,
    pub(super) calls: CallLog,
    pub(super) modify_log: ModifyLog,
    pub(super) allocations: Allocations,
    pub(super) health: HealthBook,
    /// Volume names whose CreateVolume the backend is still working on
    /// (callers that gave up included): another operation on one of them
    /// is refused with ABORTED, as drivers that lock per volume do
    /// (csi-driver-host-path's `VolumeLocks`).
    pub(super) creating: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Volumes created with a mount (filesystem) access type: their
    /// snapshots have no block metadata (the hostpath driver's refusal).
    pub(super) filesystems: Arc<Mutex<std::collections::HashSet<String>>>,
    /// The volumes' and snapshots' data (the SnapshotMetadata service).
    pub(super) blocks: super::blocks::BlockFiles,
}

impl Service {
    pub(super) fn script(&self) -> Script {
        self.script.lock().expect("script lock").clone()
    }

    pub(super) async fn publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let pair = (req.volume_id.clone(), req.node_id.clone());
        let attempt = {
            let mut log = self.publish_log.lock().expect("publish log");
            let running = log.running.entry(pair.clone()).or_default();
            *running += 1;
            let concurrent = *running > 1;
            log.calls.push(PublishCall {
                volume_id: req.volume_id.clone(),
                node_id: req.node_id.clone(),
                readonly: req.readonly,
                volume_context: req.volume_context.clone().into_iter().collect(),
                concurrent,
            });
            log.calls.iter().filter(|c| c.volume_id == pair.0 && c.node_id == pair.1).count()
        };
        // Counted as running until it returns, also when the caller gives up.
        let log = self.publish_log.clone();
        let _done = scopeguard(move || {
            let mut log = log.lock().expect("publish log");
            if let Some(n) = log.running.get_mut(&pair) {
                *n -= 1;
            }
        });
        let s = self.script();
        tokio::time::sleep(s.publish_delay).await;
        if let Some((code, msg)) = s.publish_error {
            return Err(Status::new(code, msg));
        }
        if attempt <= s.publish_failures_per_pair as usize {
            return Err(Status::internal(format!("injected failure of publish attempt {attempt}")));
        }
        {
            let mut published = self.published.lock().expect("published");
            let nodes = published.entry(req.volume_id).or_default();
            if !nodes.contains(&req.node_id) {
                nodes.push(req.node_id);
            }
        }
        tokio::time::sleep(s.publish_answer_delay).await;
        let publish_context = match s.publish_context {
            Some(c) => c.into_iter().collect(),
            None => [("device".to_string(), "/dev/fault".to_string())].into(),
        };
        Ok(Response::new(csi::ControllerPublishVolumeResponse { publish_context }))
    }

    pub(super) async fn unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let s = self.script();
        tokio::time::sleep(s.unpublish_delay).await;
        match s.unpublish_error {
            Some((code, msg)) => Err(Status::new(code, msg)),
            None => {
                if let Some(nodes) = self.published.lock().expect("published").get_mut(&req.volume_id) {
                    nodes.retain(|n| *n != req.node_id);
                }
                Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
            }
        }
    }
}

pub(super) fn check_secret(s: &Script, secrets: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    match &s.required_secret {
        Some((k, v)) if secrets.get(k) != Some(v) => {
            Err(Status::unauthenticated(format!("secret {k} missing or wrong")))
        }
        _ => Ok(()),
    }
}

/// Runs `f` when dropped.
struct Guard<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for Guard<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

fn scopeguard<F: FnOnce()>(f: F) -> Guard<F> {
    Guard(Some(f))
}
