//! The server's gRPC health service (`grpc.health.v1`): NOT_SERVING until
//! the driver is validated, SERVING after, NOT_SERVING again once shutdown
//! begins (upstream's order), for the server as a whole (`""`) and for the
//! SnapshotMetadata service by name; any other name is unknown.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::api::snapshot_metadata_server::SERVICE_NAME;

/// The protocol's types, client and server, generated from
/// `proto/grpc_health_v1.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("grpc.health.v1");
}

use proto::{
    HealthCheckRequest, HealthCheckResponse,
    health_check_response::ServingStatus,
    health_server::{Health, HealthServer},
};

/// Whether the server serves: set by the module, read by the health
/// service and the HTTP `/health` check.
#[derive(Clone, Debug)]
pub struct Serving(watch::Sender<bool>);

impl Default for Serving {
    fn default() -> Self {
        Serving(watch::channel(false).0)
    }
}

impl Serving {
    /// Serving from now on (`true`), or not.
    pub fn set(&self, serving: bool) {
        self.0.send_if_modified(|now| std::mem::replace(now, serving) != serving);
    }

    /// Whether it serves now.
    pub fn is_serving(&self) -> bool {
        *self.0.borrow()
    }

    /// The health service reading it.
    pub fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService { serving: self.0.subscribe() })
    }
}

/// The status of `service` while the server serves or not; `None` for a
/// name this server does not know.
pub fn status_of(service: &str, serving: bool) -> Option<ServingStatus> {
    let known = service.is_empty() || service == SERVICE_NAME;
    known.then_some(if serving { ServingStatus::Serving } else { ServingStatus::NotServing })
}

/// `grpc.health.v1.Health` over a [`Serving`].
#[derive(Debug)]
pub struct HealthService {
    serving: watch::Receiver<bool>,
}

/// A Watch call's statuses.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status as i32 }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        match status_of(&service, *self.serving.borrow()) {
            Some(status) => Ok(Response::new(response(status))),
            None => Err(Status::not_found(format!("unknown service {service:?}"))),
        }
    }

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<WatchStream>, Status> {
        let service = request.into_inner().service;
        let mut serving = self.serving.clone();
        serving.mark_changed();
        // The status now, then each change, until the server ends (the
        // sender dropped) or the client goes away (the stream dropped).
        let changes = futures::stream::unfold(serving, |mut serving| async move {
            serving.changed().await.ok()?;
            let now = *serving.borrow_and_update();
            Some((now, serving))
        });
        let statuses =
            changes.map(move |now| Ok(response(status_of(&service, now).unwrap_or(ServingStatus::ServiceUnknown))));
        Ok(Response::new(Box::pin(statuses)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(service: &str) -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest { service: service.into() })
    }

    #[test]
    fn the_server_and_its_api_have_a_status_and_other_names_none() {
        for (service, serving, want) in [
            ("", false, Some(ServingStatus::NotServing)),
            ("", true, Some(ServingStatus::Serving)),
            ("snapshotmetadata.SnapshotMetadata", true, Some(ServingStatus::Serving)),
            ("snapshotmetadata.SnapshotMetadata", false, Some(ServingStatus::NotServing)),
            ("csi.v1.Identity", true, None),
        ] {
            assert_eq!(status_of(service, serving), want, "{service:?} serving={serving}");
        }
    }

    #[tokio::test]
    async fn check_answers_the_status_now_and_watch_each_change_once() {
        let serving = Serving::default();
        let health = HealthService { serving: serving.0.subscribe() };
        let status = |r: Result<Response<HealthCheckResponse>, Status>| r.map(|r| r.into_inner().status).ok();
        assert_eq!(status(health.check(ask("")).await), Some(ServingStatus::NotServing as i32));
        let unknown = health.check(ask("nope")).await.map(|_| ()).map_err(|s| s.code());
        assert_eq!(unknown, Err(tonic::Code::NotFound));

        let mut watched = health.watch(ask(SERVICE_NAME)).await.expect("watch").into_inner();
        let mut other = health.watch(ask("nope")).await.expect("watch").into_inner();
        let next = async |s: &mut WatchStream| s.next().await.expect("an item").expect("ok").status;
        assert_eq!(next(&mut watched).await, ServingStatus::NotServing as i32, "the status now");
        assert_eq!(next(&mut other).await, ServingStatus::ServiceUnknown as i32);
        serving.set(true);
        serving.set(true);
        assert!(serving.is_serving());
        assert_eq!(status(health.check(ask("")).await), Some(ServingStatus::Serving as i32));
        assert_eq!(next(&mut watched).await, ServingStatus::Serving as i32);
        serving.set(false);
        assert_eq!(next(&mut watched).await, ServingStatus::NotServing as i32, "SERVING once, then the change");
        drop(serving);
        assert!(watched.next().await.is_none(), "the stream ends with the server");
    }
}
