//! The Identity service, and the Node service's `NodeGetInfo`.

use std::sync::atomic::Ordering;

use csi_sidecar::csi::proto::csi::v1::{
    self as csi, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse, identity_server::Identity, node_server::Node,
};
use tonic::{Request, Response, Status};

use super::{ProbeAnswer, Service};

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.counters.plugin_infos.fetch_add(1, Ordering::SeqCst);
        let s = self.script();
        tokio::time::sleep(s.plugin_info_delay).await;
        if let Some((code, msg)) = s.plugin_info_error {
            return Err(Status::new(code, msg));
        }
        Ok(Response::new(GetPluginInfoResponse {
            name: s.name,
            vendor_version: "0.0.1-fault".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service as Svc, Type, service::Type as SvcType};
        let s = self.script();
        let service = |t: SvcType| csi::PluginCapability { r#type: Some(Type::Service(Svc { r#type: t as i32 })) };
        let mut capabilities = Vec::new();
        if s.controller {
            capabilities.push(service(SvcType::ControllerService));
        }
        if s.topology {
            capabilities.push(service(SvcType::VolumeAccessibilityConstraints));
        }
        if s.snapshot_metadata {
            capabilities.push(service(SvcType::SnapshotMetadataService));
        }
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.counters.probes.fetch_add(1, Ordering::SeqCst);
        let s = self.script();
        tokio::time::sleep(s.probe_delay).await;
        match s.probe {
            ProbeAnswer::Ready => Ok(Response::new(ProbeResponse { ready: Some(true) })),
            ProbeAnswer::NotReady => Ok(Response::new(ProbeResponse { ready: Some(false) })),
            ProbeAnswer::Absent => Ok(Response::new(ProbeResponse { ready: None })),
            ProbeAnswer::Fail(code, msg) => Err(Status::new(code, msg)),
        }
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        match self.script().node_info {
            Some((node_id, segments)) => Ok(Response::new(csi::NodeGetInfoResponse {
                node_id,
                accessible_topology: Some(csi::Topology { segments: segments.into_iter().collect() }),
                ..Default::default()
            })),
            None => Err(Status::unimplemented("the fault driver has no node service in this script")),
        }
    }
}
