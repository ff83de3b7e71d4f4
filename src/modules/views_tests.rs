//! The views' lookups: the same answers as a scan, at a cost that does not
//! grow with unrelated objects.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;

use super::*;
use crate::k8s::cache::Writer;

fn pod(ns: &str, name: &str, claims: &[&str]) -> CachedPod {
    CachedPod {
        metadata: ObjectMeta { namespace: Some(ns.into()), name: Some(name.into()), ..Default::default() },
        claims: claims.iter().map(|c| c.to_string()).collect(),
        terminated: false,
        node_name: None,
    }
}

/// The pods view over `pods`, counting how many objects its filter is
/// asked about.
fn view_of(pods: Vec<CachedPod>) -> (Cache<CachedPod>, Arc<AtomicUsize>, Writer<CachedPod>) {
    let informers = Informers::new(kube_client());
    let store = pods_using_claims(&informers).store();
    let mut w = Writer::new(store.clone());
    for p in pods {
        w.apply(Event::Apply(p), &|_| true);
    }
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let view = store.view(Arc::new(move |p: &CachedPod| {
        counter.fetch_add(1, Ordering::SeqCst);
        !p.claims.is_empty() && !p.terminated
    }));
    (view, asked, w)
}

/// A client that is never called (the view is filled by hand).
fn kube_client() -> kube::Client {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(Vec::new())))
    });
    kube::Client::new(svc, "default")
}

#[tokio::test]
async fn claim_in_use_answers_as_a_scan_and_looks_only_at_the_claims_pods() {
    let mut pods = vec![
        pod("a", "web-0", &["data-web-0", "shared"]),
        pod("a", "web-1", &["data-web-1", "shared"]),
        pod("b", "other", &["data-web-0"]),
    ];
    pods.extend((0..10_000).map(|i| pod("unrelated", &format!("p-{i}"), &[&format!("c-{i}")])));
    let (view, asked, mut w) = view_of(pods);
    let table: &[(Option<&str>, &str, bool)] = &[
        (Some("a"), "data-web-0", true),
        (Some("a"), "data-web-1", true),
        (Some("a"), "shared", true),
        (Some("b"), "data-web-0", true),
        (Some("b"), "data-web-1", false),
        (Some("a"), "nothing", false),
        (Some("c"), "shared", false),
        (None, "shared", false),
        (Some("unrelated"), "c-9999", true),
    ];
    for &(ns, name, want) in table {
        asked.store(0, Ordering::SeqCst);
        assert_eq!(claim_in_use(&view, ns, name), want, "{ns:?}/{name}");
        let n = asked.load(Ordering::SeqCst);
        assert!(n <= 2, "{ns:?}/{name}: the lookup looked at {n} pods (among 10 003), not only the claim's");
    }
    // The index follows the pods: one user of "shared" gone, then the other.
    w.apply(Event::Delete(pod("a", "web-0", &["data-web-0", "shared"])), &|_| true);
    assert!(!claim_in_use(&view, Some("a"), "data-web-0"));
    assert!(claim_in_use(&view, Some("a"), "shared"));
    w.apply(Event::Apply(pod("a", "web-1", &["data-web-1"])), &|_| true);
    assert!(!claim_in_use(&view, Some("a"), "shared"), "web-1 no longer uses it");
    assert!(claim_in_use(&view, Some("a"), "data-web-1"));
}
