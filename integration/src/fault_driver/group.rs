//! The GroupController service: group snapshots (with `Script::group_snapshots`).

use csi_sidecar::csi::proto::csi::v1::{self as csi, group_controller_server::GroupController};
use tonic::{Request, Response, Status};

use super::{GroupCall, GroupMethod, Service, check_secret};

#[tonic::async_trait]
impl GroupController for Service {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        use csi::group_controller_service_capability::{Rpc, Type, rpc::Type as RpcType};
        if !self.script().group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        let rpc = Rpc { r#type: RpcType::CreateDeleteGetVolumeGroupSnapshot as i32 };
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![csi::GroupControllerServiceCapability { r#type: Some(Type::Rpc(rpc)) }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        req: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        self.log_group_call(GroupMethod::Create, &req.name, &req.source_volume_ids, &req.secrets, &req.parameters);
        let s = self.script();
        if !s.group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        if let Some((code, msg)) = s.create_group_snapshot_error {
            return Err(Status::new(code, msg));
        }
        check_secret(&s, &req.secrets)?;
        let (id, members) = self
            .groups
            .lock()
            .expect("groups")
            .entry(req.name.clone())
            .or_insert_with(|| {
                let members = req
                    .source_volume_ids
                    .iter()
                    .map(|v| (format!("fault-gsnap-{}-{v}", req.name), v.clone()))
                    .collect();
                (format!("fault-group-{}", req.name), members)
            })
            .clone();
        Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse { group_snapshot: Some(self.group(&id, &members)) }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        req: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        let no = Default::default();
        self.log_group_call(GroupMethod::Delete, &req.group_snapshot_id, &req.snapshot_ids, &req.secrets, &no);
        let s = self.script();
        if !s.group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        check_secret(&s, &req.secrets)?;
        self.groups.lock().expect("groups").retain(|_, (id, _)| *id != req.group_snapshot_id);
        Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        req: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        let req = req.into_inner();
        let no = Default::default();
        self.log_group_call(GroupMethod::Get, &req.group_snapshot_id, &req.snapshot_ids, &req.secrets, &no);
        if !self.script().group_snapshots {
            return Err(Status::unimplemented("unknown service csi.v1.GroupController"));
        }
        let found = self.groups.lock().expect("groups").values().find(|(id, _)| *id == req.group_snapshot_id).cloned();
        match found {
            Some((id, members)) => Ok(Response::new(csi::GetVolumeGroupSnapshotResponse {
                group_snapshot: Some(self.group(&id, &members)),
            })),
            None => Err(Status::not_found(format!("no group snapshot {}", req.group_snapshot_id))),
        }
    }
}

impl Service {
    fn log_group_call(
        &self,
        method: GroupMethod,
        target: &str,
        ids: &[String],
        secrets: &std::collections::HashMap<String, String>,
        parameters: &std::collections::HashMap<String, String>,
    ) {
        self.group_log.lock().expect("group log").push(GroupCall {
            method,
            target: target.to_string(),
            ids: ids.to_vec(),
            secrets: secrets.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            parameters: parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }

    fn group(&self, id: &str, members: &[(String, String)]) -> csi::VolumeGroupSnapshot {
        csi::VolumeGroupSnapshot {
            group_snapshot_id: id.to_string(),
            snapshots: members
                .iter()
                .map(|(sid, vol)| csi::Snapshot { group_snapshot_id: id.to_string(), ..self.snapshot(sid, vol, true) })
                .collect(),
            creation_time: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
            ready_to_use: true,
        }
    }
}
