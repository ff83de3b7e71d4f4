//! The process's client-side request budget: one token bucket per module
//! (its `--kube-api-qps`/`--kube-api-burst`, as the upstream sidecar had in
//! its own process), pooled into one work-conserving budget. The rule is in
//! [`state`]; this file waits for tokens, puts the budget in front of a
//! [`kube::Client`], and publishes the budget's metrics ([`names`]) from the
//! counts the state keeps.

mod bucket;
mod line;
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
use line::{Lines, Ticket};
use state::{BudgetState, Wait};
pub use state::{Taker, Urgency, Usage, UsageSnapshot};
use tower::Service;

/// The urgency of a request (pure): writes of core or `events.k8s.io`
/// Events are deferrable, everything else is critical.
pub fn urgency(method: &http::Method, path: &str) -> Urgency {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // .../namespaces/<ns>/events[/<name>]
    let events_at = |i: usize| segments.get(i) == Some(&"events") && i >= 2 && segments[i - 2] == "namespaces";
    let n = segments.len();
    let event_path = (path.starts_with("/api/v1/") || path.starts_with(crate::compat::api::EVENTS_API_PREFIX))
        && ((n >= 1 && events_at(n - 1)) || (n >= 2 && events_at(n - 2)));
    if *method != http::Method::GET && event_path { Urgency::Deferrable } else { Urgency::Critical }
}

/// The budget's metric names (csi-sidecar's own; no upstream sidecar has
/// a pooled budget) and their help texts.
pub mod names {
    /// Requests waiting for a token now, per module.
    pub const WAITING: &str = "csi_sidecar_api_budget_waiting_requests";
    /// Help of [`WAITING`].
    pub const WAITING_HELP: &str =
        "Kubernetes API requests of the module now waiting for a token of the process's request budget.";
    /// Tokens granted, per module.
    pub const REQUESTS: &str = "csi_sidecar_api_budget_requests_total";
    /// Help of [`REQUESTS`].
    pub const REQUESTS_HELP: &str = "Tokens of the process's request budget granted to the module's Kubernetes API requests (from its own bucket or borrowed).";
    /// The module's `--kube-api-qps`.
    pub const QPS: &str = "csi_sidecar_api_budget_qps";
    /// Help of [`QPS`].
    pub const QPS_HELP: &str = "The module's --kube-api-qps: the rate its own bucket of the request budget refills at.";
    /// The module's `--kube-api-burst`.
    pub const BURST: &str = "csi_sidecar_api_budget_burst";
    /// Help of [`BURST`].
    pub const BURST_HELP: &str =
        "The module's --kube-api-burst: the most tokens its own bucket of the request budget saves up.";
    /// Event writes held back behind critical requests now, per module.
    pub const DEFERRED_EVENTS: &str = "csi_sidecar_api_budget_deferred_events";
    /// Help of [`DEFERRED_EVENTS`].
    pub const DEFERRED_EVENTS_HELP: &str =
        "Event writes of the module now held back because a critical request of the module itself waits for a token.";
    /// The label.
    pub const LABEL_MODULE: &str = "module";
    /// The `module` of the shared services' requests (the informers' lists
    /// and watches), in the waiting and granted families only.
    pub const SHARED_MODULE: &str = "informers";
}

/// The budget's series of one taker.
#[derive(Debug)]
struct Series {
    waiting: metrics::Gauge,
    requests: metrics::Counter,
    /// None for the shared services, which write no events.
    deferred: Option<metrics::Gauge>,
}

impl Series {
    fn new(module: &'static str, events: bool) -> Self {
        let label = names::LABEL_MODULE;
        Series {
            waiting: metrics::gauge!(names::WAITING, label => module),
            requests: metrics::counter!(names::REQUESTS, label => module),
            deferred: events.then(|| metrics::gauge!(names::DEFERRED_EVENTS, label => module)),
        }
    }

    fn show(&self, usage: &Usage) {
        self.waiting.set(usage.waiting as f64);
        self.requests.absolute(usage.granted);
        if let Some(d) = &self.deferred {
            d.set(usage.deferred as f64);
        }
    }
}

/// Every series of a budget whose accounts are modules.
#[derive(Debug)]
struct Published {
    accounts: Vec<Series>,
    shared: Series,
}

impl Published {
    /// Registers the series of `modules` (in account order) and of the
    /// shared services, with the buckets' settings from `state`.
    fn new(modules: &[&'static str], state: &BudgetState) -> Self {
        metrics::describe_gauge!(names::WAITING, names::WAITING_HELP);
        metrics::describe_counter!(names::REQUESTS, names::REQUESTS_HELP);
        metrics::describe_gauge!(names::QPS, names::QPS_HELP);
        metrics::describe_gauge!(names::BURST, names::BURST_HELP);
        metrics::describe_gauge!(names::DEFERRED_EVENTS, names::DEFERRED_EVENTS_HELP);
        for (&module, a) in modules.iter().zip(state.accounts()) {
            metrics::gauge!(names::QPS, names::LABEL_MODULE => module).set(a.qps);
            metrics::gauge!(names::BURST, names::LABEL_MODULE => module).set(a.burst);
        }
        let p = Published {
            accounts: modules.iter().map(|&m| Series::new(m, true)).collect(),
            shared: Series::new(names::SHARED_MODULE, false),
        };
        p.show(&state.usage());
        p
    }

    fn show(&self, usage: &UsageSnapshot) {
        for (series, u) in self.accounts.iter().zip(&usage.accounts) {
            series.show(u);
        }
        self.shared.show(&usage.shared);
    }
}

/// The pooled budget (see [`state`]).
#[derive(Debug)]
pub struct Budget {
    state: Mutex<BudgetState>,
    /// Who asks for a token next, per taker and urgency (never locked
    /// together with `state`).
    lines: Mutex<Lines>,
    origin: tokio::time::Instant,
    /// Woken when an account's last critical waiter or last waiter left
    /// (its events may go, or it lends again), or when a line has a new
    /// head.
    freed: tokio::sync::Notify,
    /// The metrics, for a budget of modules (see [`Budget::named`]).
    published: Option<Published>,
}

impl Budget {
    /// Full buckets of `(qps, burst)`, one per account (`qps > 0`); no
    /// metrics.
    pub fn new(accounts: &[(f64, u32)]) -> Arc<Self> {
        Self::build(accounts, None)
    }

    /// [`Budget::new`] with one account per module, `(module, (qps, burst))`,
    /// published in the process's metrics ([`names`]) from now on, every
    /// series at its start value.
    pub fn named(accounts: &[(&'static str, (f64, u32))]) -> Arc<Self> {
        let modules: Vec<&'static str> = accounts.iter().map(|(m, _)| *m).collect();
        let specs: Vec<(f64, u32)> = accounts.iter().map(|(_, b)| *b).collect();
        Self::build(&specs, Some(&modules))
    }

    fn build(accounts: &[(f64, u32)], modules: Option<&[&'static str]>) -> Arc<Self> {
        let state = BudgetState::new(accounts, Duration::ZERO);
        let published = modules.map(|m| Published::new(m, &state));
        Arc::new(Budget {
            state: Mutex::new(state),
            lines: Mutex::default(),
            origin: tokio::time::Instant::now(),
            freed: tokio::sync::Notify::new(),
            published,
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BudgetState> {
        self.state.lock()
    }

    /// Publishes the counts of `state` (under its lock, so that a later
    /// change is never overwritten by an earlier one).
    fn publish(&self, state: &BudgetState) {
        if let Some(p) = &self.published {
            p.show(&state.usage());
        }
    }

    /// What the metrics show now.
    pub fn usage(&self) -> UsageSnapshot {
        self.lock().usage()
    }

    /// Waits for a token for `taker`, after the requests of the same taker
    /// and urgency that asked before it ([`line`]).
    pub async fn acquire(self: Arc<Self>, taker: Taker, urgency: Urgency) {
        let place = Place(&self, self.lines.lock().join(taker, urgency));
        let mut waiting: Option<Waiter<'_>> = None;
        loop {
            let freed = self.freed.notified();
            let turn = self.lines.lock().is_head(place.1);
            let now = self.origin.elapsed();
            let taken = {
                let mut state = self.lock();
                // Behind an earlier request of its line: not its turn to ask.
                let taken =
                    if turn { state.try_take(taker, urgency, now).map(|_| ()) } else { Err(Wait::CriticalDone) };
                if taken.is_err() && waiting.is_none() {
                    // Counted from its first refusal until served, also if
                    // the caller gives up waiting.
                    state.start_waiting(taker, urgency, now);
                    waiting = Some(Waiter(&self, taker, urgency));
                }
                self.publish(&state);
                taken
            };
            match taken {
                // Served: leaving the line (dropping `place`) lets the next ask.
                Ok(()) => return,
                // Behind critical requests, or not its turn: until a
                // waiter leaves.
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

/// A request's place in its line; leaves it when dropped (served or given
/// up), waking the next in line.
struct Place<'a>(&'a Budget, Ticket);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let next = self.0.lines.lock().leave(self.1);
        if next {
            self.0.freed.notify_waiters();
        }
    }
}

/// Un-counts a waiting request when dropped.
struct Waiter<'a>(&'a Budget, Taker, Urgency);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let freed = {
            let mut state = self.0.lock();
            let freed = state.stop_waiting(self.1, self.2);
            self.0.publish(&state);
            freed
        };
        if freed {
            self.0.freed.notify_waiters();
        }
    }
}

/// A [`kube::Client`] whose requests take a token of `taker` from `budget`
/// before they are sent (a watch counts once).
pub fn client(inner: &kube::Client, budget: Arc<Budget>, taker: Taker) -> kube::Client {
    let ns = inner.default_namespace().to_string();
    kube::Client::new(Budgeted { inner: inner.clone(), budget, taker }, ns)
}

#[derive(Clone)]
struct Budgeted {
    inner: kube::Client,
    budget: Arc<Budget>,
    taker: Taker,
}

impl Service<http::Request<kube::client::Body>> for Budgeted {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
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

    /// Ten workers detaching twenty attachments, two requests each (the
    /// finalizer, then the status), from an empty bucket: served in the
    /// order they asked (client-go's limiter reserves in arrival order),
    /// every attachment's first request is among the first 30 tokens, so
    /// the last one is gone after 30 / 5 = 6 s, not after 39 tokens.
    #[tokio::test(start_paused = true)]
    async fn waiters_of_a_module_are_served_in_arrival_order() {
        let budget = Budget::new(&[(5.0, 10)]);
        let me = Taker::Account(0);
        for _ in 0..10 {
            budget.clone().acquire(me, Urgency::Critical).await;
        }
        let start = tokio::time::Instant::now();
        let items: Arc<Mutex<std::collections::VecDeque<usize>>> = Arc::new(Mutex::new((0..20).collect()));
        let gone: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..10 {
            let (b, items, gone) = (budget.clone(), items.clone(), gone.clone());
            workers.spawn(async move {
                loop {
                    let Some(_) = items.lock().pop_front() else { return };
                    b.clone().acquire(me, Urgency::Critical).await;
                    gone.lock().push(start.elapsed());
                    b.clone().acquire(me, Urgency::Critical).await;
                }
            });
        }
        while workers.join_next().await.is_some() {}
        let last = gone.lock().iter().copied().max().expect("times");
        assert!(last <= Duration::from_millis(6100), "the last attachment gone after {last:?}: {:?}", gone.lock());
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_request_goes_out_once_nothing_critical_waits() {
        let budget = Budget::new(&[(1.0, 1)]);
        budget.clone().acquire(Taker::Account(0), Urgency::Critical).await;
        let b = budget.clone();
        let event = tokio::spawn(async move { b.acquire(Taker::Account(0), Urgency::Deferrable).await });
        tokio::time::timeout(Duration::from_secs(3), event).await.expect("deferred, not dropped").expect("join");
    }

    /// Polls `f` until it holds, on the paused clock's own time.
    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn usage_shows_a_waiting_request_until_it_is_served_and_its_modules_events_held_back_meanwhile() {
        let budget = Budget::new(&[(1.0, 1), (1.0, 1)]);
        let (me, other) = (Taker::Account(0), Taker::Account(1));
        budget.clone().acquire(me, Urgency::Critical).await;
        budget.clone().acquire(other, Urgency::Critical).await;
        assert_eq!(budget.usage().accounts[0], Usage { waiting: 0, deferred: 0, granted: 1 }, "served at once");
        let critical = tokio::spawn(budget.clone().acquire(me, Urgency::Critical));
        until("the critical request waits", || budget.usage().accounts[0].waiting == 1).await;
        let own_event = tokio::spawn(budget.clone().acquire(me, Urgency::Deferrable));
        until("the event is held back", || budget.usage().accounts[0].deferred == 1).await;
        assert_eq!(budget.usage().accounts[0], Usage { waiting: 2, deferred: 1, granted: 1 });
        let other_event = tokio::spawn(budget.clone().acquire(other, Urgency::Deferrable));
        until("the other module's event waits", || budget.usage().accounts[1].waiting == 1).await;
        assert_eq!(
            budget.usage().accounts[1],
            Usage { waiting: 1, deferred: 0, granted: 1 },
            "waits for a token only, not behind another module's critical request"
        );
        critical.await.expect("served");
        assert_eq!(budget.usage().accounts[0].deferred, 0, "nothing critical of its module waits any more");
        own_event.await.expect("served");
        other_event.await.expect("served");
        assert_eq!(budget.usage().accounts[0], Usage { waiting: 0, deferred: 0, granted: 3 });
        assert_eq!(budget.usage().accounts[1], Usage { waiting: 0, deferred: 0, granted: 2 });
        // The shared services wait too once every bucket is empty (module
        // 1's has refilled one token).
        budget.clone().acquire(Taker::Shared, Urgency::Critical).await;
        let shared = tokio::spawn(budget.clone().acquire(Taker::Shared, Urgency::Critical));
        until("the informers' request waits", || budget.usage().shared.waiting == 1).await;
        shared.await.expect("served");
        assert_eq!(budget.usage().shared, Usage { waiting: 0, deferred: 0, granted: 2 });
    }

    /// Module 0 storms (three callers always waiting, borrowing every token
    /// module 1 does not use); module 1's events still go, each within two
    /// periods of its bucket, not after the storm.
    #[tokio::test(start_paused = true)]
    async fn a_modules_events_are_not_deferred_behind_another_modules_critical_requests() {
        let budget = Budget::new(&[(5.0, 10), (5.0, 10)]);
        let mut storm = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let b = budget.clone();
            storm.spawn(async move {
                loop {
                    b.clone().acquire(Taker::Account(0), Urgency::Critical).await;
                }
            });
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(budget.usage().accounts[0].waiting >= 2, "module 0 has critical requests waiting");
        for i in 0..5 {
            let start = tokio::time::Instant::now();
            let event = budget.clone().acquire(Taker::Account(1), Urgency::Deferrable);
            tokio::time::timeout(Duration::from_secs(2), event)
                .await
                .unwrap_or_else(|_| panic!("event {i} of module 1 deferred behind module 0's critical requests"));
            assert!(start.elapsed() <= Duration::from_millis(410), "event {i} waited {:?}", start.elapsed());
        }
        storm.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_waiting_is_no_longer_counted() {
        let budget = Budget::new(&[(0.1, 1)]);
        budget.clone().acquire(Taker::Account(0), Urgency::Critical).await;
        let waiting = tokio::spawn(budget.clone().acquire(Taker::Account(0), Urgency::Critical));
        until("it waits", || budget.usage().accounts[0].waiting == 1).await;
        waiting.abort();
        until("it left", || budget.usage().accounts[0].waiting == 0).await;
        assert_eq!(budget.usage().accounts[0].granted, 1);
    }

    /// A value of `family{labels}` in the exposition `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn a_named_budget_is_in_the_metrics_from_the_start() {
        let metrics = crate::metrics::Metrics::install().expect("recorder");
        let budget = Budget::named(&[("budget-test-a", (2.5, 3)), ("budget-test-b", (1.0, 1))]);
        let text = metrics.render();
        for name in [names::WAITING, names::REQUESTS, names::QPS, names::BURST, names::DEFERRED_EVENTS] {
            assert!(text.contains(&format!("# HELP {name} ")), "help of {name}:\n{text}");
        }
        let at = |text: &str, family: &str, module: &str| sample(text, &format!("{family}{{module=\"{module}\"}}"));
        for module in ["budget-test-a", "budget-test-b"] {
            for family in [names::WAITING, names::REQUESTS, names::DEFERRED_EVENTS] {
                assert_eq!(at(&text, family, module), Some(0.0), "{family} of {module}:\n{text}");
            }
        }
        assert_eq!(at(&text, names::QPS, "budget-test-a"), Some(2.5), "{text}");
        assert_eq!(at(&text, names::BURST, "budget-test-a"), Some(3.0), "{text}");
        assert_eq!(at(&text, names::BURST, "budget-test-b"), Some(1.0), "{text}");
        assert!(at(&text, names::WAITING, names::SHARED_MODULE).is_some(), "{text}");
        assert!(at(&text, names::REQUESTS, names::SHARED_MODULE).is_some(), "{text}");
        assert_eq!(at(&text, names::DEFERRED_EVENTS, names::SHARED_MODULE), None, "the informers write no events");
        // The series move with the budget: b's own token and a's three, then a wait.
        for _ in 0..4 {
            budget.clone().acquire(Taker::Account(1), Urgency::Critical).await;
        }
        let waiting = tokio::spawn(budget.clone().acquire(Taker::Account(1), Urgency::Critical));
        until("published", || at(&metrics.render(), names::WAITING, "budget-test-b") == Some(1.0)).await;
        waiting.await.expect("served");
        let text = metrics.render();
        assert_eq!(at(&text, names::WAITING, "budget-test-b"), Some(0.0), "{text}");
        assert_eq!(at(&text, names::REQUESTS, "budget-test-b"), Some(5.0), "{text}");
        assert_eq!(at(&text, names::REQUESTS, "budget-test-a"), Some(0.0), "granted to the taker: {text}");
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
