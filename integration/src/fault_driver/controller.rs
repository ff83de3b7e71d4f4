//! The Controller service: volumes, publishes, expansion, modification,
//! capacity and snapshots (ListVolumes and ControllerGetVolume: [`super::health`]).

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use csi_sidecar::csi::proto::csi::v1::{self as csi, controller_server::Controller};
use tonic::{Request, Response, Status};

use super::{CallKind, CallRecord, Service, SnapshotCall, SnapshotMethod, check_secret, segment_key};

#[tonic::async_trait]
impl Controller for Service {
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type, rpc::Type as RpcType};
        let mut rpcs = vec![RpcType::CreateDeleteVolume];
        // The legacy VOLUME_CONDITION has no name in v1.13: raw values.
        let mut raw = Vec::new();
        let s = self.script();
        if s.publish {
            rpcs.extend([RpcType::PublishUnpublishVolume, RpcType::ListVolumes, RpcType::ListVolumesPublishedNodes]);
            if s.publish_readonly {
                rpcs.push(RpcType::PublishReadonly);
            }
        }
        if s.expand {
            rpcs.push(RpcType::ExpandVolume);
        }
        if s.modify {
            rpcs.push(RpcType::ModifyVolume);
        }
        if s.snapshots {
            rpcs.push(RpcType::CreateDeleteSnapshot);
            if s.list_snapshots {
                rpcs.push(RpcType::ListSnapshots);
            }
        }
        if s.clone {
            rpcs.push(RpcType::CloneVolume);
        }
        if s.capacity {
            rpcs.push(RpcType::GetCapacity);
        }
        raw.extend(rpcs.into_iter().map(|r| r as i32));
        s.health.add_capabilities(&mut raw);
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: raw
                .into_iter()
                .map(|r| csi::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: r })) })
                .collect(),
        }))
    }

    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.counters.creates.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        if let Some((code, msg)) = s.create_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        // One operation per volume at a time: a retry while the backend
        // still creates the volume is refused, never run twice.
        if !self.creating.lock().expect("creating").insert(req.name.clone()) {
            return Err(aborted(&req.name));
        }
        // The backend finishes the operation even if the caller gives up
        // (tonic drops this handler when the client cancels).
        let (volumes, creating, name, delay) =
            (self.volumes.clone(), self.creating.clone(), req.name.clone(), s.create_delay);
        let id = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let id = format!("fault-{name}");
            let id = volumes.lock().expect("volumes").entry(name.clone()).or_insert(id).clone();
            creating.lock().expect("creating").remove(&name);
            id
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let mount =
            |c: &csi::VolumeCapability| matches!(c.access_type, Some(csi::volume_capability::AccessType::Mount(_)));
        if req.volume_capabilities.iter().any(mount) {
            self.filesystems.lock().expect("filesystems").insert(id.clone());
        }
        let bytes = req.capacity_range.map_or(0, |c| c.required_bytes);
        let content_source = req.volume_content_source;
        let segment = req.accessibility_requirements.as_ref().and_then(|r| r.preferred.first().or(r.requisite.first()));
        let accessible_topology = segment.filter(|_| s.topology).cloned().into_iter().collect();
        let key = segment.map(|t| segment_key(&t.segments)).unwrap_or_default();
        self.allocations.lock().expect("allocations").entry(id.clone()).or_insert((key, bytes));
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: id,
                capacity_bytes: bytes - s.create_shortfall,
                content_source,
                accessible_topology,
                ..Default::default()
            }),
        }))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.counters.publishes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Publish, &req.volume_id, &req.node_id, 0);
        let result = self.publish(req).await;
        record.finish(result)
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.counters.unpublishes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Unpublish, &req.volume_id, &req.node_id, 0);
        let result = self.unpublish(req).await;
        record.finish(result)
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        let bytes = req.capacity_range.map_or(0, |c| c.required_bytes);
        let record = CallRecord::begin(&self.calls, CallKind::Expand, &req.volume_id, "", bytes);
        let s = self.script();
        tokio::time::sleep(s.expand_delay).await;
        let result = match (&s.expand_error, s.expand_limit) {
            (Some((code, msg)), _) => Err(Status::new(*code, msg.clone())),
            (None, Some(limit)) if bytes > limit => {
                Err(Status::out_of_range(format!("{bytes} bytes exceed the backend's limit of {limit}")))
            }
            _ => Ok(Response::new(csi::ControllerExpandVolumeResponse {
                capacity_bytes: bytes - s.expand_shortfall,
                node_expansion_required: s.node_expansion_required,
            })),
        };
        record.finish(result)
    }

    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let req = req.into_inner();
        let record = CallRecord::begin(&self.calls, CallKind::Modify, &req.volume_id, "", 0);
        self.modify_log.lock().expect("modify log").push(req.mutable_parameters.clone().into_iter().collect());
        while self.script().modify_hold {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let result = match self.script().modify_error {
            Some((code, msg)) => Err(Status::new(code, msg)),
            None => Ok(Response::new(csi::ControllerModifyVolumeResponse {})),
        };
        record.finish(result)
    }

    // ListVolumes and ControllerGetVolume: `health::ControllerWithLegacy`.

    async fn controller_list_volume_health(
        &self,
        req: Request<csi::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerListVolumeHealthResponse>, Status> {
        self.list_volume_health(req.into_inner()).map(Response::new)
    }

    async fn controller_get_volume_health(
        &self,
        req: Request<csi::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeHealthResponse>, Status> {
        self.get_volume_health(req.into_inner()).map(Response::new)
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.do_create_snapshot(req.into_inner()).await
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = req.into_inner();
        self.log_snapshot_call(SnapshotMethod::Delete, &req.snapshot_id, &req.secrets, &Default::default());
        let s = self.script();
        if let Some((code, msg)) = s.delete_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        self.snapshots.lock().expect("snapshots").retain(|_, (id, _)| *id != req.snapshot_id);
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        self.log_snapshot_call(SnapshotMethod::List, &req.snapshot_id, &req.secrets, &Default::default());
        let s = self.script();
        if let Some((code, msg)) = s.list_snapshots_error {
            return Err(Status::new(code, msg));
        }
        let mut found: Vec<(String, String)> = self
            .snapshots
            .lock()
            .expect("snapshots")
            .values()
            .filter(|(id, _)| req.snapshot_id.is_empty() || *id == req.snapshot_id)
            .cloned()
            .collect();
        // Members of group snapshots are snapshots too.
        found.extend(
            self.groups
                .lock()
                .expect("groups")
                .values()
                .flat_map(|(_, members)| members.iter())
                .filter(|(id, _)| req.snapshot_id.is_empty() || *id == req.snapshot_id)
                .cloned(),
        );
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: found
                .iter()
                .map(|(id, src)| csi::list_snapshots_response::Entry { snapshot: Some(self.snapshot(id, src, true)) })
                .collect(),
            next_token: String::new(),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.counters.deletes.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        if let Some((code, msg)) = s.delete_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let id = req.volume_id;
        // A volume the backend is still creating cannot be deleted yet.
        if let Some(name) = id.strip_prefix("fault-").filter(|n| self.creating.lock().expect("creating").contains(*n)) {
            return Err(aborted(name));
        }
        self.volumes.lock().expect("volumes").retain(|_, v| *v != id);
        self.allocations.lock().expect("allocations").remove(&id);
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.counters.get_capacities.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let s = self.script();
        let key = req.accessible_topology.as_ref().map(|t| segment_key(&t.segments)).unwrap_or_default();
        let Some(total) = s.capacity_segments.get(&key).copied().or(s.capacity_total) else {
            return Err(Status::not_found(format!("unknown topology segment {key:?}")));
        };
        let used: i64 =
            self.allocations.lock().expect("allocations").values().filter(|(k, _)| *k == key).map(|(_, b)| b).sum();
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: s.capacity_garbage.unwrap_or(total - used),
            maximum_volume_size: s.capacity_maximum,
            minimum_volume_size: None,
        }))
    }
}

impl Service {
    fn log_snapshot_call(
        &self,
        method: SnapshotMethod,
        target: &str,
        secrets: &std::collections::HashMap<String, String>,
        parameters: &std::collections::HashMap<String, String>,
    ) {
        self.snapshot_log.lock().expect("snapshot log").push(SnapshotCall {
            method,
            target: target.to_string(),
            secrets: secrets.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            parameters: parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            at: Instant::now(),
        });
    }

    pub(super) fn snapshot(&self, id: &str, source: &str, ready: bool) -> csi::Snapshot {
        csi::Snapshot {
            size_bytes: 1 << 20,
            snapshot_id: id.to_string(),
            source_volume_id: source.to_string(),
            creation_time: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 123_456_789 }),
            ready_to_use: ready,
            group_snapshot_id: String::new(),
            accessible_topology: Vec::new(),
        }
    }

    async fn do_create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.log_snapshot_call(SnapshotMethod::Create, &req.name, &req.secrets, &req.parameters);
        let s = self.script();
        if let Some((code, msg)) = s.create_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let (snapshots, name, source, delay) =
            (self.snapshots.clone(), req.name.clone(), req.source_volume_id.clone(), s.create_snapshot_delay);
        let (id, source) = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let id = format!("fault-snap-{name}");
            snapshots.lock().expect("snapshots").entry(name).or_insert((id, source)).clone()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        self.blocks.cut(&source, &id).map_err(|e| Status::internal(format!("cutting snapshot {id}: {e}")))?;
        if s.create_snapshot_empty {
            return Ok(Response::new(csi::CreateSnapshotResponse { snapshot: None }));
        }
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(self.snapshot(&id, &source, !s.snapshot_not_ready)),
        }))
    }
}

/// The refusal of an operation on a volume another operation still holds.
fn aborted(name: &str) -> Status {
    Status::aborted(format!("an operation with the given Volume ID {name} already exists"))
}
