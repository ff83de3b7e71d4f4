//! The process's client-side request budget: one token bucket per module
//! (its `--kube-api-qps`/`--kube-api-burst`, as the upstream sidecar had in
//! its own process), pooled into one work-conserving budget. The rule is in
//! [`state`]; this file waits for tokens and puts the budget in front of a
//! [`kube::Client`].

mod bucket;
#[cfg(test)]
mod model;
pub mod state;

use parking_lot::Mutex;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

pub use bucket::TokenBucket;
use state::{BudgetState, Wait};
pub use state::{Taker, Urgency};
use tower::Service;

/// The urgency of a request (pure): writes of core or `events.k8s.io`
/// Events are deferrable, everything else is critical.
pub fn urgency(method: &http::Method, path: &str) -> Urgency {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // .../namespaces/<ns>/events[/<name>]
    let events_at = |i: usize| segments.get(i) == Some(&"events") && i >= 2 && segments[i - 2] == "namespaces";
    let n = segments.len();
    let event_path = (path.starts_with("/api/v1/") || path.starts_with("/apis/events.k8s.io/"))
        && ((n >= 1 && events_at(n - 1)) || (n >= 2 && events_at(n - 2)));
    if *method != http::Method::GET && event_path { Urgency::Deferrable } else { Urgency::Critical }
}

/// The pooled budget (see [`state`]).
#[derive(Debug)]
pub struct Budget {
    state: Mutex<BudgetState>,
    origin: tokio::time::Instant,
    /// Woken when an account's last critical waiter or last waiter left:
    /// its events may go, or it lends again.
    freed: tokio::sync::Notify,
}

impl Budget {
    /// Full buckets of `(qps, burst)`, one per account (`qps > 0`).
    pub fn new(accounts: &[(f64, u32)]) -> Arc<Self> {
        Arc::new(Budget {
            state: Mutex::new(BudgetState::new(accounts, Duration::ZERO)),
            origin: tokio::time::Instant::now(),
            freed: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BudgetState> {
        self.state.lock()
    }

    fn try_take(&self, taker: Taker, urgency: Urgency) -> Result<usize, Wait> {
        let now = self.origin.elapsed();
        self.lock().try_take(taker, urgency, now)
    }

    /// Waits for a token for `taker`.
    pub async fn acquire(self: Arc<Self>, taker: Taker, urgency: Urgency) {
        let _waiting = match taker {
            Taker::Account(i) => {
                self.lock().start_waiting(i, urgency);
                // Counted until served, also if the caller gives up waiting.
                Some(Waiter(&self, i, urgency))
            }
            Taker::Shared => None,
        };
        loop {
            let freed = self.freed.notified();
            match self.try_take(taker, urgency) {
                Ok(_) => return,
                Err(Wait::CriticalDone) => freed.await,
                Err(Wait::For(d)) => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = freed => {}
                    }
                }
            }
        }
    }
}

/// Un-counts a waiting request when dropped.
struct Waiter<'a>(&'a Budget, usize, Urgency);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let freed = self.0.lock().stop_waiting(self.1, self.2);
        if freed {
            self.0.freed.notify_waiters();
        }
    }
}

/// A [`kube::Client`] whose requests take a token of `taker` from `budget`
/// before they are sent (a watch counts once).
pub fn client(inner: &::kube::Client, budget: Arc<Budget>, taker: Taker) -> ::kube::Client {
    let ns = inner.default_namespace().to_string();
    ::kube::Client::new(Budgeted { inner: inner.clone(), budget, taker }, ns)
}

#[derive(Clone)]
struct Budgeted {
    inner: ::kube::Client,
    budget: Arc<Budget>,
    taker: Taker,
}

impl Service<http::Request<::kube::client::Body>> for Budgeted {
    type Response = http::Response<::kube::client::Body>;
    type Error = ::kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<::kube::client::Body>) -> Self::Future {
        let wait = self.budget.clone().acquire(self.taker, urgency(req.method(), req.uri().path()));
        let inner = self.inner.clone();
        Box::pin(async move {
            wait.await;
            inner.send(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_event_writes_are_deferrable() {
        use http::Method;
        let table = [
            (Method::POST, "/api/v1/namespaces/ns/events", Urgency::Deferrable),
            (Method::PATCH, "/api/v1/namespaces/ns/events/pvc.17a", Urgency::Deferrable),
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events", Urgency::Deferrable),
            (Method::GET, "/api/v1/namespaces/ns/events", Urgency::Critical),
            (Method::POST, "/api/v1/persistentvolumes", Urgency::Critical),
            (Method::PATCH, "/api/v1/persistentvolumes/events", Urgency::Critical),
            (Method::PATCH, "/apis/storage.k8s.io/v1/volumeattachments/va/status", Urgency::Critical),
            (Method::PATCH, "/api/v1/namespaces/events/persistentvolumeclaims/c", Urgency::Critical),
        ];
        for (m, path, want) in table {
            assert_eq!(urgency(&m, path), want, "{m} {path}");
        }
    }

    /// With a backlog of critical requests, deferred ones wait until it is
    /// served, and the whole stays within the bucket's rate.
    #[tokio::test(start_paused = true)]
    async fn critical_requests_go_before_deferred_ones_within_one_budget() {
        let budget = Budget::new(&[(5.0, 10)]);
        let me = Taker::Account(0);
        let order: Arc<Mutex<Vec<(&'static str, Duration)>>> = Arc::default();
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        // Drain the burst first, so everything below has to wait.
        for _ in 0..10 {
            budget.clone().acquire(me, Urgency::Critical).await;
        }
        for _ in 0..5 {
            let (b, order) = (budget.clone(), order.clone());
            tasks.spawn(async move {
                b.acquire(me, Urgency::Deferrable).await;
                order.lock().push(("event", start.elapsed()));
            });
        }
        tokio::task::yield_now().await;
        for _ in 0..30 {
            let (b, order) = (budget.clone(), order.clone());
            tasks.spawn(async move {
                b.acquire(me, Urgency::Critical).await;
                order.lock().push(("critical", start.elapsed()));
            });
        }
        while tasks.join_next().await.is_some() {}
        let order = order.lock().clone();
        assert_eq!(order.len(), 35);
        let first_event = order.iter().position(|(k, _)| *k == "event").expect("events went out");
        // At most the event whose token was already due when the critical
        // requests queued up may go before them.
        assert!(first_event >= 29, "events deferred behind the critical backlog: {order:?}");
        // 45 tokens in all: 10 of burst, 35 more at 5/s = 7 s; never faster.
        let end = order.iter().map(|(_, t)| *t).max().expect("times");
        assert!(end >= Duration::from_millis(6900), "within the rate: {end:?}");
        assert!(end <= Duration::from_millis(7400), "no token wasted: {end:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_request_goes_out_once_nothing_critical_waits() {
        let budget = Budget::new(&[(1.0, 1)]);
        budget.clone().acquire(Taker::Account(0), Urgency::Critical).await;
        let b = budget.clone();
        let event = tokio::spawn(async move { b.acquire(Taker::Account(0), Urgency::Deferrable).await });
        tokio::time::timeout(Duration::from_secs(3), event).await.expect("deferred, not dropped").expect("join");
    }

    /// Starts `n` critical requests of each account at once (interleaved)
    /// and reads how many of each were served at each of `checkpoints`.
    async fn served_at(budget: &Arc<Budget>, n: &[usize], checkpoints: &[Duration]) -> Vec<Vec<usize>> {
        let served: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(vec![0; n.len()]));
        let mut tasks = tokio::task::JoinSet::new();
        for round in 0..n.iter().copied().max().unwrap_or(0) {
            for account in (0..n.len()).filter(|&a| round < n[a]) {
                let (b, served) = (budget.clone(), served.clone());
                tasks.spawn(async move {
                    b.acquire(Taker::Account(account), Urgency::Critical).await;
                    served.lock()[account] += 1;
                });
            }
        }
        let start = tokio::time::Instant::now();
        let mut got = Vec::new();
        for &at in checkpoints {
            tokio::time::sleep_until(start + at).await;
            got.push(served.lock().clone());
        }
        tasks.abort_all();
        got
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_module_alone_gets_the_idle_modules_share() {
        let budget = Budget::new(&[(5.0, 10), (5.0, 10), (5.0, 10)]);
        // 30 of burst, then 15/s for 4 s: 90, where its own bucket gives 30.
        let got = served_at(&budget, &[200, 0, 0], &[Duration::from_millis(4010)]).await;
        assert_eq!(got[0][0], 90, "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn busy_modules_each_get_their_own_share() {
        let budget = Budget::new(&[(5.0, 10), (2.0, 4), (1.0, 1)]);
        // Once the bursts are spent (who lent whom at the start depends on
        // who waited first), each gets exactly its own rate: 8 s.
        let ms = Duration::from_millis;
        let got = served_at(&budget, &[200, 200, 200], &[ms(2010), ms(10_010)]).await;
        let rates: Vec<usize> = (0..3).map(|a| got[1][a] - got[0][a]).collect();
        assert_eq!(rates, vec![40, 16, 8], "{got:?}");
        assert_eq!(got[1].iter().sum::<usize>(), 15 + 8 * 10, "the pool's bursts and rates, no more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_module_that_becomes_busy_is_served_at_once_from_its_own_tokens() {
        let budget = Budget::new(&[(5.0, 10), (5.0, 10)]);
        // Module 0 storms and borrows all of module 1's bucket.
        let b = budget.clone();
        let storm = tokio::spawn(async move {
            loop {
                b.clone().acquire(Taker::Account(0), Urgency::Critical).await;
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Module 1's first request waits at most one of its own refills.
        let start = tokio::time::Instant::now();
        budget.clone().acquire(Taker::Account(1), Urgency::Critical).await;
        assert!(start.elapsed() <= Duration::from_millis(200), "{:?}", start.elapsed());
        // And from then on it gets its rate, the storm notwithstanding.
        let got = served_at(&budget, &[0, 100], &[Duration::from_millis(2010)]).await;
        assert!(got[0][1] >= 10, "{got:?}");
        storm.abort();
    }
}
