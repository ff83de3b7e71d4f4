//! A sync that finds in the cache a copy of the claim its own controller's
//! writes replaced stops there, and the claim is synced again once the
//! cache holds the newer version, whatever that version changed.

use std::{
    collections::VecDeque,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::*;
use crate::{
    csi::proto::csi::v1::{
        self as csi,
        controller_server::{Controller, ControllerServer},
    },
    k8s::{cache::Writer, queue::Backoff},
    modules::testing::routing_client,
};

/// A driver that modifies every volume and expands it to the size asked.
#[derive(Clone, Default)]
struct Driver {
    expands: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        Ok(Response::new(csi::ControllerModifyVolumeResponse::default()))
    }

    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.expands.fetch_add(1, Ordering::SeqCst);
        let capacity_bytes = r.get_ref().capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        Ok(Response::new(csi::ControllerExpandVolumeResponse { capacity_bytes, node_expansion_required: true }))
    }
}

/// Serves `driver` on `path` until the returned token is cancelled.
fn serve(driver: &Driver, path: &std::path::Path) -> CancellationToken {
    let listener = tokio::net::UnixListener::bind(path).expect("bind");
    let stop = CancellationToken::new();
    let server = tonic::transport::Server::builder()
        .add_service(ControllerServer::new(driver.clone()))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned());
    tokio::spawn(server);
    stop
}

/// `claim()` at resourceVersion `rv` with `status` merged into its status.
fn claim_at(rv: &str, status: serde_json::Value) -> serde_json::Value {
    let mut c = claim();
    c["metadata"]["resourceVersion"] = rv.into();
    for (k, v) in status.as_object().expect("object") {
        c["status"][k] = v.clone();
    }
    c
}

fn cached(v: &serde_json::Value) -> CachedPvc {
    serde_json::from_value(v.clone()).expect("claim")
}

/// An apiserver answering the claim's status patches with `claims` in
/// turn (the last one again when they run out) and PV patches with `pv()`.
fn apiserver(claims: Vec<serde_json::Value>) -> Client {
    let claims = Mutex::new(VecDeque::from(claims));
    routing_client(move |_, path| {
        if !path.contains("/persistentvolumeclaims/") {
            return (200, pv());
        }
        let mut c = claims.lock();
        let answer = if c.len() > 1 { c.pop_front() } else { c.front().cloned() };
        (200, answer.expect("an answer"))
    })
}

async fn until(what: &str, deadline: Duration, f: impl Fn() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !f() {
        assert!(tokio::time::Instant::now() < end, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The user grows the claim and changes its class in one update (A). The
/// modify worker takes the claim first (the resize worker of the sibling
/// queue waits for it) and writes its status twice: InProgress (B), then
/// the new class (C). The resize worker wakes while the cache still holds
/// B, a copy the modify sync replaced, and stops; the C event changes
/// nothing the resize handler looks at. The resize still goes ahead
/// within the retry interval, not at the next resync.
#[tokio::test]
async fn a_resize_behind_a_modification_goes_ahead_after_the_stale_copy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let socket = tmp.path().join("csi.sock");
    let driver = Driver::default();
    let stop = serve(&driver, &socket);

    let a = claim();
    let b = claim_at(
        "6",
        serde_json::json!({"modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "gold"}}),
    );
    let c = claim_at("7", serde_json::json!({"currentVolumeAttributesClassName": "gold"}));
    let resizing = claim_at(
        "8",
        serde_json::json!({"currentVolumeAttributesClassName": "gold", "allocatedResources": {"storage": "2Gi"}}),
    );
    let vacs = cache_of(&[serde_json::json!({"metadata": {"name": "gold"}, "driverName": DRIVER})]);
    let csi = Connection::new(&format!("unix://{}", socket.display())).expect("address");
    let r = Arc::new(resizer_with(
        apiserver(vec![b.clone(), c.clone(), resizing]),
        csi,
        std::slice::from_ref(&a),
        &[pv()],
        Some(vacs),
    ));
    let recover = r.gates.recover;
    let mut watch = Writer::new(r.claims.clone());
    let mut deliver = |v: &serde_json::Value| {
        watch.apply(kube::runtime::watcher::Event::Apply(cached(v)), &|_| true);
    };
    let key = ClaimKey::namespaced("ns", "data");
    let resize = WorkQueue::new("test-pvc", Backoff { start: Duration::from_millis(10), max: Duration::from_secs(1) });
    let in_use = feed::InUseErrors::default();
    // The A event queued the claim; the modify worker has it first.
    resize.add(key.clone());
    assert_eq!(r.sync_modify(key.clone()).await, Ok(crate::modules::kit::Done::Finished), "modified");
    // The watch has brought B only when the resize worker wakes.
    deliver(&b);
    feed::resize_claim_changed(&Change::Updated { old: &cached(&a), new: &cached(&b) }, &resize, recover, &in_use);
    let syncs = Arc::new(AtomicUsize::new(0));
    let token = CancellationToken::new();
    let worker = {
        let (q, r, syncs, token) = (resize.clone(), r.clone(), syncs.clone(), token.clone());
        tokio::spawn(async move {
            q.run(1, token, move |key| {
                let (r, syncs) = (r.clone(), syncs.clone());
                async move {
                    let outcome = crate::modules::kit::apply(&r.sync(key).await);
                    syncs.fetch_add(1, Ordering::SeqCst);
                    outcome
                }
            })
            .await
        })
    };
    until("the resize worker never ran", Duration::from_secs(10), || syncs.load(Ordering::SeqCst) >= 1).await;
    assert_eq!(driver.expands.load(Ordering::SeqCst), 0, "B is stale: no call on it");
    // Then the watch brings C, which alone would not queue the claim.
    assert!(!decide::update_needs_sync(&cached(&b), &cached(&c), recover), "C changes nothing a resize looks at");
    deliver(&c);
    feed::resize_claim_changed(&Change::Updated { old: &cached(&b), new: &cached(&c) }, &resize, recover, &in_use);
    let retry = r.cfg.retry_interval_start;
    let dropped = format!("the resize was dropped on the stale copy: no ControllerExpandVolume within {:?}", retry * 5);
    until(&dropped, retry * 5, || driver.expands.load(Ordering::SeqCst) >= 1).await;
    token.cancel();
    worker.await.expect("worker");
    stop.cancel();
}

/// Both syncs stop on a copy their own controller's writes replaced and
/// leave the claim owed: synced again after `--retry-interval-start`.
#[tokio::test]
async fn both_syncs_leave_a_claim_whose_copy_is_stale_owed() {
    let r = resizer(crate::modules::testing::failing_client(), &[claim()], &[pv()], true);
    r.own_writes.wrote("ns/data", Some("5"), Some("6"));
    let owed = Err(Wait::on(crate::debug::WaitingFor::Retry).after(r.cfg.retry_interval_start));
    assert_eq!(r.sync(ClaimKey::namespaced("ns", "data")).await, owed, "the resize sync");
    assert_eq!(r.sync_modify(ClaimKey::namespaced("ns", "data")).await, owed, "the modify sync");
}
