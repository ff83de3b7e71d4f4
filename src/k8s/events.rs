//! Kubernetes Events (`core/v1`, like upstream's client-go recorder, so the
//! upstream RBAC rule for `events` keeps working), with client-go's
//! aggregation (a repeat of the same object, reason and message within 10
//! minutes bumps `count` instead of creating a new Event) and its spam filter
//! (per source and object: a burst of 25, then one every 5 minutes).
//!
//! Each module's events are its own: one queue per module (a module's
//! recorders share it: [`Recorder::for_component`]) and one sender task
//! that writes them in order, through the module's budgeted client. Memory
//! is bounded per module: LRU tables of 4096 entries, and at most 1000
//! distinct pending events; when the queue is full a new event is combined
//! with a pending one about the same object and reason, or dropped and
//! counted in `csi_sidecar_events_dropped_total` ([`book`], which is pure;
//! the sender does the I/O around it).

use parking_lot::{Mutex, MutexGuard};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

mod book;

use book::{AggregateKey, Book, MAX_PENDING, MAX_TRACKED, Offered, PendingEvent, Write};

/// The recorder's metric names (csi-sidecar's own: client-go counts no
/// dropped events) and their help texts.
pub mod names {
    /// Events dropped because the module's queue was full, per module.
    pub const DROPPED: &str = "csi_sidecar_events_dropped_total";
    /// Help of [`DROPPED`].
    pub const DROPPED_HELP: &str = "Events of the module not written because its queue of pending events was full.";
    /// The label.
    pub const LABEL_MODULE: &str = "module";
}

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// How long the sender keeps writing pending events after shutdown.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

struct Inner {
    client: Client,
    /// `source.host` of every event (none: empty).
    host: Option<String>,
    module: &'static str,
    book: Mutex<Book>,
    wake: Notify,
    /// Events dropped because the queue was full.
    dropped: metrics::Counter,
}

/// Publishes Events for one component of a module. Cheap to clone; its
/// sender task stops at shutdown or when the last clone (or recorder of
/// another component of the module) is dropped.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
    component: Arc<str>,
    _stop: Arc<DropGuard>,
}

/// A reference to `obj` for `involvedObject`.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

impl Recorder {
    /// Events of `module` (its label in the metrics) from `component`
    /// (upstream: `external-provisioner`, ...) on `host` (empty: none, as
    /// every upstream sidecar). `reportingComponent` and `reportingInstance`
    /// repeat them, as client-go's recorder does. Starts the sender task,
    /// which holds `shutdown`.
    pub fn new(
        client: Client,
        module: &'static str,
        component: &str,
        host: &str,
        shutdown: &CancellationToken,
    ) -> Self {
        Self::with_queue(client, module, component, host, shutdown, MAX_PENDING)
    }

    /// [`Recorder::new`] with a queue of `pending` distinct events.
    fn with_queue(
        client: Client,
        module: &'static str,
        component: &str,
        host: &str,
        shutdown: &CancellationToken,
        pending: usize,
    ) -> Self {
        metrics::describe_counter!(names::DROPPED, names::DROPPED_HELP);
        let dropped = metrics::counter!(names::DROPPED, names::LABEL_MODULE => module);
        // In the metrics from the start, at 0.
        dropped.increment(0);
        let inner = Arc::new(Inner {
            client,
            host: Some(host.to_string()).filter(|h| !h.is_empty()),
            module,
            book: Mutex::new(Book::new(MAX_TRACKED, pending)),
            wake: Notify::new(),
            dropped,
        });
        let stop = shutdown.child_token();
        tokio::spawn(inner.clone().run(stop.clone()));
        Recorder { inner, component: Arc::from(component), _stop: Arc::new(stop.drop_guard()) }
    }

    /// A recorder of the same module for another `component` (the
    /// provisioner's external-populator notice): the module's queue, its
    /// bound and its sender are shared.
    pub fn for_component(&self, component: &str) -> Self {
        Recorder { inner: self.inner.clone(), component: Arc::from(component), _stop: self._stop.clone() }
    }

    /// Queues an event for the sender; write failures are logged, never fatal.
    /// A Warning published during a tracked sync is that object's last
    /// error for `/debug/objects` (the text the event carries).
    pub fn publish(&self, object: ObjectReference, kind: EventType, reason: &str, message: &str) {
        if kind == EventType::Warning {
            crate::debug::failed(message);
        }
        let name = object.name.clone();
        let offered = self.inner.book().offer(&self.component, object, kind, reason, message, Instant::now());
        match offered {
            Offered::Queued => self.inner.wake.notify_one(),
            Offered::Merged | Offered::Combined => {}
            Offered::Spam => tracing::debug!(reason, object = ?name, "Event dropped by the spam filter"),
            Offered::Dropped { first } => {
                self.inner.dropped.increment(1);
                if first {
                    tracing::warn!(
                        module = self.inner.module,
                        reason,
                        object = ?name,
                        "Event queue full: dropping events (counted in {})",
                        names::DROPPED
                    );
                }
            }
        }
    }
}

impl Inner {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock()
    }

    fn next_pending(&self) -> Option<(Arc<AggregateKey>, PendingEvent)> {
        self.book().pending.pop()
    }

    async fn next(&self) -> (Arc<AggregateKey>, PendingEvent) {
        loop {
            if let Some(next) = self.next_pending() {
                return next;
            }
            self.wake.notified().await;
        }
    }

    /// Writes events one at a time until `stop`, then what is pending for
    /// at most [`FLUSH_GRACE`].
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let deadline = async {
            stop.cancelled().await;
            tokio::time::sleep(FLUSH_GRACE).await;
        };
        tokio::pin!(deadline);
        loop {
            let (key, event) = if stop.is_cancelled() {
                match self.next_pending() {
                    Some(next) => next,
                    None => return,
                }
            } else {
                tokio::select! {
                    _ = stop.cancelled() => continue,
                    next = self.next() => next,
                }
            };
            tokio::select! {
                _ = self.deliver(key, event) => {}
                _ = &mut deadline => {
                    let left = self.book().pending.len() + 1;
                    tracing::warn!(left, "Events not written before shutdown");
                    return;
                }
            }
        }
    }

    async fn deliver(&self, key: Arc<AggregateKey>, event: PendingEvent) {
        let reason = key.subject.reason.clone();
        if let Err(e) = self.write(key, event).await {
            tracing::warn!(reason, error = %e, "Cannot write event");
        }
    }

    async fn write(&self, key: Arc<AggregateKey>, event: PendingEvent) -> Result<(), kube::Error> {
        let plan = self.book().seen.plan(&key, event.count, Instant::now());
        if let Write::Patch { name, namespace, count } = plan {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch =
                serde_json::json!({"count": count, "lastTimestamp": Time(event.last), "message": event.message});
            if api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                return Ok(());
            }
            // The event expired or was deleted: write a new one.
        }
        let namespace = event.object.namespace.clone().unwrap_or_else(|| "default".to_string());
        let name =
            format!("{}.{:x}", event.object.name.as_deref().unwrap_or_default(), Timestamp::now().as_nanosecond());
        let count = event.count;
        let source = EventSource { component: Some(key.subject.component.to_string()), host: self.host.clone() };
        let created = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            involved_object: event.object,
            reason: Some(key.subject.reason.clone()),
            message: Some(event.message),
            type_: Some(key.subject.kind.as_str().to_string()),
            first_timestamp: Some(Time(event.first)),
            last_timestamp: Some(Time(event.last)),
            count: Some(count),
            event_time: None::<MicroTime>,
            reporting_component: source.component.clone(),
            reporting_instance: self.host.clone().or_else(|| Some(String::new())),
            source: Some(source),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &created).await?;
        self.book().seen.record(key, name, namespace, count, Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::{Request, Response};

    use super::*;

    /// Object `o{i}` of namespace `ns` (uid `u{i}`); `book`'s tests use it too.
    pub(super) fn object(i: usize) -> ObjectReference {
        ObjectReference {
            name: Some(format!("o{i}")),
            namespace: Some("ns".into()),
            uid: Some(format!("u{i}")),
            ..Default::default()
        }
    }

    /// A fake apiserver for Events: records each request, then answers once
    /// the gate gives it a permit (POST: the Event sent; PATCH: an Event).
    struct FakeApi {
        requests: Mutex<Vec<(String, String, serde_json::Value)>>,
        gate: tokio::sync::Semaphore,
        received: AtomicUsize,
    }

    impl FakeApi {
        fn new(open: bool) -> Arc<Self> {
            let permits = if open { tokio::sync::Semaphore::MAX_PERMITS } else { 0 };
            Arc::new(FakeApi {
                requests: Mutex::default(),
                gate: tokio::sync::Semaphore::new(permits),
                received: AtomicUsize::new(0),
            })
        }

        fn client(self: &Arc<Self>) -> Client {
            let api = self.clone();
            let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
                let api = api.clone();
                async move { api.answer(req).await }
            });
            Client::new(svc, "default")
        }

        async fn answer(&self, req: Request<kube::client::Body>) -> Result<Response<kube::client::Body>, kube::Error> {
            let (parts, body) = req.into_parts();
            let sent: serde_json::Value = serde_json::from_slice(&body.collect_bytes().await?).unwrap_or_default();
            let method = parts.method.to_string();
            self.requests.lock().push((method.clone(), parts.uri.path().to_string(), sent.clone()));
            self.received.fetch_add(1, Ordering::SeqCst);
            if let Ok(permit) = self.gate.acquire().await {
                permit.forget();
            }
            let (status, answer) = match method.as_str() {
                "POST" => (201, sent),
                _ => (200, serde_json::json!({"metadata": {}, "involvedObject": {}})),
            };
            let body = serde_json::to_vec(&answer).map_err(kube::Error::SerdeError)?;
            Ok(Response::builder().status(status).body(body.into()).expect("response"))
        }

        fn requests(&self) -> Vec<(String, String, serde_json::Value)> {
            self.requests.lock().clone()
        }
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current().metrics().num_alive_tasks()
    }

    /// The value of `family{module="<module>"}` in the process's metrics.
    fn dropped(module: &str) -> Option<f64> {
        let text = crate::metrics::Metrics::install().expect("metrics").render();
        let series = format!("{}{{{}=\"{module}\"}} ", names::DROPPED, names::LABEL_MODULE);
        text.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
    }

    #[tokio::test]
    async fn flooding_a_module_while_the_api_hangs_keeps_one_task_and_1000_events_and_counts_the_rest() {
        crate::metrics::Metrics::install().expect("metrics");
        let api = FakeApi::new(false);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let flooded = Recorder::new(client.clone(), "events-test-flooded", "c", "h", &shutdown);
        let calm = Recorder::new(client, "events-test-calm", "c", "h", &shutdown);
        flooded.publish(object(0), EventType::Normal, "R", "m");
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;

        // 10 000 objects, more than the spam filter tracks: each has a fresh burst.
        for i in 1..=10_000 {
            flooded.publish(object(i), EventType::Normal, "R", "m");
        }
        for i in 1..=2 {
            calm.publish(object(i), EventType::Normal, "R", "m");
        }
        until("the other module's first write", || api.received.load(Ordering::SeqCst) == 2).await;

        assert_eq!(alive_tasks(), baseline + 2, "one sender task per recorder");
        {
            let book = flooded.inner.book();
            assert_eq!(book.pending.len(), MAX_PENDING, "the module's queue is bounded (one is being written)");
            assert!(book.spam.0.len() <= MAX_TRACKED && book.seen.0.len() <= MAX_TRACKED);
        }
        assert_eq!(dropped("events-test-flooded"), Some((10_000 - MAX_PENDING) as f64), "the rest counted");
        assert_eq!(calm.inner.book().pending.len(), 1, "another module's queue is its own (one is being written)");
        assert_eq!(dropped("events-test-calm"), Some(0.0), "in the metrics from the start");
        assert_eq!(api.received.load(Ordering::SeqCst), 2, "one write at a time per recorder");
    }

    #[tokio::test]
    async fn repeats_published_while_the_api_hangs_take_one_entry_per_distinct_event() {
        let api = FakeApi::new(false);
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(api.client(), "events-test", "c", "h", &shutdown);
        recorder.publish(object(9999), EventType::Normal, "R", "first");
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;

        // 400 objects × 25 (the spam filter's burst) = 10 000 events.
        for _ in 0..25 {
            for i in 0..400 {
                recorder.publish(object(i), EventType::Warning, "R", "m");
            }
        }
        let book = recorder.inner.book();
        assert_eq!(book.pending.len(), 400);
        assert_eq!(book.pending.counts(), 10_000);
    }

    #[tokio::test]
    async fn a_repeat_published_while_the_first_is_being_written_patches_its_count() {
        let api = FakeApi::new(false);
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(api.client(), "events-test", "c", "h", &shutdown);
        recorder.publish(object(1), EventType::Warning, "R", "m");
        until("the create", || api.received.load(Ordering::SeqCst) == 1).await;
        recorder.publish(object(1), EventType::Warning, "R", "m");
        recorder.publish(object(1), EventType::Warning, "R", "m");
        api.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS - 1);
        until("the patch", || api.received.load(Ordering::SeqCst) == 2).await;
        // Something after it, to see that nothing else was written for the repeats.
        recorder.publish(object(2), EventType::Warning, "R", "m");
        until("the next create", || api.received.load(Ordering::SeqCst) == 3).await;

        let requests = api.requests();
        let methods: Vec<&str> = requests.iter().map(|(m, _, _)| m.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "POST"]);
        let created = &requests[0].2;
        assert_eq!((created["count"].as_i64(), created["type"].as_str()), (Some(1), Some("Warning")));
        assert_eq!(created["involvedObject"]["uid"], "u1");
        let name = created["metadata"]["name"].as_str().expect("name");
        assert_eq!(requests[1].1, format!("/api/v1/namespaces/ns/events/{name}"));
        assert_eq!(requests[1].2["count"], 3);
    }

    #[tokio::test]
    async fn a_full_queue_writes_the_combined_event_in_the_place_of_the_oldest() {
        let api = FakeApi::new(false);
        let shutdown = CancellationToken::new();
        let recorder = Recorder::with_queue(api.client(), "events-test", "c", "h", &shutdown, 2);
        recorder.publish(object(0), EventType::Warning, "R", "first");
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;
        recorder.publish(object(1), EventType::Warning, "R", "request 1");
        recorder.publish(object(2), EventType::Warning, "R", "m");
        recorder.publish(object(1), EventType::Warning, "R", "request 2");
        api.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS - 1);
        until("every write", || api.received.load(Ordering::SeqCst) == 3).await;
        let written: Vec<(String, String, i64)> = api
            .requests()
            .iter()
            .map(|(_, _, e)| {
                let text = |f: &str| e[f].as_str().unwrap_or_default().to_string();
                (
                    e["involvedObject"]["uid"].as_str().unwrap_or_default().to_string(),
                    text("message"),
                    e["count"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            written,
            [
                ("u0".to_string(), "first".to_string(), 1),
                ("u1".to_string(), "(combined from similar events): request 2".to_string(), 2),
                ("u2".to_string(), "m".to_string(), 1),
            ]
        );
    }

    #[tokio::test]
    async fn a_modules_components_share_its_queue_and_sender_and_keep_their_source() {
        let api = FakeApi::new(true);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let library = Recorder::new(client, "events-test", "library", "", &shutdown);
        let own = library.for_component("own");
        assert_eq!(alive_tasks(), baseline + 1, "one sender");
        own.publish(object(1), EventType::Normal, "R", "m");
        library.publish(object(1), EventType::Normal, "R", "m");
        until("both writes", || api.received.load(Ordering::SeqCst) == 2).await;
        let requests = api.requests();
        let sources: Vec<(&str, &str)> = requests
            .iter()
            .map(|(_, _, e)| {
                (
                    e["source"]["component"].as_str().unwrap_or_default(),
                    e["reportingComponent"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(sources, [("own", "own"), ("library", "library")], "each its own Event, not a repeat");
        drop(library);
        assert_eq!(alive_tasks(), baseline + 1, "the other component's recorder keeps the sender");
        drop(own);
        until("the sender to stop", || alive_tasks() <= baseline).await;
    }

    #[tokio::test]
    async fn at_shutdown_pending_events_are_written_then_the_sender_stops() {
        let api = FakeApi::new(false);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(client, "events-test", "c", "h", &shutdown);
        for i in 0..3 {
            recorder.publish(object(i), EventType::Normal, "R", "m");
        }
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;
        shutdown.cancel();
        api.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS - 1);
        until("the sender to stop", || alive_tasks() <= baseline).await;
        assert_eq!(api.requests().iter().filter(|(m, _, _)| m == "POST").count(), 3);
    }

    #[tokio::test]
    async fn at_shutdown_a_hanging_api_is_given_up_after_the_grace() {
        let api = FakeApi::new(false);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(client, "events-test", "c", "h", &shutdown);
        recorder.publish(object(1), EventType::Normal, "R", "m");
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;
        let cancelled = Instant::now();
        shutdown.cancel();
        until("the sender to stop", || alive_tasks() <= baseline).await;
        assert!(cancelled.elapsed() >= FLUSH_GRACE);
    }

    #[tokio::test]
    async fn dropping_the_last_recorder_stops_its_sender() {
        let api = FakeApi::new(true);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(client, "events-test", "c", "h", &shutdown);
        recorder.clone().publish(object(1), EventType::Normal, "R", "m");
        drop(recorder);
        until("the sender to stop", || alive_tasks() <= baseline).await;
        assert_eq!(api.requests().len(), 1, "the pending event was written first");
        assert!(!shutdown.is_cancelled(), "the process token is untouched");
    }
}
