//! What the modules' sync tests share: caches filled by hand, an apiserver
//! that fails every request, and a sync run the way a tracked queue runs
//! it, to see what it files in `/debug/objects`.

use std::time::Duration;

use kube::Client;

use crate::{
    debug::{Entry, Finish, Ledger},
    k8s::{cache::Cache, queue::Outcome},
};

/// An apiserver that answers every request with a 500.
pub fn failing_client() -> Client {
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "InternalError", "code": 500, "message": "down"});
    answering_client(500, status)
}

/// An apiserver that answers every request with `code` and `body`.
pub fn answering_client(code: u16, body: serde_json::Value) -> Client {
    routing_client(move |_, _| (code, body.clone()))
}

/// An apiserver that answers each request with the code and body `answer`
/// gives for its method and path.
pub fn routing_client<F>(answer: F) -> Client
where
    F: Fn(&http::Method, &str) -> (u16, serde_json::Value) + Send + Sync + 'static,
{
    let answer = std::sync::Arc::new(answer);
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (code, body) = answer(req.method(), req.uri().path());
        let body = body.to_string();
        async move {
            let resp = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body.into_bytes()))
                .expect("response");
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    Client::new(svc, "default")
}

/// A cache holding `objects` (JSON of kind `K`).
pub fn cache_of<K>(objects: &[serde_json::Value]) -> Cache<K>
where
    K: kube::Resource + serde::de::DeserializeOwned + Clone,
{
    let cache = Cache::<K>::default();
    let mut w = crate::k8s::cache::Writer::new(cache.clone());
    for o in objects {
        let o: K = serde_json::from_value(o.clone()).expect("object");
        w.apply(kube::runtime::watcher::Event::Apply(o), &|_| true);
    }
    cache
}

/// Runs `sync` of `key` (of `kind`) as a tracked queue does, then returns
/// its outcome and the entry the ledger keeps for it (`None`: none).
pub async fn filed<F: std::future::Future<Output = Outcome>>(
    ledger: &Ledger,
    kind: &'static str,
    key: &str,
    sync: F,
) -> (Outcome, Option<Entry>) {
    let scope = ledger.scope("test", kind, key.to_string());
    let outcome = scope.run(sync).await;
    let finish = match outcome {
        Outcome::Done => Finish::Done,
        _ => Finish::Again { delay: Duration::from_secs(1), attempts: 1 },
    };
    scope.finish(finish);
    let entry = ledger.entries().into_iter().find(|((k, n), _)| *k == kind && n == key).map(|(_, e)| e);
    (outcome, entry)
}

/// [`filed`] for a reconcile of the controller kit, settled by its error
/// policy.
pub async fn reconciled<F: std::future::Future<Output = crate::modules::kit::Reconciled>>(
    ledger: &Ledger,
    kind: &'static str,
    key: &str,
    sync: F,
) -> (Outcome, Option<Entry>) {
    let sync = Box::pin(sync);
    filed(ledger, kind, key, async { crate::modules::kit::apply(&sync.await) }).await
}
