//! The SnapshotMetadata service: each request checked in upstream's order
//! (`request.rs`), then the driver's stream passed on (`forward.rs`) under
//! `--max-streaming-duration-min`, and counted in the CSI call metrics
//! under upstream's operation names, with no per-snapshot label.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use tokio::{sync::OnceCell, time::Instant};
use tonic::{Code, Request, Response, Status, codegen::BoxStream};
use tracing::Instrument;

use super::{
    api,
    decide::{self, Asked, Refusal},
    forward,
    request::Checks,
};
use crate::{
    compat::snapshot_metadata as upstream,
    csi::{Connection, proto::csi::v1 as csi},
};

/// The service: answers Unavailable until the driver is validated and the
/// checks are ready.
#[derive(Clone)]
pub struct SnapshotMetadataService {
    /// Set once the driver is validated.
    pub checks: Arc<OnceCell<Checks>>,
    /// The one driver connection.
    pub csi: Connection,
    /// `--max-streaming-duration-min`.
    pub max_streaming: Duration,
}

fn status(r: Refusal) -> Status {
    Status::new(r.code, r.message)
}

/// What a call reads from the driver, once it is admitted: the target's
/// snapshot handle, a delta's base handle, the class's secret data.
struct Admitted {
    target: String,
    base: Option<String>,
    secrets: std::collections::HashMap<String, String>,
}

impl SnapshotMetadataService {
    /// Steps 1 to 6 for `asked`. The snapshots are resolved beside the
    /// TokenReview and the SubjectAccessReview (one round trip instead of
    /// three in a row); what they found is used only once the caller is
    /// authorized, and each refusal is the first in upstream's order.
    async fn admit(&self, asked: &Asked<'_>) -> Result<Admitted, Status> {
        decide::validate(asked).map_err(status)?;
        let checks = self.checks.get().ok_or_else(|| Status::unavailable(upstream::DRIVER_NOT_READY))?;
        let (token, namespace, target, base) = match *asked {
            Asked::Allocated { token, namespace, snapshot } => (token, namespace, snapshot, None),
            Asked::Delta { token, namespace, base_id, target } => (token, namespace, target, Some(base_id)),
        };
        let base = async {
            match base {
                Some(b) => checks.base_handle(namespace, b).await.map(Some),
                None => Ok(None),
            }
        };
        let (authorized, resolved, base) =
            tokio::join!(checks.authorize(token, namespace), checks.resolve(namespace, target), base);
        authorized.map_err(status)?;
        let resolved = resolved.map_err(status)?;
        let base = base.map_err(status)?;
        let secrets = checks.secrets(&resolved).await.map_err(status)?;
        Ok(Admitted { target: resolved.handle, base, secrets })
    }

    /// The counter of one stream of `operation`, from now.
    fn counter(&self, operation: &'static str) -> Counted {
        Counted { csi: self.csi.clone(), operation, started: Instant::now(), code: None }
    }
}

/// The outcome of one stream, counted when it ends (or when the client
/// goes away: Cancelled).
struct Counted {
    csi: Connection,
    operation: &'static str,
    started: Instant,
    code: Option<Code>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.csi.record_call(self.operation, self.code.unwrap_or(Code::Cancelled), self.started.elapsed());
    }
}

/// `stream`, counted under `operation` once it ends.
fn counted<T: Send + 'static>(
    stream: impl Stream<Item = Result<T, Status>> + Send + 'static,
    counter: Counted,
) -> BoxStream<T> {
    let stream = Box::pin(stream);
    Box::pin(futures::stream::unfold((stream, counter), |(mut stream, mut counter)| async move {
        match stream.next().await {
            Some(item) => {
                if let Err(e) = &item {
                    counter.code = Some(e.code());
                }
                Some((item, (stream, counter)))
            }
            None => {
                counter.code.get_or_insert(Code::Ok);
                None
            }
        }
    }))
}

#[tonic::async_trait]
impl api::snapshot_metadata_server::SnapshotMetadata for SnapshotMetadataService {
    async fn get_metadata_allocated(
        &self,
        req: Request<api::GetMetadataAllocatedRequest>,
    ) -> Result<Response<BoxStream<api::GetMetadataAllocatedResponse>>, Status> {
        let req = req.into_inner();
        let span = tracing::info_span!("allocated", key = %format!("{}/{}", req.namespace, req.snapshot_name));
        async {
            let asked = Asked::Allocated {
                token: &req.security_token,
                namespace: &req.namespace,
                snapshot: &req.snapshot_name,
            };
            let admitted = self.admit(&asked).await?;
            let call = csi::GetMetadataAllocatedRequest {
                snapshot_id: admitted.target,
                starting_offset: req.starting_offset,
                max_results: req.max_results,
                secrets: admitted.secrets,
            };
            let counter = self.counter(upstream::OPERATION_ALLOCATED);
            tracing::debug!("Streaming the driver's allocated blocks");
            let source =
                self.csi.get_metadata_allocated(self.max_streaming, call).await.map_err(forward::driver_error)?;
            Ok(Response::new(counted(forward::forward(source, forward::allocated), counter)))
        }
        .instrument(span)
        .await
    }

    async fn get_metadata_delta(
        &self,
        req: Request<api::GetMetadataDeltaRequest>,
    ) -> Result<Response<BoxStream<api::GetMetadataDeltaResponse>>, Status> {
        let req = req.into_inner();
        let span = tracing::info_span!("delta", key = %format!("{}/{}", req.namespace, req.target_snapshot_name));
        async {
            let asked = Asked::Delta {
                token: &req.security_token,
                namespace: &req.namespace,
                base_id: &req.base_snapshot_id,
                target: &req.target_snapshot_name,
            };
            let admitted = self.admit(&asked).await?;
            let call = csi::GetMetadataDeltaRequest {
                base_snapshot_id: admitted.base.unwrap_or_default(),
                target_snapshot_id: admitted.target,
                starting_offset: req.starting_offset,
                max_results: req.max_results,
                secrets: admitted.secrets,
            };
            let counter = self.counter(upstream::OPERATION_DELTA);
            tracing::debug!(base = %req.base_snapshot_id, "Streaming the driver's changed blocks");
            let source = self.csi.get_metadata_delta(self.max_streaming, call).await.map_err(forward::driver_error)?;
            Ok(Response::new(counted(forward::forward(source, forward::delta), counter)))
        }
        .instrument(span)
        .await
    }
}
