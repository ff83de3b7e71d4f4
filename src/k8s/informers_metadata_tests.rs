//! The metadata-only informer asks the apiserver for metadata only: its
//! requests carry the `PartialObjectMetadata` Accept header, on the
//! streaming list and on the list fallback alike. Served to a real
//! `kube::Client` that records what it is asked.

use parking_lot::Mutex;
use std::{
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::http::{Request, Response};
use k8s_openapi::api::core::v1::Node;
use kube::Client;

use super::*;

/// (path and query, Accept header) of every request.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A client that records every request; a streaming list is refused (422,
/// as an apiserver without the feature), a list answered empty, a plain
/// watch left open without events.
fn recording_client(seen: Seen) -> Client {
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let seen = seen.clone();
        async move {
            let uri = req.uri().to_string();
            let accept = req.headers().get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
            seen.lock().push((uri.clone(), accept));
            let (code, body) = if uri.contains("sendInitialEvents=true") {
                let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Invalid", "code": 422, "message": "streaming lists are off"});
                (422, status.to_string())
            } else if uri.contains("watch=true") {
                (200, String::new())
            } else {
                let list = serde_json::json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": "1"}, "items": []});
                (200, list.to_string())
            };
            let resp = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body.into_bytes()))
                .unwrap();
            Ok::<_, Infallible>(resp)
        }
    });
    Client::new(svc, "default")
}

async fn wait_for(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_metadata_informer_asks_for_partial_object_metadata_only() {
    let seen: Seen = Arc::default();
    let informers = Informers::new(recording_client(seen.clone()));
    let _nodes = informers.metadata::<Node>();
    let stop = CancellationToken::new();
    informers.start(&stop);
    // The streaming list (refused) and the list it falls back to.
    let listed = || seen.lock().iter().any(|(u, _)| !u.contains("watch=true"));
    wait_for("the fallback list", Duration::from_secs(30), listed).await;
    stop.cancel();
    let seen = seen.lock().clone();
    assert!(seen.iter().any(|(u, _)| u.contains("sendInitialEvents=true")), "a streaming list first: {seen:#?}");
    for (uri, accept) in &seen {
        assert!(uri.starts_with("/api/v1/nodes"), "{uri}");
        let want = if uri.contains("watch=true") { "PartialObjectMetadata" } else { "PartialObjectMetadataList" };
        assert_eq!(
            accept.as_str(),
            format!("application/json;as={want};g=meta.k8s.io;v=v1"),
            "{uri} must ask for metadata only: {seen:#?}"
        );
    }
}
