//! The recorder's bookkeeping, free of I/O: client-go's spam filter and
//! aggregation, and the module's queue of pending events.
//!
//! Memory is bounded. The spam filter and the aggregation table are LRU
//! tables of [`MAX_TRACKED`] entries (client-go's size; an object evicted
//! from the spam filter starts with a fresh bucket), and aggregation entries
//! go once their window is over. The queue holds one entry per distinct
//! pending event (a repeat merges into it: its count grows), and at most
//! [`MAX_PENDING`] (client-go's broadcaster queues 1000 events). When it is
//! full, a new event merges into a pending event of the same source, object,
//! type and reason, which becomes client-go's combined event
//! (`(combined from similar events): <newest message>`, its place in the
//! queue the oldest one's); with none, the new event is dropped, as
//! client-go's broadcaster drops what arrives while its queue is full.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap, VecDeque},
    hash::Hash,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};

use super::EventType;
use crate::k8s::budget::TokenBucket;

const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
const SPAM_BURST: u32 = 25;
const SPAM_QPS: f64 = 1.0 / 300.0;
/// Entries of the spam filter and of the aggregation table (client-go's
/// LRU size for both).
pub(super) const MAX_TRACKED: usize = 4096;
/// Distinct events pending per module (client-go's broadcaster queues 1000).
pub(super) const MAX_PENDING: usize = 1000;
/// The message of a combined event: client-go's prefix, then the newest
/// message.
const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// A map of at most `cap` entries that forgets the least recently used.
pub(super) struct Lru<K, V> {
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
    pub(super) fn len(&self) -> usize {
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

/// client-go's spam filter: one token bucket per source and object UID.
pub(super) struct SpamFilter(pub(super) Lru<(Arc<str>, String), TokenBucket>);

impl SpamFilter {
    fn new(cap: usize) -> Self {
        SpamFilter(Lru::new(cap))
    }

    /// Whether an event of `component` about `uid` may be written now.
    pub(super) fn admit(&mut self, component: &Arc<str>, uid: &str, now: Instant) -> bool {
        let key = (component.clone(), uid.to_string());
        let bucket = match self.0.get_mut(&key) {
            Some(b) => b,
            None => self.0.insert(key, TokenBucket::new(SPAM_QPS, SPAM_BURST)),
        };
        bucket.try_take(now).is_ok()
    }
}

/// What an event is about: client-go's aggregation key without the message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Subject {
    pub(super) component: Arc<str>,
    pub(super) uid: String,
    pub(super) reason: String,
    pub(super) kind: EventType,
}

/// What an event says, for aggregating it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Message {
    /// Its own message.
    Text(String),
    /// The combined event of its subject (its text changes).
    Combined,
}

/// The key client-go aggregates repeats by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct AggregateKey {
    pub(super) subject: Subject,
    pub(super) message: Message,
}

/// An Event written, for aggregating its repeats.
pub(super) struct Seen {
    event_name: String,
    namespace: String,
    count: i32,
    at: Instant,
}

/// What to write for an event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// A new Event.
    Create,
    /// Raise the count of the Event written before to `count`.
    Patch { name: String, namespace: String, count: i32 },
}

/// client-go's aggregation: events written within the window, by key.
pub(super) struct Aggregates(pub(super) Lru<Arc<AggregateKey>, Seen>);

impl Aggregates {
    fn new(cap: usize) -> Self {
        Aggregates(Lru::new(cap))
    }

    /// What to write for `key`, which happened `count` more times at `now`.
    pub(super) fn plan(&mut self, key: &AggregateKey, count: i32, now: Instant) -> Write {
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
    pub(super) fn record(&mut self, key: Arc<AggregateKey>, name: String, namespace: String, count: i32, now: Instant) {
        self.0.insert(key, Seen { event_name: name, namespace, count, at: now });
    }
}

/// An event waiting for the sender, with its repeats merged.
pub(super) struct PendingEvent {
    pub(super) object: ObjectReference,
    /// The text to write.
    pub(super) message: String,
    pub(super) count: i32,
    pub(super) first: Timestamp,
    pub(super) last: Timestamp,
}

impl PendingEvent {
    fn repeat(&mut self, at: Timestamp) {
        self.count = self.count.saturating_add(1);
        self.last = at;
    }
}

/// What became of an event offered to the book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Offered {
    /// A new entry of the queue.
    Queued,
    /// Merged into a pending repeat of it.
    Merged,
    /// The queue was full: merged into its subject's combined event.
    Combined,
    /// Refused by the spam filter (as client-go's, uncounted).
    Spam,
    /// The queue was full and held nothing of its subject: dropped
    /// (`first`: the first since the queue last took an event).
    Dropped { first: bool },
}

/// The sender's queue: one entry per distinct pending event, oldest first,
/// at most `cap`.
pub(super) struct Pending {
    cap: usize,
    next: u64,
    /// The keys by arrival, oldest first.
    order: BTreeMap<u64, Arc<AggregateKey>>,
    /// The events and their arrival.
    events: HashMap<Arc<AggregateKey>, (u64, PendingEvent)>,
    /// The arrivals of each subject's pending events with their own
    /// message, oldest first (which a full queue combines).
    by_subject: HashMap<Subject, VecDeque<u64>>,
}

impl Pending {
    fn new(cap: usize) -> Self {
        Pending { cap: cap.max(1), next: 0, order: BTreeMap::new(), events: HashMap::new(), by_subject: HashMap::new() }
    }

    fn push(&mut self, key: AggregateKey, object: ObjectReference, at: Timestamp) -> Offered {
        if let Some((_, p)) = self.events.get_mut(&key) {
            p.repeat(at);
            return Offered::Merged;
        }
        let Message::Text(text) = &key.message else { return Offered::Dropped { first: false } };
        if self.order.len() < self.cap {
            let seq = self.next;
            self.next += 1;
            let message = text.clone();
            self.by_subject.entry(key.subject.clone()).or_default().push_back(seq);
            let key = Arc::new(key);
            self.order.insert(seq, key.clone());
            self.events.insert(key, (seq, PendingEvent { object, message, count: 1, first: at, last: at }));
            return Offered::Queued;
        }
        let combined = AggregateKey { subject: key.subject.clone(), message: Message::Combined };
        let message = format!("{COMBINED_PREFIX}{text}");
        if let Some((_, p)) = self.events.get_mut(&combined) {
            p.repeat(at);
            p.message = message;
            return Offered::Combined;
        }
        // The subject's oldest pending event becomes its combined event.
        let oldest = self.by_subject.get_mut(&key.subject).and_then(VecDeque::pop_front);
        let Some((seq, old)) = oldest.and_then(|seq| Some((seq, self.order.remove(&seq)?))) else {
            return Offered::Dropped { first: false };
        };
        self.forget_if_empty(&key.subject);
        let Some((_, mut p)) = self.events.remove(&old) else { return Offered::Dropped { first: false } };
        p.repeat(at);
        p.message = message;
        let combined = Arc::new(combined);
        self.order.insert(seq, combined.clone());
        self.events.insert(combined, (seq, p));
        Offered::Combined
    }

    fn forget_if_empty(&mut self, subject: &Subject) {
        if self.by_subject.get(subject).is_some_and(VecDeque::is_empty) {
            self.by_subject.remove(subject);
        }
    }

    /// The oldest pending event.
    pub(super) fn pop(&mut self) -> Option<(Arc<AggregateKey>, PendingEvent)> {
        let (seq, key) = self.order.pop_first()?;
        let (_, event) = self.events.remove(&key)?;
        if let Message::Text(_) = key.message
            && let Some(arrivals) = self.by_subject.get_mut(&key.subject)
        {
            // The oldest of its subject, as it is the oldest of all.
            arrivals.retain(|&s| s != seq);
            self.forget_if_empty(&key.subject);
        }
        Some((key, event))
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    #[cfg(test)]
    pub(super) fn counts(&self) -> i32 {
        self.events.values().map(|(_, e)| e.count).sum()
    }
}

/// The recorder's bookkeeping of one module.
pub(super) struct Book {
    pub(super) spam: SpamFilter,
    pub(super) pending: Pending,
    pub(super) seen: Aggregates,
    /// Whether the last event the queue could not take was dropped.
    dropping: bool,
}

impl Book {
    /// Tables of `tracked` entries, a queue of `pending`.
    pub(super) fn new(tracked: usize, pending: usize) -> Self {
        Book {
            spam: SpamFilter::new(tracked),
            pending: Pending::new(pending),
            seen: Aggregates::new(tracked),
            dropping: false,
        }
    }

    /// Queues an event of `component` unless the spam filter refuses it or
    /// the queue is full (see the module's doc).
    pub(super) fn offer(
        &mut self,
        component: &Arc<str>,
        object: ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
        now: Instant,
    ) -> Offered {
        let uid = object.uid.clone().unwrap_or_default();
        if !self.spam.admit(component, &uid, now) {
            return Offered::Spam;
        }
        let subject = Subject { component: component.clone(), uid, reason: reason.to_string(), kind };
        let key = AggregateKey { subject, message: Message::Text(message.to_string()) };
        match self.pending.push(key, object, Timestamp::now()) {
            Offered::Dropped { .. } => Offered::Dropped { first: !std::mem::replace(&mut self.dropping, true) },
            Offered::Queued => {
                self.dropping = false;
                Offered::Queued
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::events::tests::object;

    fn component() -> Arc<str> {
        Arc::from("c")
    }

    fn key(uid: &str, message: &str) -> AggregateKey {
        let subject = Subject { component: component(), uid: uid.into(), reason: "R".into(), kind: EventType::Normal };
        AggregateKey { subject, message: Message::Text(message.into()) }
    }

    /// The pending events, oldest first: (uid, message written, count).
    fn drain(book: &mut Book) -> Vec<(String, String, i32)> {
        std::iter::from_fn(|| book.pending.pop()).map(|(k, e)| (k.subject.uid.clone(), e.message, e.count)).collect()
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
        let c = component();
        let now = Instant::now();
        assert!((0..25).all(|_| spam.admit(&c, "u", now)));
        assert!(!spam.admit(&c, "u", now), "the 26th is refused");
        assert!(spam.admit(&c, "other", now), "buckets are per object");
        assert!(spam.admit(&Arc::from("another source"), "u", now), "and per source");
        assert!(!spam.admit(&c, "u", now + Duration::from_secs(299)));
        assert!(spam.admit(&c, "u", now + Duration::from_secs(301)));
        assert!(!spam.admit(&c, "u", now + Duration::from_secs(302)));
    }

    #[test]
    fn the_spam_filter_tracks_at_most_4096_objects_and_an_evicted_one_starts_afresh() {
        let mut spam = SpamFilter::new(MAX_TRACKED);
        let c = component();
        let now = Instant::now();
        while spam.admit(&c, "first", now) {}
        for i in 0..10_000 {
            assert!(spam.admit(&c, &format!("u{i}"), now));
            assert!(spam.0.len() <= MAX_TRACKED);
        }
        assert_eq!(spam.0.len(), MAX_TRACKED);
        assert!(spam.admit(&c, "first", now), "evicted, so a fresh bucket");
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
        let mut book = Book::new(MAX_TRACKED, MAX_PENDING);
        let (c, now) = (component(), Instant::now());
        for want in [Offered::Queued, Offered::Merged, Offered::Merged] {
            assert_eq!(book.offer(&c, object(1), EventType::Warning, "R", "m", now), want);
        }
        assert_eq!(book.offer(&c, object(1), EventType::Warning, "R", "other", now), Offered::Queued);
        assert_eq!(book.offer(&c, object(2), EventType::Warning, "R", "m", now), Offered::Queued);
        assert_eq!(book.pending.len(), 3);
        let text = |uid: &str, m: &str, n| (uid.to_string(), m.to_string(), n);
        assert_eq!(drain(&mut book), [text("u1", "m", 3), text("u1", "other", 1), text("u2", "m", 1)]);
    }

    /// A full queue: a new event merges into its subject's combined event
    /// (the subject's oldest pending one becomes it), else it is dropped.
    #[test]
    fn a_full_queue_combines_a_subjects_events_and_drops_what_it_cannot_combine() {
        let mut book = Book::new(MAX_TRACKED, 3);
        let (c, now) = (component(), Instant::now());
        let mut offer = |i, message: &str| book.offer(&c, object(i), EventType::Warning, "R", message, now);
        assert_eq!(offer(1, "attempt 1"), Offered::Queued);
        assert_eq!(offer(2, "attempt 1"), Offered::Queued);
        assert_eq!(offer(1, "attempt 2"), Offered::Queued);
        assert_eq!(offer(1, "attempt 1"), Offered::Merged, "a repeat still merges");
        assert_eq!(offer(3, "attempt 1"), Offered::Dropped { first: true }, "nothing of object 3 to combine");
        assert_eq!(offer(3, "attempt 2"), Offered::Dropped { first: false });
        assert_eq!(offer(1, "attempt 3"), Offered::Combined);
        assert_eq!(offer(1, "attempt 4"), Offered::Combined, "into the same combined event");
        assert_eq!(offer(2, "attempt 2"), Offered::Combined);
        assert_eq!(book.offer(&c, object(2), EventType::Warning, "other", "x", now), Offered::Dropped { first: false });
        assert_eq!(book.pending.len(), 3, "never more than the cap");
        let text = |uid: &str, m: &str, n| (uid.to_string(), m.to_string(), n);
        let combined = "(combined from similar events): ";
        assert_eq!(
            drain(&mut book),
            [
                text("u1", &format!("{combined}attempt 4"), 4),
                text("u2", &format!("{combined}attempt 2"), 2),
                text("u1", "attempt 2", 1),
            ],
            "the combined events take the place of their subject's oldest"
        );
        assert_eq!(book.offer(&c, object(3), EventType::Warning, "R", "m", now), Offered::Queued);
        assert_eq!(book.pending.by_subject.len(), 1, "the index holds pending events only");
    }

    #[test]
    fn a_combined_event_is_aggregated_by_its_subject_whatever_its_newest_message() {
        let mut book = Book::new(MAX_TRACKED, 1);
        let (c, now) = (component(), Instant::now());
        book.offer(&c, object(1), EventType::Warning, "R", "attempt 1", now);
        book.offer(&c, object(1), EventType::Warning, "R", "attempt 2", now);
        let (first, _) = book.pending.pop().expect("the combined event");
        assert_eq!(first.message, Message::Combined);
        book.seen.record(first, "e1".into(), "ns".into(), 2, now);
        book.offer(&c, object(1), EventType::Warning, "R", "attempt 3", now);
        book.offer(&c, object(1), EventType::Warning, "R", "attempt 4", now);
        let (again, event) = book.pending.pop().expect("the combined event");
        assert_eq!(event.message, "(combined from similar events): attempt 4");
        let patch = Write::Patch { name: "e1".into(), namespace: "ns".into(), count: 4 };
        assert_eq!(book.seen.plan(&again, event.count, now), patch);
    }

    /// Many objects, more than the spam filter tracks, each failing with
    /// per-attempt messages: the queue stays at its cap, and every event is
    /// pending, combined or counted as dropped.
    #[test]
    fn per_attempt_messages_of_many_objects_stay_within_the_cap() {
        let mut book = Book::new(MAX_TRACKED, MAX_PENDING);
        let (c, now) = (component(), Instant::now());
        let mut dropped = 0;
        for attempt in 0..5 {
            for i in 0..5_000 {
                let offered = book.offer(&c, object(i), EventType::Warning, "R", &format!("request {attempt}"), now);
                assert_ne!(offered, Offered::Spam, "within the burst");
                dropped += i32::from(matches!(offered, Offered::Dropped { .. }));
                assert!(book.pending.len() <= MAX_PENDING);
            }
        }
        assert_eq!(book.pending.len(), MAX_PENDING);
        assert_eq!(book.pending.counts() + dropped, 25_000);
        assert_eq!(dropped, 4_000 * 5, "the first 1000 objects' later attempts combined, the others' dropped");
    }
}
