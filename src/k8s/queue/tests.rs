//! The queue through its public API, with the real clock.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use tokio::sync::Notify;

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

#[test]
fn repeated_add_after_keeps_one_pending_delay() {
    let q = q();
    for _ in 0..3 {
        q.add_after("a".into(), Duration::from_secs(1));
    }
    assert_eq!(q.pending_dues(&"a".to_string()).len(), 1);
}

#[test]
fn a_later_delay_does_not_postpone_an_earlier_one() {
    let q = q();
    let before = Instant::now();
    q.add_after("a".into(), Duration::from_secs(1));
    q.add_after("a".into(), Duration::from_secs(3600));
    let dues = q.pending_dues(&"a".to_string());
    assert_eq!(dues.len(), 1, "one pending delay: {dues:?}");
    assert!(dues[0] <= Instant::now() + Duration::from_secs(1) && dues[0] >= before + Duration::from_secs(1));
}

#[test]
fn an_earlier_delay_replaces_a_later_one() {
    let q = q();
    q.add_after("a".into(), Duration::from_secs(3600));
    q.add_after("a".into(), Duration::from_secs(1));
    let dues = q.pending_dues(&"a".to_string());
    assert_eq!(dues.len(), 1, "one pending delay: {dues:?}");
    assert!(dues[0] <= Instant::now() + Duration::from_secs(1));
}

#[tokio::test]
async fn a_key_already_queued_may_also_get_a_pending_delay() {
    let q = q();
    q.add("a".into());
    q.add_after("a".into(), Duration::from_secs(1));
    assert_eq!(q.len(), 1);
    assert_eq!(q.pending_dues(&"a".to_string()).len(), 1);
}

#[tokio::test]
async fn a_zero_delay_is_an_add() {
    let q = q();
    q.add_after("a".into(), Duration::ZERO);
    assert_eq!(q.len(), 1);
    assert!(q.pending_dues(&"a".to_string()).is_empty());
}

#[tokio::test]
async fn an_earlier_delay_arrives_on_time_despite_a_later_one() {
    let q = q();
    let stop = CancellationToken::new();
    let timer = tokio::spawn({
        let (q, stop) = (q.clone(), stop.clone());
        async move { q.run_timer(stop).await }
    });
    q.add_after("a".into(), Duration::from_secs(3600));
    q.add_after("a".into(), Duration::from_millis(20));
    let got = tokio::time::timeout(Duration::from_secs(5), q.get(&stop)).await.expect("the earlier delay is kept");
    assert_eq!(got.as_deref(), Some("a"));
    q.done(&"a".to_string());
    assert!(q.pending_dues(&"a".to_string()).is_empty(), "the later request left nothing behind");
    stop.cancel();
    timer.await.expect("timer");
}

// With two plain queues (`WorkQueue::new` twice, as the attacher had for
// attach and detach) `b.get` hands out "k" while `a` still handles it: the
// same VolumeAttachment in publish and unpublish at once.
#[tokio::test]
async fn a_key_held_by_a_sibling_waits_without_blocking_other_keys() {
    let a = q();
    let b = a.sibling("test-sibling");
    let stop = CancellationToken::new();
    a.add("k".into());
    assert_eq!(a.get(&stop).await.as_deref(), Some("k"));
    b.add("k".into());
    b.add("other".into());
    assert_eq!(b.get(&stop).await.as_deref(), Some("other"), "the waiting key does not hold up the next one");
    assert!(b.try_take().is_none(), "not handed out while the sibling handles it");
    assert_eq!(b.len(), 1, "still waiting");
    b.done(&"k".to_string());
    assert!(b.try_take().is_none(), "done by a queue that does not handle it changes nothing");
    a.done(&"k".to_string());
    let got = tokio::time::timeout(Duration::from_secs(5), b.get(&stop)).await.expect("handed over after done");
    assert_eq!(got.as_deref(), Some("k"));
}

/// Counts handlers per key running right now and the most ever seen at once.
#[derive(Default)]
struct Overlap {
    running: Mutex<HashMap<String, usize>>,
    most: AtomicUsize,
    handled: AtomicUsize,
}

impl Overlap {
    async fn handle(&self, key: String) -> Outcome {
        let now = {
            let mut running = self.running.lock();
            let n = running.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        self.most.fetch_max(now, Ordering::SeqCst);
        // Simulated work, long enough for a second worker to try the key.
        tokio::time::sleep(Duration::from_millis(2)).await;
        *self.running.lock().entry(key).or_insert(1) -= 1;
        self.handled.fetch_add(1, Ordering::SeqCst);
        Outcome::Done
    }
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_never_handle_one_key_twice_at_once() {
    let attach = q();
    let detach = attach.sibling("test-detach");
    let overlap = Arc::new(Overlap::default());
    let stop = CancellationToken::new();
    let mut runs = tokio::task::JoinSet::new();
    for queue in [attach.clone(), detach.clone()] {
        let (overlap, stop) = (overlap.clone(), stop.clone());
        runs.spawn(async move {
            queue
                .run(4, stop, move |k| {
                    let overlap = overlap.clone();
                    async move { overlap.handle(k).await }
                })
                .await
        });
    }
    let mut rounds = 0;
    while overlap.handled.load(Ordering::SeqCst) < 200 {
        for k in ["x", "y"] {
            attach.add(k.to_string());
            detach.add(k.to_string());
        }
        rounds += 1;
        assert!(rounds < 10_000, "keys were not handled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(overlap.most.load(Ordering::SeqCst), 1, "a key was handled by two workers at once");
    stop.cancel();
    while runs.join_next().await.is_some() {}
}

#[tokio::test]
async fn a_key_waiting_for_a_sibling_is_handed_over_when_that_sibling_shuts_down() {
    let a = q();
    let b = a.sibling("test-sibling");
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let release = Arc::new(Notify::new());
    let b_handled = Arc::new(AtomicUsize::new(0));
    a.add("k".into());
    let run_a = tokio::spawn({
        let (a, stop, release) = (a.clone(), stop_a.clone(), release.clone());
        async move {
            a.run(1, stop, move |_| {
                let release = release.clone();
                async move {
                    release.notified().await;
                    Outcome::Done
                }
            })
            .await
        }
    });
    let run_b = tokio::spawn({
        let (b, stop, handled) = (b.clone(), stop_b.clone(), b_handled.clone());
        async move {
            b.run(1, stop, move |_| {
                let handled = handled.clone();
                async move {
                    handled.fetch_add(1, Ordering::SeqCst);
                    Outcome::Done
                }
            })
            .await
        }
    });
    wait_for("a to take the key", || a.is_empty()).await;
    b.add("k".into());
    b.add("other".into());
    wait_for("b to handle the other key", || b_handled.load(Ordering::SeqCst) == 1).await;
    assert_eq!(b.len(), 1, "k waits for a");
    stop_a.cancel();
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(5), run_a).await.expect("a stops").expect("join");
    wait_for("b to handle k", || b_handled.load(Ordering::SeqCst) == 2).await;
    assert!(b.is_empty());
    stop_b.cancel();
    run_b.await.expect("join");
}

#[tokio::test]
async fn a_worker_dropped_mid_handling_releases_its_key_to_the_sibling() {
    let a = q();
    let b = a.sibling("test-sibling");
    let stop = CancellationToken::new();
    a.add("k".into());
    let run_a = tokio::spawn({
        let (a, stop) = (a.clone(), stop.clone());
        async move { a.run(1, stop, |_| std::future::pending::<Outcome>()).await }
    });
    wait_for("a to take the key", || a.is_empty()).await;
    b.add("k".into());
    assert!(b.try_take().is_none(), "k is a's");
    run_a.abort();
    let got = tokio::time::timeout(Duration::from_secs(5), b.get(&stop)).await.expect("released by the drop");
    assert_eq!(got.as_deref(), Some("k"));
}

#[test]
fn unfinished_work_sums_and_the_longest_is_the_oldest() {
    let now = Instant::now();
    let ago = |ms| now - Duration::from_millis(ms);
    assert_eq!(unfinished_work([], now), (0.0, 0.0));
    let (sum, longest) = unfinished_work([ago(1500), ago(500), ago(0)], now);
    assert!((sum - 2.0).abs() < 1e-9 && (longest - 1.5).abs() < 1e-9, "{sum} {longest}");
    let (sum, _) = unfinished_work([now + Duration::from_secs(1)], now);
    assert_eq!(sum, 0.0, "a start after now counts nothing");
}

#[tokio::test]
async fn a_tracked_queue_files_failures_and_forgets_the_key_once_done() {
    use crate::debug::{Registry, WaitingFor};
    let registry = Registry::default();
    let ledger = registry.ledger("provisioner");
    let q = WorkQueue::new("claims", Backoff { start: Duration::from_secs(30), max: Duration::from_secs(60) })
        .tracked(&ledger, "PersistentVolumeClaim");
    let stop = CancellationToken::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let (failed, finished) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = {
        let (q, stop, calls, failed, finished) =
            (q.clone(), stop.clone(), calls.clone(), failed.clone(), finished.clone());
        tokio::spawn(async move {
            q.run(1, stop, move |_key: String| {
                let (calls, failed, finished) = (calls.clone(), failed.clone(), finished.clone());
                async move {
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        crate::debug::waiting_for(WaitingFor::Secret);
                        crate::debug::failed("secret \"s\" not found");
                        failed.notify_one();
                        Outcome::Retry
                    } else {
                        finished.notify_one();
                        Outcome::Done
                    }
                }
            })
            .await
        })
    };
    assert_eq!(ledger.phase(), crate::debug::Phase::Starting);
    q.add("ns/claim".into());
    failed.notified().await;
    assert_eq!(ledger.phase(), crate::debug::Phase::Running, "the workers run");
    let filed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some((_, e)) = ledger.entries().into_iter().next().filter(|(_, e)| e.attempts == 1) {
                return e;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the failure is filed");
    assert_eq!(filed.queue, "claims");
    assert_eq!(filed.waiting_for, WaitingFor::Secret);
    assert_eq!(filed.last_error.as_deref(), Some("secret \"s\" not found"));
    let retry_in = filed.next_retry.and_then(|t| t.duration_since(std::time::SystemTime::now()).ok()).unwrap();
    assert!(retry_in > Duration::from_secs(25) && retry_in <= Duration::from_secs(30), "{retry_in:?}");
    assert_eq!(ledger.entries()[0].0, ("PersistentVolumeClaim", "ns/claim".to_string()));
    // The next attempt (brought forward) succeeds: the entry goes.
    q.add("ns/claim".into());
    finished.notified().await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while !ledger.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a done key leaves the ledger");
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test]
async fn untracking_a_gone_key_drops_only_its_entry() {
    use crate::debug::{Finish, Registry, WaitingFor};
    let ledger = Registry::default().ledger("resizer");
    let q = q().tracked(&ledger, "PersistentVolumeClaim");
    for (queue, key) in [("test", "ns/gone"), ("test", "ns/kept"), ("other", "ns/gone")] {
        let scope = ledger.scope(queue, "PersistentVolumeClaim", key.to_string());
        scope.run(async { crate::debug::waiting_for(WaitingFor::Class) }).await;
        scope.finish(Finish::Done);
    }
    assert_eq!(ledger.len(), 3, "all wait (done, for an event)");
    q.untrack(&"ns/gone".to_string());
    let left: Vec<_> = ledger.entries().into_iter().map(|((_, k), e)| (e.queue, k)).collect();
    assert_eq!(left, [("other", "ns/gone".to_string()), ("test", "ns/kept".to_string())], "the other queue's stays");
    // An untracked queue (even of the same name) touches no ledger.
    self::q().untrack(&"ns/kept".to_string());
    assert_eq!(ledger.len(), 2);
}
