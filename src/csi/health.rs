//! The health monitor's calls, in both forms a driver may speak:
//!
//! - v1.12 (legacy): `ListVolumes` and `ControllerGetVolume` whose volume
//!   status carries a `volume_condition` (field 2). CSI v1.13 removed and
//!   reserved that field, so its generated types drop it; these calls decode
//!   the same answers with `csi.v112` (`proto/csi_v112_volume_condition.proto`).
//! - v1.13: `ControllerListVolumeHealth` and `ControllerGetVolumeHealth`.
//!
//! Like the calls of `calls.rs`, each goes through [`Connection::call`]: its
//! deadline, its `csi_sidecar_operations_seconds` sample under upstream's
//! method name (the legacy ones under `ListVolumes` and `ControllerGetVolume`,
//! the paths they use) and its redacted trace log.

use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::{Request, Response, Status, transport::Channel};

use super::{
    calls::method,
    connection::Connection,
    proto::csi::{
        v1::{self as csi, controller_client::ControllerClient},
        v112,
    },
};

/// What is wrong with a volume (CSI v1.13 `VolumeHealthErrorType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    /// Usable, but not working as well as it should.
    Degraded,
    /// Not accessible.
    Inaccessible,
    /// Its data is lost, or suspected lost.
    DataLoss,
    /// `UNKNOWN_VOLUME_HEALTH_TYPE` or a value newer than this build knows.
    Unknown,
}

impl HealthStatus {
    /// The status of a wire value (prost keeps unknown enum values as `i32`).
    pub fn from_wire(value: i32) -> HealthStatus {
        use csi::VolumeHealthErrorType as T;
        match T::try_from(value) {
            Ok(T::Degraded) => HealthStatus::Degraded,
            Ok(T::Inaccessible) => HealthStatus::Inaccessible,
            Ok(T::DataLoss) => HealthStatus::DataLoss,
            Ok(T::UnknownVolumeHealthType) | Err(_) => HealthStatus::Unknown,
        }
    }
}

/// One adverse condition of a volume (a v1.13 `VolumeHealthEntry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCondition {
    /// What is wrong.
    pub status: HealthStatus,
    /// The driver's short CamelCase reason.
    pub reason: String,
    /// The driver's description (may be empty).
    pub message: String,
}

/// A volume's health in the v1.13 form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeHealth {
    /// The volume.
    pub volume_id: String,
    /// Its adverse conditions; empty: healthy.
    pub conditions: Vec<HealthCondition>,
}

impl VolumeHealth {
    /// No adverse condition known.
    pub fn is_healthy(&self) -> bool {
        self.conditions.is_empty()
    }
}

impl From<csi::VolumeHealth> for VolumeHealth {
    fn from(h: csi::VolumeHealth) -> VolumeHealth {
        VolumeHealth {
            volume_id: h.volume_id,
            conditions: h
                .health_statuses
                .into_iter()
                .map(|e| HealthCondition {
                    status: HealthStatus::from_wire(e.status),
                    reason: e.reason,
                    message: e.message,
                })
                .collect(),
        }
    }
}

/// A volume's condition in the v1.12 form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LegacyCondition {
    /// Not usable or not working as it should.
    pub abnormal: bool,
    /// The driver's description.
    pub message: String,
}

impl From<v112::VolumeCondition> for LegacyCondition {
    fn from(c: v112::VolumeCondition) -> LegacyCondition {
        LegacyCondition { abnormal: c.abnormal, message: c.message }
    }
}

/// The `(volume_id, condition)` pairs of a legacy `ListVolumes` page (pure).
/// Entries without a volume id name nothing and are left out.
pub fn legacy_list_entries(resp: v112::ListVolumesResponse) -> Vec<(String, Option<LegacyCondition>)> {
    resp.entries
        .into_iter()
        .filter_map(|e| {
            let id = e.volume.map(|v| v.volume_id).filter(|id| !id.is_empty())?;
            Some((id, legacy_condition(e.status)))
        })
        .collect()
}

/// The condition of a legacy volume status (pure).
fn legacy_condition(status: Option<v112::VolumeStatus>) -> Option<LegacyCondition> {
    status.and_then(|s| s.volume_condition).map(LegacyCondition::from)
}

/// The health of a `ControllerGetVolumeHealth` answer (pure): a missing
/// `volume_health` (required by the spec) is an error, a missing volume id
/// is the one asked for.
pub fn get_volume_health_answer(
    volume_id: String,
    resp: csi::ControllerGetVolumeHealthResponse,
) -> Result<VolumeHealth, Status> {
    let mut health: VolumeHealth = resp
        .volume_health
        .ok_or_else(|| Status::internal("ControllerGetVolumeHealth answered without volume_health"))?
        .into();
    if health.volume_id.is_empty() {
        health.volume_id = volume_id;
    }
    Ok(health)
}

/// A unary call on `path` answered with the message type `Resp`, which
/// need not be the generated client's (the v1.12 decodings).
async fn unary_as<Req, Resp>(ch: Channel, req: Request<Req>, path: &'static str) -> Result<Response<Resp>, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    grpc.unary(req, PathAndQuery::from_static(path), tonic_prost::ProstCodec::default()).await
}

impl Connection {
    /// One page of `ListVolumes`, decoded with the v1.12 `volume_condition`:
    /// the `(volume_id, condition)` pairs and the `next_token`.
    pub async fn list_volumes_with_condition(
        &self,
        timeout: Duration,
        max_entries: i32,
        starting_token: String,
    ) -> Result<(Vec<(String, Option<LegacyCondition>)>, String), Status> {
        let req = csi::ListVolumesRequest { max_entries, starting_token };
        let resp: v112::ListVolumesResponse =
            self.call(method::LIST_VOLUMES, timeout, req, |ch, r| unary_as(ch, r, method::LIST_VOLUMES)).await?;
        let next_token = resp.next_token.clone();
        Ok((legacy_list_entries(resp), next_token))
    }

    /// `ControllerGetVolume`, decoded with the v1.12 `volume_condition`.
    pub async fn controller_get_volume_with_condition(
        &self,
        timeout: Duration,
        volume_id: String,
    ) -> Result<Option<LegacyCondition>, Status> {
        let req = csi::ControllerGetVolumeRequest { volume_id };
        let resp: v112::ControllerGetVolumeResponse = self
            .call(method::CONTROLLER_GET_VOLUME, timeout, req, |ch, r| unary_as(ch, r, method::CONTROLLER_GET_VOLUME))
            .await?;
        Ok(legacy_condition(resp.status))
    }

    /// One page of `ControllerListVolumeHealth`: the volumes' health and the
    /// `next_token`.
    pub async fn controller_list_volume_health(
        &self,
        timeout: Duration,
        max_entries: i32,
        starting_token: String,
    ) -> Result<(Vec<VolumeHealth>, String), Status> {
        let req = csi::ControllerListVolumeHealthRequest { max_entries, starting_token, ..Default::default() };
        let resp = self
            .call(method::CONTROLLER_LIST_VOLUME_HEALTH, timeout, req, |ch, r| async move {
                ControllerClient::new(ch).controller_list_volume_health(r).await
            })
            .await?;
        Ok((resp.entries.into_iter().map(VolumeHealth::from).collect(), resp.next_token))
    }

    /// `ControllerGetVolumeHealth` of one volume.
    pub async fn controller_get_volume_health(
        &self,
        timeout: Duration,
        volume_id: String,
    ) -> Result<VolumeHealth, Status> {
        let req = csi::ControllerGetVolumeHealthRequest { volume_id: volume_id.clone(), ..Default::default() };
        let resp = self
            .call(method::CONTROLLER_GET_VOLUME_HEALTH, timeout, req, |ch, r| async move {
                ControllerClient::new(ch).controller_get_volume_health(r).await
            })
            .await?;
        get_volume_health_answer(volume_id, resp)
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn volume(id: &str) -> Option<csi::Volume> {
        Some(csi::Volume { volume_id: id.into(), ..Default::default() })
    }

    fn condition(abnormal: bool, message: &str) -> Option<v112::VolumeCondition> {
        Some(v112::VolumeCondition { abnormal, message: message.into() })
    }

    /// A page as a v1.12 driver sends it.
    fn legacy_page() -> v112::ListVolumesResponse {
        let entry = |id: &str, cond| v112::list_volumes_response::Entry {
            volume: volume(id),
            status: Some(v112::VolumeStatus { published_node_ids: vec!["node-1".into()], volume_condition: cond }),
        };
        v112::ListVolumesResponse {
            entries: vec![
                entry("vol-bad", condition(true, "disk gone")),
                entry("vol-ok", condition(false, "")),
                entry("vol-silent", None),
                v112::list_volumes_response::Entry { volume: None, status: None },
            ],
            next_token: "page-2".into(),
        }
    }

    #[test]
    fn a_legacy_list_answer_keeps_its_condition_only_in_the_legacy_decoding() {
        let bytes = legacy_page().encode_to_vec();
        // The v1.13 types skip the reserved field 2 and keep the rest.
        let spec = csi::ListVolumesResponse::decode(bytes.as_slice()).expect("v1.13 decoding");
        assert_eq!(spec.next_token, "page-2");
        assert_eq!(spec.entries.len(), 4);
        let status = spec.entries[0].status.as_ref().expect("status");
        assert_eq!(status.published_node_ids, ["node-1"]);
        assert_eq!(
            status.encode_to_vec(),
            csi::list_volumes_response::VolumeStatus { published_node_ids: vec!["node-1".into()] }.encode_to_vec()
        );
        // The legacy types keep it.
        let legacy = v112::ListVolumesResponse::decode(bytes.as_slice()).expect("legacy decoding");
        assert_eq!(
            legacy_list_entries(legacy),
            [
                ("vol-bad".to_string(), Some(LegacyCondition { abnormal: true, message: "disk gone".into() })),
                ("vol-ok".to_string(), Some(LegacyCondition { abnormal: false, message: String::new() })),
                ("vol-silent".to_string(), None),
            ]
        );
        // A v1.13 answer decodes with the legacy types, without a condition.
        let legacy = v112::ListVolumesResponse::decode(spec.encode_to_vec().as_slice()).expect("legacy decoding");
        assert!(legacy_list_entries(legacy).iter().all(|(_, c)| c.is_none()));
    }

    #[test]
    fn a_legacy_get_answer_keeps_its_condition_only_in_the_legacy_decoding() {
        let sent = v112::ControllerGetVolumeResponse {
            volume: volume("vol-1"),
            status: Some(v112::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: condition(true, "path lost"),
            }),
        };
        let bytes = sent.encode_to_vec();
        let spec = csi::ControllerGetVolumeResponse::decode(bytes.as_slice()).expect("v1.13 decoding");
        assert_eq!(spec.volume.expect("volume").volume_id, "vol-1");
        assert!(spec.status.expect("status").encode_to_vec().is_empty(), "the condition is dropped");
        let legacy = v112::ControllerGetVolumeResponse::decode(bytes.as_slice()).expect("legacy decoding");
        assert_eq!(
            legacy_condition(legacy.status),
            Some(LegacyCondition { abnormal: true, message: "path lost".into() })
        );
        assert_eq!(legacy_condition(None), None);
    }

    #[test]
    fn health_statuses_map_and_unknown_values_are_unknown() {
        let cases = [
            (0, HealthStatus::Unknown),
            (1, HealthStatus::Degraded),
            (2, HealthStatus::Inaccessible),
            (3, HealthStatus::DataLoss),
            (4, HealthStatus::Unknown),
            (-1, HealthStatus::Unknown),
            (99, HealthStatus::Unknown),
        ];
        for (wire, want) in cases {
            assert_eq!(HealthStatus::from_wire(wire), want, "{wire}");
        }
        // An entry with a status newer than this build survives the wire.
        let sent = csi::VolumeHealth {
            volume_id: "vol-1".into(),
            health_statuses: vec![
                csi::volume_health::VolumeHealthEntry { status: 2, reason: "NoPath".into(), message: "m".into() },
                csi::volume_health::VolumeHealthEntry {
                    status: 42,
                    reason: "MultipathLoss".into(),
                    message: String::new(),
                },
            ],
        };
        let got: VolumeHealth = csi::VolumeHealth::decode(sent.encode_to_vec().as_slice()).expect("decode").into();
        assert_eq!(
            got,
            VolumeHealth {
                volume_id: "vol-1".into(),
                conditions: vec![
                    HealthCondition {
                        status: HealthStatus::Inaccessible,
                        reason: "NoPath".into(),
                        message: "m".into()
                    },
                    HealthCondition {
                        status: HealthStatus::Unknown,
                        reason: "MultipathLoss".into(),
                        message: String::new()
                    },
                ],
            }
        );
        assert!(!got.is_healthy());
        assert!(VolumeHealth::from(csi::VolumeHealth { volume_id: "v".into(), health_statuses: vec![] }).is_healthy());
    }

    #[test]
    fn a_get_volume_health_answer_needs_its_health() {
        let none = csi::ControllerGetVolumeHealthResponse { volume_health: None };
        assert_eq!(get_volume_health_answer("v".into(), none).expect_err("no health").code(), tonic::Code::Internal);
        let anonymous = csi::ControllerGetVolumeHealthResponse { volume_health: Some(csi::VolumeHealth::default()) };
        let got = get_volume_health_answer("v".into(), anonymous).expect("health");
        assert_eq!(got, VolumeHealth { volume_id: "v".into(), conditions: vec![] });
    }
}
