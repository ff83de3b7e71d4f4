//! An in-memory Lease API with the apiserver's optimistic concurrency (PUT
//! with a stale resourceVersion → 409, POST of an existing name → 409
//! AlreadyExists), served to a real `kube::Client`.

use parking_lot::Mutex;
use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::http::{Method, Request, Response};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    serde_json::{self, json},
};
use kube::{Client, api::ObjectMeta};

use crate::k8s::leader::{LeaderElectionConfig, LeaderElector, elector::wall_now};

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

#[derive(Default)]
pub(super) struct FakeApi {
    /// The one Lease, `ns/lease`.
    pub(super) lease: Mutex<Option<Lease>>,
    rv: AtomicU64,
    /// Every request fails with 500 (an unreachable apiserver).
    pub(super) down: AtomicBool,
    /// GET requests so far.
    pub(super) gets: AtomicU64,
    /// POST and PUT requests so far.
    pub(super) puts: AtomicU64,
}

fn status(code: u16, reason: &str) -> (u16, String) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
        "code": code, "message": reason});
    (code, body.to_string())
}

impl FakeApi {
    fn store(&self, mut lease: Lease) -> String {
        let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
        lease.metadata.resource_version = Some(rv.to_string());
        let text = serde_json::to_string(&lease).unwrap();
        *self.lease.lock() = Some(lease);
        text
    }

    fn handle(&self, method: &Method, path: &str, body: &[u8]) -> (u16, String) {
        if self.down.load(Ordering::SeqCst) {
            return status(500, "InternalError");
        }
        let counter = if *method == Method::GET { &self.gets } else { &self.puts };
        counter.fetch_add(1, Ordering::SeqCst);
        let current = self.lease.lock().clone();
        let named = path == format!("{PATH}/lease");
        match (method.as_str(), named, current) {
            ("GET", true, Some(l)) => (200, serde_json::to_string(&l).unwrap()),
            ("GET", true, None) | ("PUT", true, None) => status(404, "NotFound"),
            ("POST", false, Some(_)) if path == PATH => status(409, "AlreadyExists"),
            ("POST", false, None) if path == PATH => (201, self.store(serde_json::from_slice(body).unwrap())),
            ("PUT", true, Some(old)) => {
                let new: Lease = serde_json::from_slice(body).unwrap();
                if new.metadata.resource_version != old.metadata.resource_version {
                    return status(409, "Conflict");
                }
                (200, self.store(new))
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }

    pub(super) fn spec(&self) -> Option<LeaseSpec> {
        self.lease.lock().clone().and_then(|l| l.spec)
    }

    pub(super) fn holder(&self) -> Option<String> {
        self.spec().and_then(|s| s.holder_identity)
    }

    /// Another writer (not an elector of ours) sets the holder.
    pub(super) fn write_as(&self, holder: &str) {
        let mut lease = self.lease.lock().clone().unwrap_or_else(|| Lease {
            metadata: ObjectMeta { name: Some("lease".into()), namespace: Some("ns".into()), ..Default::default() },
            spec: None,
        });
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(wall_now())),
            ..lease.spec.unwrap_or_default()
        });
        self.store(lease);
    }
}

/// A client whose every request is answered by `api`.
fn client(api: Arc<FakeApi>) -> Client {
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let api = api.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let (code, text) = api.handle(&parts.method, parts.uri.path(), &bytes);
            let resp = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(text.into_bytes()))
                .unwrap();
            Ok::<_, Infallible>(resp)
        }
    });
    Client::new(svc, "ns")
}

/// The short timings of these tests: lease 2 s, renew deadline 1 s, retry
/// period 200 ms, one label.
pub(super) fn config(identity: &str) -> LeaderElectionConfig {
    let mut c = LeaderElectionConfig::new("lease", "ns", identity);
    c.lease_duration = Duration::from_secs(2);
    c.renew_deadline = Duration::from_secs(1);
    c.retry_period = Duration::from_millis(200);
    c.labels.insert("app".into(), "csi-sidecar".into());
    c
}

/// A candidate with [`config`] talking to `api`.
pub(super) fn elector(api: &Arc<FakeApi>, identity: &str) -> LeaderElector {
    elector_with(api, config(identity))
}

/// A candidate with `config` talking to `api`.
pub(super) fn elector_with(api: &Arc<FakeApi>, config: LeaderElectionConfig) -> LeaderElector {
    LeaderElector::new(client(api.clone()), config)
}

/// Polls `cond` every 20 ms until it holds (panics after `limit`); returns how long it took,
/// on tokio's clock (the tests run it paused: no bound depends on the machine's speed).
/// (src/ cannot use the integration crate's `wait_until`.)
pub(super) async fn wait_for(what: &str, limit: Duration, cond: impl Fn() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}
