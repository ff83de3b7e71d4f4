//! The node watcher on scripted watches of Nodes and Pods: what a Node
//! update costs, and when a NotReady node is reported.

use std::sync::{Arc, atomic::Ordering};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

use super::*;
use crate::{k8s::informers::Informers, modules::testing::failing_client};

const NODES: usize = 5_000;
const PODS_PER_NODE: usize = 10;
/// Long enough never to come during a test.
const INTERVAL: Duration = Duration::from_secs(3600);
/// When the Ready nodes became Ready.
const LONG_AGO: &str = "2020-01-01T00:00:00Z";

fn long_ago() -> Timestamp {
    LONG_AGO.parse().expect("time")
}

type Sender<K> = mpsc::UnboundedSender<Result<Event<K>, watcher::Error>>;

/// `K` watched from a channel instead of the apiserver.
fn scripted<K>(informers: &Informers) -> Sender<K>
where
    K: kube::Resource<DynamicType = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = Arc::new(parking_lot::Mutex::new(Some(rx)));
    informers.inject_source::<K>(Arc::new(move || match rx.lock().take() {
        Some(rx) => tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed(),
        None => futures::stream::pending().boxed(),
    }));
    tx
}

fn list<K>(tx: &Sender<K>, objects: impl IntoIterator<Item = K>) {
    let send = |e| tx.send(Ok(e)).expect("watch alive");
    send(Event::Init);
    objects.into_iter().for_each(|o| send(Event::InitApply(o)));
    send(Event::InitDone);
}

fn node(i: usize, status: &str, since: Timestamp, rv: usize) -> CachedNode {
    CachedNode {
        metadata: ObjectMeta {
            name: Some(format!("node-{i}")),
            resource_version: Some(rv.to_string()),
            ..Default::default()
        },
        ready: Some(NodeReady { status: status.into(), last_transition_time: Some(since.to_string()) }),
    }
}

fn pod(i: usize) -> CachedPod {
    CachedPod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{i}")),
            namespace: Some("ns".into()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        claims: vec![format!("data-{i}")].into_boxed_slice(),
        terminated: false,
        node_name: Some(format!("node-{}", i / PODS_PER_NODE).into()),
    }
}

/// A watcher running with `INTERVAL`, after its first look; every claim
/// is the driver's.
struct Running {
    watcher: Arc<NodeWatcher>,
    nodes: Sender<CachedNode>,
    token: CancellationToken,
}

impl Running {
    /// Over `count` Ready nodes (`changed` replacing some), each with
    /// `PODS_PER_NODE` pods.
    async fn start(count: usize, changed: Vec<CachedNode>) -> Running {
        let informers = Informers::new(failing_client());
        let (nodes, pods) = (scripted::<CachedNode>(&informers), scripted::<CachedPod>(&informers));
        let token = CancellationToken::new();
        let watcher = Arc::new(NodeWatcher::new(&informers, &token));
        informers.start(&token);
        list(&nodes, (0..count).map(|i| node(i, "True", long_ago(), 1)).chain(changed));
        list(&pods, (0..count * PODS_PER_NODE).map(pod));
        let (w, t) = (watcher.clone(), token.clone());
        tokio::spawn(async move {
            let events = Recorder::new(failing_client(), "test", "test", "", &t);
            let claim_of = |ns: &str, name: &str| {
                let mut c = CachedPvc::default();
                (c.metadata.namespace, c.metadata.name) = (Some(ns.into()), Some(name.into()));
                Some(Arc::new(c))
            };
            w.run(INTERVAL, &events, claim_of, t).await
        });
        let r = Running { watcher, nodes, token };
        r.until("the first look", || r.watcher.work.looks.load(Ordering::SeqCst) >= 1).await;
        r
    }

    fn failed(&self, name: &str) -> bool {
        self.watcher.failed.lock().contains_key(name)
    }

    fn pods_read(&self) -> usize {
        self.watcher.work.pods_read.load(Ordering::SeqCst)
    }

    fn update(&self, node: CachedNode) {
        self.nodes.send(Ok(Event::Apply(node))).expect("watch alive");
    }

    async fn until(&self, what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// With 5 000 nodes and 50 000 pods, a Node update reads the pods on that
/// node only, and a heartbeat (nothing the watcher decides on changed)
/// reads none: the work per update does not grow with the totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_update_reads_only_the_pods_on_that_node() {
    let r = Running::start(NODES, Vec::new()).await;
    let ten_minutes_ago = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(10);
    r.update(node(0, "False", ten_minutes_ago, 2));
    r.until("node-0 failed", || r.failed("node-0")).await;
    let before = r.pods_read();
    // Heartbeats: a new resourceVersion, the same Ready condition.
    const HEARTBEATS: usize = 20;
    for i in 1..=HEARTBEATS {
        r.update(node(i, "True", long_ago(), 2));
    }
    r.update(node(0, "True", Timestamp::now(), 3));
    r.until("node-0 recovered", || !r.failed("node-0")).await;
    let read = r.pods_read() - before;
    assert!(
        read <= 2 * PODS_PER_NODE,
        "{HEARTBEATS} heartbeats and one Ready change read {read} pods ({PODS_PER_NODE} on the changed node, {} in all)",
        NODES * PODS_PER_NODE
    );
}

/// A node NotReady, not yet for five minutes, is reported failed when its
/// five minutes end, with no other event and long before the next
/// `--node-list-add-interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_ready_node_is_reported_when_its_grace_ends() {
    let almost = Timestamp::now() - upstream::NODE_NOT_READY_GRACE + Duration::from_secs(3);
    let r = Running::start(10, vec![node(0, "False", almost, 1)]).await;
    assert!(!r.failed("node-0"), "within the grace");
    r.until("reported failed at the end of the grace", || r.failed("node-0")).await;
}
