//! A work queue with client-go's semantics and upstream's metric names:
//!
//! - a key is queued at most once; a key added while it is being processed is
//!   processed again afterwards (never by two workers at once);
//! - per-key exponential backoff between `--retry-interval-start` and
//!   `--retry-interval-max`, reset when the key succeeds;
//! - `workqueue_*{name}` metrics, plus the age of the oldest queued key
//!   (`csi_sidecar_workqueue_oldest_item_age_seconds`), the backlog signal
//!   upstream lacks (external-attacher#706).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet, VecDeque},
    fmt::Debug,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Metric names (client-go's workqueue names, plus one of ours).
pub mod names {
    /// Keys waiting.
    pub const DEPTH: &str = "workqueue_depth";
    /// Keys added.
    pub const ADDS: &str = "workqueue_adds_total";
    /// Keys re-added after a failure.
    pub const RETRIES: &str = "workqueue_retries_total";
    /// Time a key waited before a worker took it.
    pub const QUEUE_DURATION: &str = "workqueue_queue_duration_seconds";
    /// Time a worker spent on a key.
    pub const WORK_DURATION: &str = "workqueue_work_duration_seconds";
    /// Age of the oldest key waiting (csi-sidecar addition).
    pub const OLDEST_ITEM_AGE: &str = "csi_sidecar_workqueue_oldest_item_age_seconds";
    /// Buckets of the duration histograms: client-go's 10ns × 10^k, k = 0..9.
    pub const DURATION_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];
}

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
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: the key's backoff is reset.
    Done,
    /// Failed: retried after the key's next backoff delay.
    Retry,
    /// Retry after exactly this delay (the backoff is kept).
    RetryAfter(Duration),
}

struct State<K> {
    queue: VecDeque<K>,
    /// Keys waiting in `queue`, with the time they were added.
    queued: HashMap<K, Instant>,
    processing: HashSet<K>,
    /// Keys added while being processed: requeued when done.
    dirty: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    delayed: BinaryHeap<Reverse<(Instant, u64, K)>>,
    seq: u64,
}

struct Inner<K> {
    name: &'static str,
    backoff: Backoff,
    state: Mutex<State<K>>,
    ready: Notify,
    timer: Notify,
}

/// A deduplicating, rate-limited work queue. Cheap to clone.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue { inner: self.inner.clone() }
    }
}

impl<K: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> WorkQueue<K> {
    /// A queue named `name` in metrics.
    pub fn new(name: &'static str, backoff: Backoff) -> Self {
        let state = State {
            queue: VecDeque::new(),
            queued: HashMap::new(),
            processing: HashSet::new(),
            dirty: HashMap::new(),
            failures: HashMap::new(),
            delayed: BinaryHeap::new(),
            seq: 0,
        };
        WorkQueue {
            inner: Arc::new(Inner {
                name,
                backoff,
                state: Mutex::new(state),
                ready: Notify::new(),
                timer: Notify::new(),
            }),
        }
    }

    /// TEMPORARY stand-in until the grouped queue lands: an independent queue.
    pub fn sibling(&self, name: &'static str) -> WorkQueue<K> {
        WorkQueue::new(name, self.inner.backoff)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` now (no-op if it is already waiting).
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        let now = Instant::now();
        if s.queued.contains_key(&key) {
            return;
        }
        metrics::counter!(names::ADDS, "name" => self.inner.name).increment(1);
        if s.processing.contains(&key) {
            s.dirty.entry(key).or_insert(now);
            return;
        }
        s.queued.insert(key.clone(), now);
        s.queue.push_back(key);
        self.publish_depth(&s);
        drop(s);
        self.inner.ready.notify_one();
    }

    /// Queues `key` after `delay`.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let mut s = self.lock();
        s.seq += 1;
        let seq = s.seq;
        s.delayed.push(Reverse((Instant::now() + delay, seq, key)));
        drop(s);
        self.inner.timer.notify_one();
    }

    /// Queues `key` after its next backoff delay.
    pub fn add_rate_limited(&self, key: K) {
        let failures = {
            let mut s = self.lock();
            let f = s.failures.entry(key.clone()).or_insert(0);
            *f += 1;
            *f
        };
        metrics::counter!(names::RETRIES, "name" => self.inner.name).increment(1);
        self.add_after(key, self.inner.backoff.delay(failures));
    }

    /// Resets `key`'s backoff.
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting (not counting delayed or in-progress ones).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn publish_depth(&self, s: &State<K>) {
        metrics::gauge!(names::DEPTH, "name" => self.inner.name).set(s.queue.len() as f64);
        let oldest = s.queue.front().and_then(|k| s.queued.get(k)).map_or(0.0, |t| t.elapsed().as_secs_f64());
        metrics::gauge!(names::OLDEST_ITEM_AGE, "name" => self.inner.name).set(oldest);
    }

    fn try_take(&self) -> Option<K> {
        let mut s = self.lock();
        let key = s.queue.pop_front()?;
        if let Some(added) = s.queued.remove(&key) {
            metrics::histogram!(names::QUEUE_DURATION, "name" => self.inner.name).record(added.elapsed().as_secs_f64());
        }
        s.processing.insert(key.clone());
        self.publish_depth(&s);
        Some(key)
    }

    /// Waits for a key; `None` on shutdown.
    pub async fn get(&self, shutdown: &CancellationToken) -> Option<K> {
        loop {
            let notified = self.inner.ready.notified();
            if let Some(k) = self.try_take() {
                return Some(k);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = notified => {}
            }
        }
    }

    /// Marks `key` processed; a key re-added meanwhile is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if let Some(added) = s.dirty.remove(key) {
            s.queued.insert(key.clone(), added);
            s.queue.push_back(key.clone());
            self.publish_depth(&s);
            drop(s);
            self.inner.ready.notify_one();
        }
    }

    /// Moves due delayed keys into the queue; returns when the next one is due.
    fn promote_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut s = self.lock();
            while let Some(Reverse((when, _, _))) = s.delayed.peek() {
                if *when > now {
                    break;
                }
                if let Some(Reverse((_, _, k))) = s.delayed.pop() {
                    due.push(k);
                }
            }
            s.delayed.peek().map(|Reverse((when, _, _))| *when)
        };
        for k in due {
            self.add(k);
        }
        next
    }

    async fn run_timer(&self, shutdown: CancellationToken) {
        loop {
            let notified = self.inner.timer.notified();
            let next = self.promote_due();
            let sleep = next.map_or(Duration::from_secs(1), |t| t.saturating_duration_since(Instant::now()));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = notified => {}
                _ = tokio::time::sleep(sleep.min(Duration::from_secs(1))) => {}
            }
            // Keep the oldest-item gauge moving while nothing happens.
            let s = self.lock();
            self.publish_depth(&s);
        }
    }

    /// Runs `workers` workers calling `handle` for each key until shutdown.
    pub async fn run<F, Fut>(&self, workers: usize, shutdown: CancellationToken, handle: F)
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send,
    {
        let handle = Arc::new(handle);
        let mut tasks = tokio::task::JoinSet::new();
        {
            let (q, shutdown) = (self.clone(), shutdown.clone());
            tasks.spawn(async move { q.run_timer(shutdown).await });
        }
        for _ in 0..workers.max(1) {
            let (q, shutdown, handle) = (self.clone(), shutdown.clone(), handle.clone());
            tasks.spawn(async move {
                while let Some(key) = q.get(&shutdown).await {
                    let started = Instant::now();
                    let outcome = handle(key.clone()).await;
                    metrics::histogram!(names::WORK_DURATION, "name" => q.inner.name)
                        .record(started.elapsed().as_secs_f64());
                    q.done(&key);
                    match outcome {
                        Outcome::Done => q.forget(&key),
                        Outcome::Retry => q.add_rate_limited(key),
                        Outcome::RetryAfter(d) => q.add_after(key, d),
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn q() -> WorkQueue<String> {
        WorkQueue::new("test", Backoff { start: Duration::from_millis(10), max: Duration::from_millis(80) })
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff { start: Duration::from_secs(1), max: Duration::from_secs(300) };
        let got: Vec<u64> = (1..=11).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.delay(u32::MAX).as_secs(), 300);
    }

    #[tokio::test]
    async fn a_key_is_queued_once() {
        let q = q();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        let stop = CancellationToken::new();
        assert_eq!(q.get(&stop).await.as_deref(), Some("a"));
        assert_eq!(q.get(&stop).await.as_deref(), Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_processing_is_processed_again_after() {
        let q = q();
        let stop = CancellationToken::new();
        q.add("a".into());
        let k = q.get(&stop).await.expect("key");
        q.add("a".into());
        assert!(q.is_empty(), "not handed to a second worker while in progress");
        q.done(&k);
        assert_eq!(q.get(&stop).await.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn failures_back_off_and_success_resets() {
        let q = q();
        q.add_rate_limited("a".into());
        q.add_rate_limited("a".into());
        assert_eq!(q.failures(&"a".to_string()), 2);
        q.forget(&"a".to_string());
        assert_eq!(q.failures(&"a".to_string()), 0);
    }

    #[tokio::test]
    async fn workers_retry_until_done_and_stop_on_shutdown() {
        let q = q();
        let calls = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        q.add("k".into());
        let (q2, calls2, stop2) = (q.clone(), calls.clone(), stop.clone());
        let run = tokio::spawn(async move {
            q2.run(4, stop2, move |_k| {
                let calls = calls2.clone();
                async move { if calls.fetch_add(1, Ordering::SeqCst) < 3 { Outcome::Retry } else { Outcome::Done } }
            })
            .await
        });
        let start = Instant::now();
        while calls.load(Ordering::SeqCst) < 4 && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4, "3 failures then success");
        // 10 + 20 + 40 ms of backoff at least.
        assert!(start.elapsed() >= Duration::from_millis(70), "{:?}", start.elapsed());
        assert_eq!(q.failures(&"k".to_string()), 0);
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(2), run).await.expect("workers stop").expect("join");
    }

    #[tokio::test]
    async fn delayed_keys_arrive_in_order() {
        let q = q();
        let stop = CancellationToken::new();
        let q2 = q.clone();
        let timer = tokio::spawn({
            let stop = stop.clone();
            async move { q2.run_timer(stop).await }
        });
        q.add_after("late".into(), Duration::from_millis(60));
        q.add_after("early".into(), Duration::from_millis(20));
        assert_eq!(q.get(&stop).await.as_deref(), Some("early"));
        assert_eq!(q.get(&stop).await.as_deref(), Some("late"));
        stop.cancel();
        timer.await.expect("timer");
    }
}
