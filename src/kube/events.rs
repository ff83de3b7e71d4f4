//! Kubernetes Events (`core/v1`, like upstream's client-go recorder, so the
//! upstream RBAC rule for `events` keeps working), with client-go's
//! aggregation (a repeat of the same object, reason and message within 10
//! minutes bumps `count` instead of creating a new Event) and its spam filter
//! (per object: a burst of 25, then one every 5 minutes).
//!
//! Memory is bounded: the spam filter and the aggregation table are LRU
//! tables of 4096 entries (client-go's size; an object evicted from the spam
//! filter starts with a fresh bucket), aggregation entries go once their
//! window is over, and one sender task per recorder writes the pending
//! events in order. A repeat of an event still pending merges into it (its
//! count grows), so the queue holds at most one entry per distinct pending
//! event and nothing admitted by the spam filter is dropped. The bookkeeping
//! ([`Book`]) is pure; the sender does the I/O around it.

use parking_lot::{Mutex, MutexGuard};
use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap, VecDeque},
    hash::Hash,
    sync::Arc,
    time::{Duration, Instant},
};

use ::kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
};
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::budget::TokenBucket;

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

const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
const SPAM_BURST: u32 = 25;
const SPAM_QPS: f64 = 1.0 / 300.0;
/// Entries of the spam filter and of the aggregation table (client-go's
/// LRU size for both).
const MAX_TRACKED: usize = 4096;
/// How long the sender keeps writing pending events after shutdown.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// A map of at most `cap` entries that forgets the least recently used.
struct Lru<K, V> {
    cap: usize,
    tick: u64,
    entries: HashMap<K, (V, u64)>,
    /// Keys by the tick of their last use, oldest first.
    order: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru { cap: cap.max(1), tick: 0, entries: HashMap::new(), order: BTreeMap::new() }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The value of `key`, which becomes the most recently used.
    fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Lru { tick, entries, order, .. } = self;
        let (value, used) = entries.get_mut(key)?;
        *tick += 1;
        if let Some(k) = order.remove(used) {
            order.insert(*tick, k);
        }
        *used = *tick;
        Some(value)
    }

    /// Inserts or replaces `key`, evicting the least recently used entry
    /// when full.
    fn insert(&mut self, key: K, value: V) -> &mut V {
        if let Some((_, used)) = self.entries.remove(&key) {
            self.order.remove(&used);
        } else if self.entries.len() >= self.cap
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        &mut self.entries.entry(key).insert_entry((value, self.tick)).into_mut().0
    }

    /// Drops entries from the least recently used on while `stale` says so.
    fn drop_oldest_while(&mut self, stale: impl Fn(&V) -> bool) {
        while let Some((_, key)) = self.order.first_key_value() {
            if !self.entries.get(key).is_some_and(|(v, _)| stale(v)) {
                break;
            }
            if let Some((_, key)) = self.order.pop_first() {
                self.entries.remove(&key);
            }
        }
    }
}

/// client-go's spam filter: one token bucket per object UID.
struct SpamFilter(Lru<String, TokenBucket>);

impl SpamFilter {
    fn new(cap: usize) -> Self {
        SpamFilter(Lru::new(cap))
    }

    /// Whether an event about `uid` may be written now.
    fn admit(&mut self, uid: &str, now: Instant) -> bool {
        let bucket = match self.0.get_mut(uid) {
            Some(b) => b,
            None => self.0.insert(uid.to_string(), TokenBucket::new(SPAM_QPS, SPAM_BURST)),
        };
        bucket.try_take(now).is_ok()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AggregateKey {
    uid: String,
    reason: String,
    message: String,
    kind: EventType,
}

/// An Event written, for aggregating its repeats.
struct Seen {
    event_name: String,
    namespace: String,
    count: i32,
    at: Instant,
}

/// What to write for an event.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    /// A new Event.
    Create,
    /// Raise the count of the Event written before to `count`.
    Patch { name: String, namespace: String, count: i32 },
}

/// client-go's aggregation: events written within the window, by key.
struct Aggregates(Lru<Arc<AggregateKey>, Seen>);

impl Aggregates {
    fn new(cap: usize) -> Self {
        Aggregates(Lru::new(cap))
    }

    /// What to write for `key`, which happened `count` more times at `now`.
    fn plan(&mut self, key: &AggregateKey, count: i32, now: Instant) -> Write {
        // The least recently used entry is the one seen longest ago.
        self.0.drop_oldest_while(|s| now.saturating_duration_since(s.at) >= AGGREGATE_WINDOW);
        match self.0.get_mut(key) {
            Some(s) => {
                s.count = s.count.saturating_add(count);
                s.at = now;
                Write::Patch { name: s.event_name.clone(), namespace: s.namespace.clone(), count: s.count }
            }
            None => Write::Create,
        }
    }

    /// The Event `name` was created for `key` with `count`.
    fn record(&mut self, key: Arc<AggregateKey>, name: String, namespace: String, count: i32, now: Instant) {
        self.0.insert(key, Seen { event_name: name, namespace, count, at: now });
    }
}

/// An event waiting for the sender, with its repeats merged.
struct PendingEvent {
    object: ObjectReference,
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// The sender's queue: one entry per distinct pending event, oldest first.
#[derive(Default)]
struct Pending {
    order: VecDeque<Arc<AggregateKey>>,
    events: HashMap<Arc<AggregateKey>, PendingEvent>,
}

impl Pending {
    fn push(&mut self, key: AggregateKey, object: ObjectReference, at: Timestamp) {
        if let Some(p) = self.events.get_mut(&key) {
            p.count = p.count.saturating_add(1);
            p.last = at;
            return;
        }
        let key = Arc::new(key);
        self.order.push_back(key.clone());
        self.events.insert(key, PendingEvent { object, count: 1, first: at, last: at });
    }

    fn pop(&mut self) -> Option<(Arc<AggregateKey>, PendingEvent)> {
        let key = self.order.pop_front()?;
        let event = self.events.remove(&key)?;
        Some((key, event))
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

/// The recorder's bookkeeping, free of I/O.
struct Book {
    spam: SpamFilter,
    pending: Pending,
    seen: Aggregates,
}

impl Book {
    fn new(cap: usize) -> Self {
        Book { spam: SpamFilter::new(cap), pending: Pending::default(), seen: Aggregates::new(cap) }
    }

    /// Queues an event unless the spam filter refuses it (`false`).
    fn offer(&mut self, object: ObjectReference, kind: EventType, reason: &str, message: &str, now: Instant) -> bool {
        let uid = object.uid.clone().unwrap_or_default();
        if !self.spam.admit(&uid, now) {
            return false;
        }
        let key = AggregateKey { uid, reason: reason.to_string(), message: message.to_string(), kind };
        self.pending.push(key, object, Timestamp::now());
        true
    }
}

struct Inner {
    client: Client,
    source: EventSource,
    book: Mutex<Book>,
    wake: Notify,
}

/// Publishes Events for one component. Cheap to clone; its sender task
/// stops at shutdown or when the last clone is dropped.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
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
    /// Events from `component` (upstream: `external-provisioner`, ...) on
    /// `host` (empty: none, as every upstream sidecar). `reportingComponent`
    /// and `reportingInstance` repeat them, as client-go's recorder does.
    /// Starts the sender task, which holds `shutdown`.
    pub fn new(client: Client, component: &str, host: &str, shutdown: &CancellationToken) -> Self {
        let inner = Arc::new(Inner {
            client,
            source: EventSource {
                component: Some(component.to_string()),
                host: Some(host.to_string()).filter(|h| !h.is_empty()),
            },
            book: Mutex::new(Book::new(MAX_TRACKED)),
            wake: Notify::new(),
        });
        let stop = shutdown.child_token();
        tokio::spawn(inner.clone().run(stop.clone()));
        Recorder { inner, _stop: Arc::new(stop.drop_guard()) }
    }

    /// Queues an event for the sender; write failures are logged, never fatal.
    /// A Warning published during a tracked sync is that object's last
    /// error for `/debug/objects` (the text the event carries).
    pub fn publish(&self, object: ObjectReference, kind: EventType, reason: &str, message: &str) {
        if kind == EventType::Warning {
            crate::debug::failed(message);
        }
        let name = object.name.clone();
        if self.inner.book().offer(object, kind, reason, message, Instant::now()) {
            self.inner.wake.notify_one();
        } else {
            tracing::debug!(reason, object = ?name, "Event dropped by the spam filter");
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
        let reason = key.reason.clone();
        if let Err(e) = self.write(key, event).await {
            tracing::warn!(reason, error = %e, "Cannot write event");
        }
    }

    async fn write(&self, key: Arc<AggregateKey>, event: PendingEvent) -> Result<(), ::kube::Error> {
        let plan = self.book().seen.plan(&key, event.count, Instant::now());
        if let Write::Patch { name, namespace, count } = plan {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(event.last)});
            if api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                return Ok(());
            }
            // The event expired or was deleted: write a new one.
        }
        let namespace = event.object.namespace.clone().unwrap_or_else(|| "default".to_string());
        let name =
            format!("{}.{:x}", event.object.name.as_deref().unwrap_or_default(), Timestamp::now().as_nanosecond());
        let count = event.count;
        let created = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            involved_object: event.object,
            reason: Some(key.reason.clone()),
            message: Some(key.message.clone()),
            type_: Some(key.kind.as_str().to_string()),
            source: Some(self.source.clone()),
            first_timestamp: Some(Time(event.first)),
            last_timestamp: Some(Time(event.last)),
            count: Some(count),
            event_time: None::<MicroTime>,
            reporting_component: self.source.component.clone(),
            reporting_instance: self.source.host.clone().or_else(|| Some(String::new())),
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

    fn object(i: usize) -> ObjectReference {
        ObjectReference {
            name: Some(format!("o{i}")),
            namespace: Some("ns".into()),
            uid: Some(format!("u{i}")),
            ..Default::default()
        }
    }

    fn key(uid: &str, message: &str) -> AggregateKey {
        AggregateKey { uid: uid.into(), reason: "R".into(), message: message.into(), kind: EventType::Normal }
    }

    #[test]
    fn an_lru_forgets_the_least_recently_used_entry() {
        let mut lru = Lru::new(2);
        lru.insert("a", 1);
        lru.insert("b", 2);
        assert_eq!(lru.get_mut("a"), Some(&mut 1));
        lru.insert("c", 3);
        assert_eq!((lru.len(), lru.get_mut("b")), (2, None), "b was the least recently used");
        assert!(lru.get_mut("a").is_some() && lru.get_mut("c").is_some());
        lru.drop_oldest_while(|v| *v == 1);
        assert_eq!((lru.len(), lru.get_mut("c")), (1, Some(&mut 3)));
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_then_one_every_5_minutes() {
        let mut spam = SpamFilter::new(MAX_TRACKED);
        let now = Instant::now();
        assert!((0..25).all(|_| spam.admit("u", now)));
        assert!(!spam.admit("u", now), "the 26th is refused");
        assert!(spam.admit("other", now), "buckets are per object");
        assert!(!spam.admit("u", now + Duration::from_secs(299)));
        assert!(spam.admit("u", now + Duration::from_secs(301)));
        assert!(!spam.admit("u", now + Duration::from_secs(302)));
    }

    #[test]
    fn the_spam_filter_tracks_at_most_4096_objects_and_an_evicted_one_starts_afresh() {
        let mut spam = SpamFilter::new(MAX_TRACKED);
        let now = Instant::now();
        while spam.admit("first", now) {}
        for i in 0..10_000 {
            assert!(spam.admit(&format!("u{i}"), now));
            assert!(spam.0.len() <= MAX_TRACKED);
        }
        assert_eq!(spam.0.len(), MAX_TRACKED);
        assert!(spam.admit("first", now), "evicted, so a fresh bucket");
    }

    #[test]
    fn aggregation_patches_repeats_within_the_window_and_creates_after_it() {
        let mut seen = Aggregates::new(MAX_TRACKED);
        let t0 = Instant::now();
        let k = key("u", "m");
        assert_eq!(seen.plan(&k, 1, t0), Write::Create);
        seen.record(Arc::new(k.clone()), "e1".into(), "ns".into(), 1, t0);
        let patch = |count| Write::Patch { name: "e1".into(), namespace: "ns".into(), count };
        assert_eq!(seen.plan(&k, 1, t0 + Duration::from_secs(1)), patch(2));
        assert_eq!(seen.plan(&k, 3, t0 + Duration::from_secs(599)), patch(5), "merged repeats add up");
        assert_eq!(seen.plan(&key("u", "other"), 1, t0), Write::Create, "another message is another event");
        // The window runs from the last repeat.
        assert_eq!(seen.plan(&k, 1, t0 + Duration::from_secs(1198)), patch(6));
        assert_eq!(seen.plan(&k, 1, t0 + Duration::from_secs(1798)), Write::Create);
        assert_eq!(seen.0.len(), 0, "the expired entry is gone");
    }

    #[test]
    fn the_aggregation_table_keeps_at_most_4096_events() {
        let mut seen = Aggregates::new(MAX_TRACKED);
        let now = Instant::now();
        for i in 0..10_000 {
            let k = key(&format!("u{i}"), "m");
            assert_eq!(seen.plan(&k, 1, now), Write::Create);
            seen.record(Arc::new(k), format!("e{i}"), "ns".into(), 1, now);
        }
        assert_eq!(seen.0.len(), MAX_TRACKED);
        assert!(matches!(seen.plan(&key("u9999", "m"), 1, now), Write::Patch { count: 2, .. }));
        assert_eq!(seen.plan(&key("u0", "m"), 1, now), Write::Create, "the oldest was evicted");
    }

    #[test]
    fn repeats_of_a_pending_event_merge_into_its_entry() {
        let mut book = Book::new(MAX_TRACKED);
        let now = Instant::now();
        for _ in 0..3 {
            assert!(book.offer(object(1), EventType::Warning, "R", "m", now));
        }
        assert!(book.offer(object(1), EventType::Warning, "R", "other", now));
        assert!(book.offer(object(2), EventType::Warning, "R", "m", now));
        assert_eq!(book.pending.len(), 3);
        let counts: Vec<(String, i32)> =
            std::iter::from_fn(|| book.pending.pop()).map(|(k, e)| (k.message.clone(), e.count)).collect();
        assert_eq!(counts, [("m".to_string(), 3), ("other".to_string(), 1), ("m".to_string(), 1)]);
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
            let svc = tower::service_fn(move |req: Request<::kube::client::Body>| {
                let api = api.clone();
                async move { api.answer(req).await }
            });
            Client::new(svc, "default")
        }

        async fn answer(
            &self,
            req: Request<::kube::client::Body>,
        ) -> Result<Response<::kube::client::Body>, ::kube::Error> {
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
            let body = serde_json::to_vec(&answer).map_err(::kube::Error::SerdeError)?;
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

    #[tokio::test]
    async fn publishing_10000_events_while_the_api_hangs_keeps_one_task_and_every_event() {
        let api = FakeApi::new(false);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(client, "c", "h", &shutdown);
        recorder.publish(object(0), EventType::Normal, "R", "m");
        until("the first write", || api.received.load(Ordering::SeqCst) == 1).await;

        for i in 1..=10_000 {
            recorder.publish(object(i), EventType::Normal, "R", "m");
        }
        tokio::task::yield_now().await;

        assert_eq!(alive_tasks(), baseline + 1, "one sender task");
        let book = recorder.inner.book();
        assert_eq!(book.pending.len(), 10_000, "every admitted event is pending (one is being written)");
        assert!(book.spam.0.len() <= MAX_TRACKED && book.seen.0.len() <= MAX_TRACKED);
        assert_eq!(api.received.load(Ordering::SeqCst), 1, "one write at a time");
    }

    #[tokio::test]
    async fn repeats_published_while_the_api_hangs_take_one_entry_per_distinct_event() {
        let api = FakeApi::new(false);
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(api.client(), "c", "h", &shutdown);
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
        assert_eq!(book.pending.events.values().map(|e| e.count).sum::<i32>(), 10_000);
    }

    #[tokio::test]
    async fn a_repeat_published_while_the_first_is_being_written_patches_its_count() {
        let api = FakeApi::new(false);
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(api.client(), "c", "h", &shutdown);
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
    async fn at_shutdown_pending_events_are_written_then_the_sender_stops() {
        let api = FakeApi::new(false);
        let client = api.client();
        let baseline = alive_tasks();
        let shutdown = CancellationToken::new();
        let recorder = Recorder::new(client, "c", "h", &shutdown);
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
        let recorder = Recorder::new(client, "c", "h", &shutdown);
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
        let recorder = Recorder::new(client, "c", "h", &shutdown);
        recorder.clone().publish(object(1), EventType::Normal, "R", "m");
        drop(recorder);
        until("the sender to stop", || alive_tasks() <= baseline).await;
        assert_eq!(api.requests().len(), 1, "the pending event was written first");
        assert!(!shutdown.is_cancelled(), "the process token is untouched");
    }
}
