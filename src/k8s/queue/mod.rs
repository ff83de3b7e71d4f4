//! A work queue with client-go's semantics and upstream's metric names:
//!
//! - a key is queued at most once; a key added while it is being processed is
//!   processed again afterwards (never by two workers at once);
//! - at most one pending delay per key, the earliest requested;
//! - per-key exponential backoff between `--retry-interval-start` and
//!   `--retry-interval-max`, reset when the key succeeds;
//! - sibling queues ([`WorkQueue::sibling`]) have their own keys, workers and
//!   metrics but share per-key exclusion: across the group a key is handled
//!   by one worker at a time (attach and detach of one VolumeAttachment);
//! - `workqueue_*{name}` metrics, plus the age of the oldest queued key
//!   (`csi_sidecar_workqueue_oldest_item_age_seconds`), the backlog signal
//!   upstream lacks (external-attacher#706).

#[cfg(test)]
mod model;
mod state;
#[cfg(test)]
mod tests;

use parking_lot::{Mutex, MutexGuard};
use std::{fmt::Debug, future::Future, hash::Hash, sync::Arc, time::Duration};

use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use self::state::{Added, Group, QueueId, Scheduled};
use crate::compat::workqueue as names;

/// Per-key exponential backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// First delay (`--retry-interval-start`).
    pub start: Duration,
    /// Cap (`--retry-interval-max`).
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 = first failure).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(40);
        self.start.checked_mul(1u32 << exp.min(31)).unwrap_or(self.max).min(self.max)
    }
}

/// What a worker did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: the key's backoff is reset.
    Done,
    /// Failed: retried after the key's next backoff delay.
    Retry,
    /// Retry after exactly this delay (the backoff is kept).
    RetryAfter(Duration),
}

/// How a queue's tasks are woken, and what its workers hold.
#[derive(Default)]
struct Signals {
    /// A key became ready.
    ready: Notify,
    /// A pending key's due time moved forward.
    timer: Notify,
    /// When each key now in a worker's hands was taken, by ticket.
    in_flight: Mutex<InFlight>,
}

/// Start times of the work in progress.
#[derive(Default)]
struct InFlight {
    next: u64,
    started: std::collections::BTreeMap<u64, Instant>,
}

/// (unfinished work, longest running) in seconds for work started at
/// `started`, at `now` (client-go's two gauges).
fn unfinished_work(started: impl IntoIterator<Item = Instant>, now: Instant) -> (f64, f64) {
    started
        .into_iter()
        .map(|t| now.saturating_duration_since(t).as_secs_f64())
        .fold((0.0, 0.0), |(sum, max), s| (sum + s, if s > max { s } else { max }))
}

/// A group of sibling queues: their state and their wake-ups, by `QueueId`.
struct Hub<K> {
    group: Group<K>,
    signals: Vec<Arc<Signals>>,
}

/// Where a tracked queue files its syncs' outcomes (see [`crate::debug`]).
struct Tracker<K> {
    ledger: crate::debug::Ledger,
    kind: &'static str,
    /// The text a key is filed under (its `Display` form).
    text: fn(&K) -> String,
}

/// A deduplicating, rate-limited work queue. Cheap to clone.
pub struct WorkQueue<K> {
    hub: Arc<Mutex<Hub<K>>>,
    id: QueueId,
    name: &'static str,
    signals: Arc<Signals>,
    tracker: Option<Arc<Tracker<K>>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            hub: self.hub.clone(),
            id: self.id,
            name: self.name,
            signals: self.signals.clone(),
            tracker: self.tracker.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> WorkQueue<K> {
    /// A queue named `name` in metrics.
    pub fn new(name: &'static str, backoff: Backoff) -> Self {
        let hub = Hub { group: Group::new(), signals: Vec::new() };
        Self::join(Arc::new(Mutex::new(hub)), name, backoff)
    }

    /// A new queue with its own keys, delays, backoff counters, workers and
    /// metric name, sharing per-key exclusion with `self` (and all of self's
    /// siblings): across the group at most one worker handles a given key at
    /// any time. A key taken while a sibling handles it waits, and is handed
    /// to this queue's workers as soon as the sibling's worker calls done.
    pub fn sibling(&self, name: &'static str) -> WorkQueue<K> {
        let backoff = self.lock().group.backoff(self.id);
        Self::join(self.hub.clone(), name, backoff)
    }

    fn join(hub: Arc<Mutex<Hub<K>>>, name: &'static str, backoff: Backoff) -> Self {
        let signals = Arc::new(Signals::default());
        let id = {
            let mut h = hub.lock();
            h.signals.push(signals.clone());
            h.group.new_queue(backoff)
        };
        WorkQueue { hub, id, name, signals, tracker: None }
    }

    /// This queue, filing each sync of its keys (objects of API kind
    /// `kind`, under their `Display` text) in `ledger`: what the object
    /// waits for, its attempts, last error and next retry, until a sync
    /// finishes it. Call before cloning the queue into its handlers and
    /// workers.
    pub fn tracked(mut self, ledger: &crate::debug::Ledger, kind: &'static str) -> Self
    where
        K: std::fmt::Display,
    {
        self.tracker = Some(Arc::new(Tracker { ledger: ledger.clone(), kind, text: |k| k.to_string() }));
        self
    }

    /// How long until `key` is due in this queue (zero when queued now or
    /// not pending).
    fn due_in(&self, key: &K) -> Duration {
        let now = Instant::now();
        self.lock()
            .group
            .pending_due(self.id, key)
            .into_iter()
            .min()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    fn lock(&self) -> MutexGuard<'_, Hub<K>> {
        self.hub.lock()
    }

    /// Queues `key` now (no-op if it is already waiting).
    pub fn add(&self, key: K) {
        let mut h = self.lock();
        let added = h.group.add(self.id, key, Instant::now());
        self.after_adds(h, &[added]);
    }

    /// Counts, publishes and wakes for keys just added to this queue.
    fn after_adds(&self, h: MutexGuard<'_, Hub<K>>, added: &[Added]) {
        let counted = added.iter().filter(|a| a.counts()).count();
        if counted == 0 {
            return;
        }
        metrics::counter!(names::ADDS, "name" => self.name).increment(counted as u64);
        self.publish_depth(&h);
        drop(h);
        for _ in added.iter().filter(|&&a| a == Added::Ready) {
            self.signals.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`; a key already due earlier keeps its time,
    /// a key due later is moved forward.
    pub fn add_after(&self, key: K, delay: Duration) {
        let mut h = self.lock();
        let scheduled = h.group.add_after(self.id, key, Instant::now(), delay);
        self.after_schedule(h, scheduled);
    }

    fn after_schedule(&self, h: MutexGuard<'_, Hub<K>>, scheduled: Scheduled) {
        match scheduled {
            Scheduled::Now(added) => self.after_adds(h, &[added]),
            Scheduled::Later { earlier } => {
                drop(h);
                if earlier {
                    self.signals.timer.notify_one();
                }
            }
        }
    }

    /// Queues `key` after its next backoff delay.
    pub fn add_rate_limited(&self, key: K) {
        metrics::counter!(names::RETRIES, "name" => self.name).increment(1);
        let mut h = self.lock();
        let scheduled = h.group.add_rate_limited(self.id, key, Instant::now());
        self.after_schedule(h, scheduled);
    }

    /// Resets `key`'s backoff.
    pub fn forget(&self, key: &K) {
        self.lock().group.forget(self.id, key);
    }

    /// This queue is done with `key` (its object is gone, or another
    /// queue took it over): a tracked queue drops the ledger entry it filed
    /// (one a sync left waiting for an event that will now never come).
    /// Other queues' entries of the key stay. A sync running meanwhile may
    /// file it again; its next sync, finding the object gone, removes it.
    pub fn untrack(&self, key: &K) {
        if let Some(t) = &self.tracker {
            t.ledger.remove_in(&(t.kind, (t.text)(key)), self.name);
        }
    }

    /// The queue's name (upstream's, in the workqueue metrics).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().group.failures(self.id, key)
    }

    /// Keys waiting (not counting delayed or in-progress ones; counting those
    /// that wait for a sibling to finish them).
    pub fn len(&self) -> usize {
        self.lock().group.len(self.id)
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn publish_depth(&self, h: &Hub<K>) {
        metrics::gauge!(names::DEPTH, "name" => self.name).set(h.group.len(self.id) as f64);
        let oldest = h.group.oldest(self.id).map_or(0.0, |t| t.elapsed().as_secs_f64());
        metrics::gauge!(names::OLDEST_ITEM_AGE, "name" => self.name).set(oldest);
    }

    fn publish_unfinished(&self) {
        let (sum, longest) = unfinished_work(self.signals.in_flight.lock().started.values().copied(), Instant::now());
        metrics::gauge!(names::UNFINISHED_WORK, "name" => self.name).set(sum);
        metrics::gauge!(names::LONGEST_RUNNING, "name" => self.name).set(longest);
    }

    fn begin_work(&self) -> u64 {
        let mut f = self.signals.in_flight.lock();
        let ticket = f.next;
        f.next += 1;
        f.started.insert(ticket, Instant::now());
        ticket
    }

    fn end_work(&self, ticket: u64) {
        let idle = {
            let mut f = self.signals.in_flight.lock();
            f.started.remove(&ticket);
            f.started.is_empty()
        };
        if idle {
            self.publish_unfinished();
        }
    }

    fn try_take(&self) -> Option<K> {
        let mut h = self.lock();
        let (key, added) = h.group.take(self.id, Instant::now())?;
        metrics::histogram!(names::QUEUE_DURATION, "name" => self.name).record(added.elapsed().as_secs_f64());
        self.publish_depth(&h);
        Some(key)
    }

    /// Due times of `key`'s pending delays.
    #[cfg(test)]
    fn pending_dues(&self, key: &K) -> Vec<Instant> {
        self.lock().group.pending_due(self.id, key).into_iter().collect()
    }

    /// Waits for a key; `None` on shutdown. The caller must call `done`.
    pub async fn get(&self, shutdown: &CancellationToken) -> Option<K> {
        loop {
            let notified = self.signals.ready.notified();
            if let Some(k) = self.try_take() {
                return Some(k);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = notified => {}
            }
        }
    }

    /// Marks `key` processed; a key re-added meanwhile is queued again, and a
    /// sibling waiting for it gets it. A no-op for a key this queue does not
    /// handle.
    pub fn done(&self, key: &K) {
        let mut h = self.lock();
        let woken = h.group.done(self.id, key);
        if woken.contains(&self.id) {
            self.publish_depth(&h);
        }
        let signals: Vec<Arc<Signals>> = woken.iter().filter_map(|&id| h.signals.get(id).cloned()).collect();
        drop(h);
        for s in signals {
            s.ready.notify_one();
        }
    }

    /// Moves due delayed keys into the queue; returns when the next one is due.
    fn promote_due(&self) -> Option<Instant> {
        let mut h = self.lock();
        let (added, next) = h.group.promote_due(self.id, Instant::now());
        self.after_adds(h, &added);
        next
    }

    async fn run_timer(&self, shutdown: CancellationToken) {
        loop {
            let notified = self.signals.timer.notified();
            let next = self.promote_due();
            // Wake at least every second to keep the oldest-item gauge moving.
            let tick = Instant::now() + Duration::from_secs(1);
            let wake = next.map_or(tick, |t| t.min(tick));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
            let h = self.lock();
            self.publish_depth(&h);
            drop(h);
            self.publish_unfinished();
        }
    }

    /// Runs `workers` workers calling `handle` for each key until shutdown.
    /// A worker finishes the key in hand before it stops.
    pub async fn run<F, Fut>(&self, workers: usize, shutdown: CancellationToken, handle: F)
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send,
    {
        let handle = Arc::new(handle);
        if let Some(t) = &self.tracker {
            t.ledger.set_phase(crate::debug::Phase::Running);
        }
        let mut tasks = tokio::task::JoinSet::new();
        {
            let (q, shutdown) = (self.clone(), shutdown.clone());
            tasks.spawn(async move { q.run_timer(shutdown).await });
        }
        for _ in 0..workers.max(1) {
            let (q, shutdown, handle) = (self.clone(), shutdown.clone(), handle.clone());
            tasks.spawn(async move { q.work(&shutdown, handle.as_ref()).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// One worker: takes keys until shutdown.
    async fn work<F, Fut>(&self, shutdown: &CancellationToken, handle: &F)
    where
        F: Fn(K) -> Fut,
        Fut: Future<Output = Outcome>,
    {
        while let Some(key) = self.get(shutdown).await {
            let held = Held { queue: self, key: &key };
            let started = Instant::now();
            let ticket = self.begin_work();
            let scope = self.tracker.as_ref().map(|t| t.ledger.scope(self.name, t.kind, (t.text)(&key)));
            let outcome = match &scope {
                Some(s) => s.run(handle(key.clone())).await,
                None => handle(key.clone()).await,
            };
            self.end_work(ticket);
            metrics::histogram!(names::WORK_DURATION, "name" => self.name).record(started.elapsed().as_secs_f64());
            drop(held);
            let done = outcome == Outcome::Done;
            match outcome {
                Outcome::Done => self.forget(&key),
                Outcome::Retry => self.add_rate_limited(key.clone()),
                Outcome::RetryAfter(d) => self.add_after(key.clone(), d),
            }
            if let Some(s) = scope {
                s.finish(if done {
                    crate::debug::Finish::Done
                } else {
                    crate::debug::Finish::Again { delay: self.due_in(&key), attempts: self.failures(&key) }
                });
            }
        }
    }
}

/// A key in a worker's hands: `done` when dropped, also when the worker is
/// cancelled mid-handling, so siblings waiting for the key get it.
struct Held<'a, K: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> {
    queue: &'a WorkQueue<K>,
    key: &'a K,
}

#[cfg(test)]
impl<K: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> WorkQueue<K> {
    /// The keys ready now, taken out and marked done (for tests of what a
    /// handler queued).
    pub(crate) async fn take_ready(&self) -> Vec<K> {
        let now = CancellationToken::new();
        now.cancel();
        let mut keys = Vec::new();
        while let Some(k) = self.get(&now).await {
            self.done(&k);
            keys.push(k);
        }
        keys
    }
}

impl<K: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> Drop for Held<'_, K> {
    fn drop(&mut self) {
        self.queue.done(self.key);
    }
}
