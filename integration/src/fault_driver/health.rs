//! The fault driver's volume health, in both forms a driver may speak, for
//! the health monitor's tests.
//!
//! - v1.12 (legacy): VOLUME_CONDITION (raw capability 11, which v1.13
//!   removed) with LIST_VOLUMES and/or GET_VOLUME; `ListVolumes` and
//!   `ControllerGetVolume` answers carry a `volume_condition` in field 2 of
//!   their volume status. The generated server speaks v1.13, which has no
//!   such field, so [`ControllerWithLegacy`] serves these two paths itself
//!   with the `csi.v112` messages and hands every other call to the
//!   generated `ControllerServer`.
//! - v1.13: LIST_VOLUME_HEALTH and/or GET_VOLUME_HEALTH, with
//!   `ControllerListVolumeHealth` (paginated) and `ControllerGetVolumeHealth`.
//!
//! Which forms are advertised is [`Script::health`] ([`HealthForms`]),
//! changeable while the driver runs; a volume's conditions are set with
//! [`FaultDriver::set_volume_health`] (a volume never set is healthy).

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    task::{Context, Poll},
};

use csi_sidecar::csi::{
    HealthCondition, HealthStatus, LegacyCondition,
    calls::method,
    driver::LEGACY_VOLUME_CONDITION,
    proto::csi::{
        v1::{self as csi, controller_server::ControllerServer},
        v112,
    },
};
use tonic::{Request, Response, Status, body::Body, server::NamedService};

use super::{FaultDriver, Script, Service};

/// The conditions set per volume id (empty: healthy).
pub type HealthBook = Arc<Mutex<BTreeMap<String, Vec<HealthCondition>>>>;

/// Which volume-health forms the controller advertises and serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthForms {
    /// v1.12: VOLUME_CONDITION with LIST_VOLUMES; `ListVolumes` then lists
    /// every volume (created, published or given a health) with its condition.
    pub legacy_list: bool,
    /// v1.12: VOLUME_CONDITION with GET_VOLUME; `ControllerGetVolume` answers
    /// (else `Unimplemented`).
    pub legacy_get: bool,
    /// v1.13: LIST_VOLUME_HEALTH; `ControllerListVolumeHealth` answers (else
    /// `Unimplemented`).
    pub list_health: bool,
    /// v1.13: GET_VOLUME_HEALTH; `ControllerGetVolumeHealth` answers (else
    /// `Unimplemented`).
    pub get_health: bool,
    /// `ControllerListVolumeHealth` lists the healthy volumes too (with no
    /// entries); by default it lists only the abnormal ones, as the spec
    /// describes its answer.
    pub list_healthy: bool,
}

impl HealthForms {
    /// No health form (the driver's default).
    pub const NONE: HealthForms = HealthForms {
        legacy_list: false,
        legacy_get: false,
        list_health: false,
        get_health: false,
        list_healthy: false,
    };
    /// v1.12: VOLUME_CONDITION with LIST_VOLUMES and GET_VOLUME.
    pub const LEGACY: HealthForms = HealthForms { legacy_list: true, legacy_get: true, ..HealthForms::NONE };
    /// v1.13: LIST_VOLUME_HEALTH and GET_VOLUME_HEALTH.
    pub const V1_13: HealthForms = HealthForms { list_health: true, get_health: true, ..HealthForms::NONE };
    /// Both forms.
    pub const BOTH: HealthForms = HealthForms { list_health: true, get_health: true, ..HealthForms::LEGACY };

    /// Whether the v1.12 form is on (VOLUME_CONDITION is advertised).
    pub fn legacy(&self) -> bool {
        self.legacy_list || self.legacy_get
    }

    /// Adds the raw controller capabilities of these forms to `rpcs` (each once).
    pub fn add_capabilities(&self, rpcs: &mut Vec<i32>) {
        use csi::controller_service_capability::rpc::Type;
        let wanted = [
            (self.legacy(), LEGACY_VOLUME_CONDITION),
            (self.legacy_list, Type::ListVolumes as i32),
            (self.legacy_get, Type::GetVolume as i32),
            (self.list_health, Type::ListVolumeHealth as i32),
            (self.get_health, Type::GetVolumeHealth as i32),
        ];
        for (on, rpc) in wanted {
            if on && !rpcs.contains(&rpc) {
                rpcs.push(rpc);
            }
        }
    }
}

/// The v1.12 condition of a volume with these conditions (pure).
pub fn legacy_condition(conditions: &[HealthCondition]) -> LegacyCondition {
    LegacyCondition {
        abnormal: !conditions.is_empty(),
        message: conditions.first().map(|c| c.message.clone()).unwrap_or_default(),
    }
}

/// The v1.13 wire form of a volume's health (pure).
pub fn wire_health(volume_id: &str, conditions: &[HealthCondition]) -> csi::VolumeHealth {
    use csi::VolumeHealthErrorType as T;
    csi::VolumeHealth {
        volume_id: volume_id.to_string(),
        health_statuses: conditions
            .iter()
            .map(|c| csi::volume_health::VolumeHealthEntry {
                status: match c.status {
                    HealthStatus::Degraded => T::Degraded,
                    HealthStatus::Inaccessible => T::Inaccessible,
                    HealthStatus::DataLoss => T::DataLoss,
                    HealthStatus::Unknown => T::UnknownVolumeHealthType,
                } as i32,
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
    }
}

/// One page of `items` from `starting_token` (an index, `""`: 0) with at
/// most `max_entries` (0: all), and the next token (`""`: the last page).
pub fn page<T: Clone>(items: &[T], max_entries: i32, starting_token: &str) -> Result<(Vec<T>, String), Status> {
    let max = usize::try_from(max_entries).map_err(|_| Status::invalid_argument("max_entries is negative"))?;
    let start: usize = match starting_token {
        "" => 0,
        t => t.parse().ok().filter(|n| *n <= items.len()).ok_or_else(|| Status::aborted(format!("bad token {t:?}")))?,
    };
    let end = if max == 0 { items.len() } else { items.len().min(start + max) };
    let next = if end < items.len() { end.to_string() } else { String::new() };
    Ok((items[start..end].to_vec(), next))
}

impl Service {
    /// Every volume the health calls know: created, published or given a health.
    fn known_volumes(&self) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = self.volumes.lock().expect("volumes").values().cloned().collect();
        ids.extend(self.published.lock().expect("published").keys().cloned());
        ids.extend(self.health.lock().expect("health").keys().cloned());
        ids
    }

    fn conditions(&self, volume_id: &str) -> Vec<HealthCondition> {
        self.health.lock().expect("health").get(volume_id).cloned().unwrap_or_default()
    }

    /// `ListVolumes`: the published volumes (and with the legacy list form,
    /// every known volume with its condition).
    fn list_volumes(&self, req: csi::ListVolumesRequest) -> v112::ListVolumesResponse {
        self.counters.list_volumes.fetch_add(1, Ordering::SeqCst);
        let s = self.script();
        let published = self.published.lock().expect("published").clone();
        let ids: BTreeSet<String> =
            if s.health.legacy_list { self.known_volumes() } else { published.keys().cloned().collect() };
        let entries = ids
            .into_iter()
            .map(|id| {
                let volume_condition =
                    s.health.legacy_list.then(|| legacy_wire(legacy_condition(&self.conditions(&id))));
                v112::list_volumes_response::Entry {
                    status: Some(v112::VolumeStatus {
                        published_node_ids: published.get(&id).cloned().unwrap_or_default(),
                        volume_condition,
                    }),
                    volume: Some(csi::Volume { volume_id: id, ..Default::default() }),
                }
            })
            .collect();
        let next_token = if s.list_volumes_endless {
            let page: u64 = req.starting_token.strip_prefix("page-").and_then(|n| n.parse().ok()).unwrap_or(0);
            format!("page-{}", page + 1)
        } else {
            String::new()
        };
        v112::ListVolumesResponse { entries, next_token }
    }

    /// `ControllerGetVolume`, with the legacy get form only.
    fn get_volume(&self, req: csi::ControllerGetVolumeRequest) -> Result<v112::ControllerGetVolumeResponse, Status> {
        self.counters.controller_get_volumes.fetch_add(1, Ordering::SeqCst);
        if !self.script().health.legacy_get {
            return Err(Status::unimplemented("the fault driver does not advertise GET_VOLUME in this script"));
        }
        let id = req.volume_id;
        if !self.known_volumes().contains(&id) {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        }
        let published = self.published.lock().expect("published").get(&id).cloned().unwrap_or_default();
        Ok(v112::ControllerGetVolumeResponse {
            status: Some(v112::VolumeStatus {
                published_node_ids: published,
                volume_condition: Some(legacy_wire(legacy_condition(&self.conditions(&id)))),
            }),
            volume: Some(csi::Volume { volume_id: id, ..Default::default() }),
        })
    }

    /// `ControllerListVolumeHealth`, with the v1.13 list form only.
    pub(super) fn list_volume_health(
        &self,
        req: csi::ControllerListVolumeHealthRequest,
    ) -> Result<csi::ControllerListVolumeHealthResponse, Status> {
        self.counters.list_volume_healths.fetch_add(1, Ordering::SeqCst);
        let forms = self.script().health;
        if !forms.list_health {
            return Err(Status::unimplemented("the fault driver does not advertise LIST_VOLUME_HEALTH in this script"));
        }
        let all: Vec<csi::VolumeHealth> = self
            .known_volumes()
            .into_iter()
            .map(|id| wire_health(&id, &self.conditions(&id)))
            .filter(|h| forms.list_healthy || !h.health_statuses.is_empty())
            .collect();
        let (entries, next_token) = page(&all, req.max_entries, &req.starting_token)?;
        Ok(csi::ControllerListVolumeHealthResponse { entries, next_token })
    }

    /// `ControllerGetVolumeHealth`, with the v1.13 get form only.
    pub(super) fn get_volume_health(
        &self,
        req: csi::ControllerGetVolumeHealthRequest,
    ) -> Result<csi::ControllerGetVolumeHealthResponse, Status> {
        self.counters.get_volume_healths.fetch_add(1, Ordering::SeqCst);
        if !self.script().health.get_health {
            return Err(Status::unimplemented("the fault driver does not advertise GET_VOLUME_HEALTH in this script"));
        }
        if !self.known_volumes().contains(&req.volume_id) {
            return Err(Status::not_found(format!("volume {} does not exist", req.volume_id)));
        }
        let conditions = self.conditions(&req.volume_id);
        Ok(csi::ControllerGetVolumeHealthResponse { volume_health: Some(wire_health(&req.volume_id, &conditions)) })
    }
}

fn legacy_wire(c: LegacyCondition) -> v112::VolumeCondition {
    v112::VolumeCondition { abnormal: c.abnormal, message: c.message }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A unary handler of the driver for `tonic::server::Grpc`.
struct Unary<Req, Resp>(Service, fn(&Service, Req) -> Result<Resp, Status>);

impl<Req: Send + 'static, Resp: Send + 'static> tonic::server::UnaryService<Req> for Unary<Req, Resp> {
    type Response = Resp;
    type Future = BoxFuture<Result<Response<Resp>, Status>>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let result = (self.1)(&self.0, request.into_inner()).map(Response::new);
        Box::pin(async move { result })
    }
}

/// The Controller service: `ListVolumes` and `ControllerGetVolume` answered
/// with the `csi.v112` messages (the v1.12 condition), everything else by
/// the generated server.
#[derive(Clone)]
pub(super) struct ControllerWithLegacy {
    svc: Service,
    inner: ControllerServer<Service>,
}

impl ControllerWithLegacy {
    pub(super) fn new(svc: Service) -> ControllerWithLegacy {
        ControllerWithLegacy { inner: ControllerServer::new(svc.clone()), svc }
    }
}

impl NamedService for ControllerWithLegacy {
    const NAME: &'static str = <ControllerServer<Service> as NamedService>::NAME;
}

impl tower::Service<http::Request<Body>> for ControllerWithLegacy {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<http::Request<Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let svc = self.svc.clone();
        match req.uri().path() {
            p if p == method::LIST_VOLUMES => Box::pin(async move {
                tokio::time::sleep(svc.script().list_volumes_delay).await;
                let handler: Unary<csi::ListVolumesRequest, v112::ListVolumesResponse> =
                    Unary(svc, |s, r| Ok(s.list_volumes(r)));
                Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default()).unary(handler, req).await)
            }),
            p if p == method::CONTROLLER_GET_VOLUME => Box::pin(async move {
                let handler: Unary<csi::ControllerGetVolumeRequest, v112::ControllerGetVolumeResponse> =
                    Unary(svc, Service::get_volume);
                Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default()).unary(handler, req).await)
            }),
            _ => tower::Service::call(&mut self.inner, req),
        }
    }
}

impl FaultDriver {
    /// Sets a volume's conditions (empty: healthy). A volume given a health
    /// exists for the health calls even if it was never created.
    pub fn set_volume_health(&self, volume_id: &str, conditions: Vec<HealthCondition>) {
        self.health.lock().expect("health").insert(volume_id.to_string(), conditions);
    }

    /// Forgets what [`FaultDriver::set_volume_health`] set for a volume.
    pub fn clear_volume_health(&self, volume_id: &str) {
        self.health.lock().expect("health").remove(volume_id);
    }

    /// Changes which health forms the controller advertises.
    pub fn set_health_forms(&self, forms: HealthForms) {
        self.update(|s: &mut Script| s.health = forms);
    }
}

#[cfg(test)]
mod tests;
