//! The pure state of the process's request budget, with explicit time.
//!
//! Every module has a token bucket of its own (`qps` per second, `burst`
//! saved up), as the upstream sidecar it replaces had in its own process.
//! The buckets are pooled into one work-conserving budget:
//!
//! - A module's critical request (anything but an Event write) takes a
//!   token from its own bucket first; if that is empty, it borrows one from
//!   a module with no critical request waiting (an idle module's share goes
//!   to a busy one). So when every module has critical work each is limited
//!   to its own bucket, and when one is busy alone it may use the others'.
//! - A module's critical writes go before its own events: an Event write
//!   (deferrable) waits while a critical request of its module waits (never
//!   behind another module's), then takes from its own bucket, or borrows
//!   from a module with nothing waiting.
//! - A module's event share is lent to other modules' critical requests for
//!   one period of its bucket (`1 / qps`) at most: once its events have
//!   waited that long without a token (since the first started waiting, or
//!   the last got one), it lends nothing until they got one. So a storm in
//!   one module delays another module's events by two periods at most.
//! - A request of the shared services (the informers' lists and watches,
//!   one per kind for all modules) takes a token from whichever bucket has
//!   the most, waiters or not: it is rare, and the modules all need it.
//!
//! Tokens only come from the buckets' refills, so in any window of `t`
//! seconds the process sends at most `Σ burst + Σ qps · t` requests: no more
//! than the processes it replaces could.
//!
//! The state also counts what the budget's metrics show ([`BudgetState::usage`]):
//! the requests waiting and the tokens granted, per module and for the shared
//! services; the counts of the shared services play no part in the rule.

use std::time::Duration;

/// Float noise below which a bucket counts as holding a whole token (the
/// refills add fractions; a token due "now" must not wait a nanosecond).
const EPSILON: f64 = 1e-9;

/// How urgent a request is for the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// Work a user waits for: everything but events.
    Critical,
    /// Event writes: sent when nothing critical is waiting.
    Deferrable,
}

/// Who asks for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    /// The module with this account index.
    Account(usize),
    /// The shared services (informers): any bucket, the fullest first.
    Shared,
}

/// Why a taker must wait.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Wait {
    /// A token it may take is due after this long (sooner if the budget
    /// changes: a lender may become free).
    For(Duration),
    /// Until no critical request waits (a deferrable request behind them).
    CriticalDone,
}

/// One module's bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Account {
    /// Tokens per second.
    pub qps: f64,
    /// Most tokens saved up.
    pub burst: f64,
    /// Tokens now.
    pub tokens: f64,
    /// Critical requests of this module waiting for a token.
    pub critical_waiting: usize,
    /// Deferrable requests of this module waiting for a token.
    pub deferred_waiting: usize,
    /// Since when its events wait without a token: since the first started
    /// waiting, or the last got one (`None`: none waits).
    pub events_waiting_since: Option<Duration>,
    /// Tokens granted to this module's requests so far (from any bucket).
    pub granted: u64,
}

impl Account {
    /// Whether a request of the module waits: then it lends nothing to
    /// events.
    pub fn busy(&self) -> bool {
        self.critical_waiting + self.deferred_waiting > 0
    }

    /// Whether it lends to another module's critical request at `now`:
    /// none of its own critical requests waits, and its events have not
    /// waited a whole period of its bucket.
    pub fn lends_to_critical(&self, now: Duration) -> bool {
        let starved = self
            .events_waiting_since
            .is_some_and(|since| now.saturating_sub(since).as_secs_f64() * self.qps + EPSILON >= 1.0);
        self.critical_waiting == 0 && !starved
    }
}

/// The budget's state. Time is the caller's (`now` since any fixed origin).
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetState {
    accounts: Vec<Account>,
    last: Duration,
    /// The shared services' requests waiting for a token, and their tokens
    /// granted so far (counted only: they lend and borrow regardless).
    shared: Usage,
}

/// What the budget's metrics show of one taker (a module, or the shared
/// services).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests waiting for a token now, critical and deferrable.
    pub waiting: usize,
    /// Event writes held back behind critical requests now: the taker's
    /// deferrable requests waiting while a critical request of its own
    /// module waits.
    pub deferred: usize,
    /// Tokens granted to the taker's requests so far.
    pub granted: u64,
}

/// [`Usage`] of every account, in index order, and of the shared services.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageSnapshot {
    /// Per account.
    pub accounts: Vec<Usage>,
    /// The shared services'.
    pub shared: Usage,
}

impl BudgetState {
    /// Full buckets of `(qps, burst)` each (`qps > 0`; a burst of 0 counts as 1).
    pub fn new(specs: &[(f64, u32)], now: Duration) -> Self {
        let accounts = specs
            .iter()
            .map(|&(qps, burst)| {
                let burst = f64::from(burst.max(1));
                Account {
                    qps,
                    burst,
                    tokens: burst,
                    critical_waiting: 0,
                    deferred_waiting: 0,
                    events_waiting_since: None,
                    granted: 0,
                }
            })
            .collect();
        BudgetState { accounts, last: now, shared: Usage::default() }
    }

    /// The accounts, in index order.
    pub fn accounts(&self) -> &[Account] {
        &self.accounts
    }

    /// What the metrics show now (pure).
    pub fn usage(&self) -> UsageSnapshot {
        let accounts = self
            .accounts
            .iter()
            .map(|a| Usage {
                waiting: a.critical_waiting + a.deferred_waiting,
                deferred: if a.critical_waiting > 0 { a.deferred_waiting } else { 0 },
                granted: a.granted,
            })
            .collect();
        UsageSnapshot { accounts, shared: self.shared }
    }

    /// Counts a request of `taker` as waiting from `now` on.
    pub fn start_waiting(&mut self, taker: Taker, urgency: Urgency, now: Duration) {
        let account = match taker {
            Taker::Account(i) => i,
            Taker::Shared => {
                self.shared.waiting += 1;
                return;
            }
        };
        if let Some(a) = self.accounts.get_mut(account) {
            match urgency {
                Urgency::Critical => a.critical_waiting += 1,
                Urgency::Deferrable => {
                    if a.deferred_waiting == 0 {
                        a.events_waiting_since = Some(now);
                    }
                    a.deferred_waiting += 1;
                }
            }
        }
    }

    /// Un-counts a waiting request of `taker`; says whether that may let
    /// another request go (the account's last critical waiter left, or its
    /// last waiter: it lends again; never for the shared services).
    pub fn stop_waiting(&mut self, taker: Taker, urgency: Urgency) -> bool {
        let account = match taker {
            Taker::Account(i) => i,
            Taker::Shared => {
                self.shared.waiting = self.shared.waiting.saturating_sub(1);
                return false;
            }
        };
        let Some(a) = self.accounts.get_mut(account) else { return false };
        let count = match urgency {
            Urgency::Critical => &mut a.critical_waiting,
            Urgency::Deferrable => &mut a.deferred_waiting,
        };
        if *count == 0 {
            return false;
        }
        *count -= 1;
        let last = *count == 0;
        if last && urgency == Urgency::Deferrable {
            a.events_waiting_since = None;
        }
        last
    }

    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.last);
        if now > self.last {
            self.last = now;
        }
        for a in &mut self.accounts {
            a.tokens = super::bucket::refill(a.tokens, elapsed, a.qps, a.burst);
        }
    }

    /// The buckets `taker` may take from with `urgency` at `now`, own
    /// first (pure rule; `None`: deferred behind its module's critical
    /// requests).
    fn sources(&self, taker: Taker, urgency: Urgency, now: Duration) -> Option<Vec<usize>> {
        let all = 0..self.accounts.len();
        let Taker::Account(own) = taker else { return Some(all.collect()) };
        let mine = self.accounts.get(own)?;
        let lends = |a: &Account| match urgency {
            // A critical request borrows from any module without a critical
            // request of its own waiting, whose events have not waited a
            // whole period (they can wait that long).
            Urgency::Critical => a.lends_to_critical(now),
            // An event borrows only from a module with nothing waiting.
            Urgency::Deferrable => !a.busy(),
        };
        // An event goes only when no critical request of its module waits.
        if urgency == Urgency::Deferrable && mine.critical_waiting > 0 {
            return None;
        }
        Some(std::iter::once(own).chain(all.filter(|&i| i != own && lends(&self.accounts[i]))).collect())
    }

    /// Takes a token now for `taker`, and says from which account; or how
    /// to wait. A module's own bucket goes first, then the fullest lender.
    pub fn try_take(&mut self, taker: Taker, urgency: Urgency, now: Duration) -> Result<usize, Wait> {
        self.refill(now);
        let Some(sources) = self.sources(taker, urgency, now) else {
            return Err(Wait::CriticalDone);
        };
        let own = match taker {
            Taker::Account(i) => sources.first().copied().filter(|&s| s == i),
            Taker::Shared => None,
        };
        let pick = own.filter(|&i| self.accounts[i].tokens + EPSILON >= 1.0).or_else(|| {
            sources
                .iter()
                .copied()
                .filter(|&i| self.accounts[i].tokens + EPSILON >= 1.0)
                .max_by(|&a, &b| self.accounts[a].tokens.total_cmp(&self.accounts[b].tokens))
        });
        if let Some(i) = pick {
            self.accounts[i].tokens -= 1.0;
            match taker {
                Taker::Account(own) => {
                    let a = &mut self.accounts[own];
                    a.granted += 1;
                    // Its events got a token: their period starts anew.
                    if urgency == Urgency::Deferrable && a.deferred_waiting > 0 {
                        a.events_waiting_since = Some(now);
                    }
                }
                Taker::Shared => self.shared.granted += 1,
            }
            return Ok(i);
        }
        let soonest = sources
            .iter()
            .map(|&i| {
                let a = &self.accounts[i];
                Duration::from_secs_f64(((1.0 - a.tokens) / a.qps).max(0.0))
            })
            .min();
        // No source at all (no accounts): nothing will ever refill.
        Err(Wait::For(soonest.unwrap_or(Duration::from_secs(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn three() -> BudgetState {
        BudgetState::new(&[(5.0, 10), (5.0, 10), (5.0, 10)], Duration::ZERO)
    }

    fn drain(s: &mut BudgetState, taker: Taker, now: Duration) -> Vec<usize> {
        let mut got = Vec::new();
        while let Ok(i) = s.try_take(taker, Urgency::Critical, now) {
            got.push(i);
        }
        got
    }

    #[test]
    fn a_module_alone_uses_its_own_bucket_first_then_the_idle_ones() {
        let mut s = three();
        let got = drain(&mut s, Taker::Account(1), Duration::ZERO);
        assert_eq!(got.len(), 30, "its 10 and the two idle modules' 10 each");
        assert!(got[..10].iter().all(|&i| i == 1), "own bucket first: {got:?}");
        // After that: the refills of all three, 15 per second.
        assert_eq!(drain(&mut s, Taker::Account(1), Duration::from_secs(1)).len(), 15);
    }

    #[test]
    fn a_module_with_critical_waiters_lends_nothing() {
        let mut s = three();
        s.start_waiting(Taker::Account(0), Urgency::Critical, Duration::ZERO);
        let got = drain(&mut s, Taker::Account(1), Duration::ZERO);
        assert_eq!(got.len(), 20, "its own and module 2's, not module 0's: {got:?}");
        assert!(!got.contains(&0));
        // Module 0 still has its whole bucket for itself.
        assert_eq!(drain(&mut s, Taker::Account(0), Duration::ZERO).len(), 10);
    }

    #[test]
    fn when_every_module_is_busy_each_gets_its_own_rate() {
        let mut s = BudgetState::new(&[(5.0, 10), (2.0, 4)], Duration::ZERO);
        s.start_waiting(Taker::Account(0), Urgency::Critical, Duration::ZERO);
        s.start_waiting(Taker::Account(1), Urgency::Critical, Duration::ZERO);
        assert_eq!(drain(&mut s, Taker::Account(0), Duration::ZERO), vec![0; 10]);
        assert_eq!(drain(&mut s, Taker::Account(1), Duration::ZERO), vec![1; 4]);
        assert_eq!(drain(&mut s, Taker::Account(0), Duration::from_secs(2)), vec![0; 10]);
        assert_eq!(drain(&mut s, Taker::Account(1), Duration::from_secs(2)), vec![1; 4]);
        // The wait is until its own next token.
        assert_eq!(s.try_take(Taker::Account(1), Urgency::Critical, Duration::from_secs(2)), Err(Wait::For(MS(500))));
    }

    #[test]
    fn events_wait_only_while_their_own_modules_critical_request_waits() {
        let mut s = three();
        s.start_waiting(Taker::Account(2), Urgency::Critical, Duration::ZERO);
        assert_eq!(
            s.try_take(Taker::Account(2), Urgency::Deferrable, Duration::ZERO),
            Err(Wait::CriticalDone),
            "behind its own module's"
        );
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Deferrable, Duration::ZERO), Ok(0), "not behind module 2's");
        assert!(s.stop_waiting(Taker::Account(2), Urgency::Critical), "its last critical waiter left");
        assert_eq!(s.try_take(Taker::Account(2), Urgency::Deferrable, Duration::ZERO), Ok(2));
    }

    #[test]
    fn a_module_whose_events_wait_lends_to_critical_requests_for_one_period_of_its_bucket_at_most() {
        // Module 1's period: 250 ms.
        let mut s = BudgetState::new(&[(1.0, 1), (4.0, 1)], Duration::ZERO);
        let (busy, events) = (Taker::Account(0), Taker::Account(1));
        s.start_waiting(busy, Urgency::Critical, Duration::ZERO);
        assert_eq!(drain(&mut s, busy, Duration::ZERO), vec![0, 1], "its own, then the idle module's");
        assert_eq!(s.try_take(events, Urgency::Deferrable, MS(100)), Err(Wait::For(MS(150))));
        s.start_waiting(events, Urgency::Deferrable, MS(100));
        assert_eq!(s.try_take(busy, Urgency::Critical, MS(250)), Ok(1), "its events waited 150 ms: it lends");
        assert_eq!(
            s.try_take(busy, Urgency::Critical, MS(500)),
            Err(Wait::For(MS(500))),
            "its events waited a whole period: its next token is theirs"
        );
        assert_eq!(s.try_take(events, Urgency::Deferrable, MS(500)), Ok(1));
        assert!(s.stop_waiting(events, Urgency::Deferrable));
        // Nothing waits for module 1's tokens any more: it lends again.
        assert_eq!(s.try_take(busy, Urgency::Critical, MS(1000)), Ok(0));
        assert_eq!(s.try_take(busy, Urgency::Critical, MS(1000)), Ok(1));
    }

    #[test]
    fn a_module_with_only_events_waiting_lends_to_critical_requests_not_to_events() {
        let mut s = three();
        s.start_waiting(Taker::Account(1), Urgency::Deferrable, Duration::ZERO);
        let got = drain(&mut s, Taker::Account(0), Duration::ZERO);
        assert_eq!(got.len(), 30, "module 1's events wait; its tokens serve module 0's critical work: {got:?}");
        let mut s = BudgetState::new(&[(5.0, 1), (5.0, 10), (5.0, 10)], Duration::ZERO);
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Critical, Duration::ZERO), Ok(0));
        s.start_waiting(Taker::Account(1), Urgency::Deferrable, Duration::ZERO);
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Deferrable, Duration::ZERO), Ok(2), "not module 1's");
    }

    #[test]
    fn the_shared_services_take_from_the_fullest_bucket_even_a_busy_one() {
        let mut s = three();
        s.start_waiting(Taker::Account(0), Urgency::Critical, Duration::ZERO);
        s.start_waiting(Taker::Account(1), Urgency::Critical, Duration::ZERO);
        s.start_waiting(Taker::Account(2), Urgency::Critical, Duration::ZERO);
        drain(&mut s, Taker::Account(0), Duration::ZERO);
        drain(&mut s, Taker::Account(2), Duration::ZERO);
        assert_eq!(s.try_take(Taker::Shared, Urgency::Critical, Duration::ZERO), Ok(1));
    }

    #[test]
    fn an_empty_budget_says_when_the_next_token_is_due() {
        let mut s = BudgetState::new(&[(4.0, 1)], Duration::ZERO);
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Critical, Duration::ZERO), Ok(0));
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Critical, MS(100)), Err(Wait::For(MS(150))));
        assert_eq!(s.try_take(Taker::Account(0), Urgency::Critical, MS(250)), Ok(0));
    }

    #[test]
    fn usage_counts_waiters_grants_and_events_held_back_behind_their_modules_critical_requests() {
        let mut s = BudgetState::new(&[(1.0, 2), (1.0, 2)], Duration::ZERO);
        let usage = |s: &BudgetState, a: usize| s.usage().accounts[a];
        assert_eq!(s.usage(), UsageSnapshot { accounts: vec![Usage::default(); 2], shared: Usage::default() });
        // Module 0 takes its own two tokens and one of module 1's.
        for want in [0, 0, 1] {
            assert_eq!(s.try_take(Taker::Account(0), Urgency::Critical, Duration::ZERO), Ok(want));
        }
        assert_eq!(s.try_take(Taker::Shared, Urgency::Critical, Duration::ZERO), Ok(1));
        assert_eq!(usage(&s, 0).granted, 3, "granted to the taker, whichever bucket gave");
        assert_eq!(usage(&s, 1).granted, 0);
        assert_eq!(s.usage().shared.granted, 1);
        // An event of module 1 waits for a token only: not held back.
        s.start_waiting(Taker::Account(1), Urgency::Deferrable, Duration::ZERO);
        assert_eq!(usage(&s, 1), Usage { waiting: 1, deferred: 0, granted: 0 });
        // A critical request of module 0 waits: module 1's event is not
        // behind it, module 0's own is.
        s.start_waiting(Taker::Account(0), Urgency::Critical, Duration::ZERO);
        assert_eq!(usage(&s, 0), Usage { waiting: 1, deferred: 0, granted: 3 });
        assert_eq!(usage(&s, 1), Usage { waiting: 1, deferred: 0, granted: 0 });
        s.start_waiting(Taker::Account(0), Urgency::Deferrable, Duration::ZERO);
        assert_eq!(usage(&s, 0), Usage { waiting: 2, deferred: 1, granted: 3 });
        s.start_waiting(Taker::Shared, Urgency::Critical, Duration::ZERO);
        assert_eq!(s.usage().shared.waiting, 1);
        assert!(!s.stop_waiting(Taker::Shared, Urgency::Critical), "the shared services free nothing");
        assert!(s.stop_waiting(Taker::Account(0), Urgency::Critical));
        assert_eq!(usage(&s, 0), Usage { waiting: 1, deferred: 0, granted: 3 }, "no longer behind anything");
        assert!(s.stop_waiting(Taker::Account(0), Urgency::Deferrable));
        assert_eq!(s.try_take(Taker::Account(1), Urgency::Deferrable, Duration::from_secs(1)), Ok(1));
        assert!(s.stop_waiting(Taker::Account(1), Urgency::Deferrable));
        assert_eq!(usage(&s, 1), Usage { waiting: 0, deferred: 0, granted: 1 });
        assert_eq!(s.usage().shared, Usage { waiting: 0, deferred: 0, granted: 1 });
    }

    #[test]
    fn a_bucket_never_holds_more_than_its_burst() {
        let mut s = three();
        drain(&mut s, Taker::Account(0), Duration::ZERO);
        assert_eq!(drain(&mut s, Taker::Account(0), Duration::from_secs(3600)).len(), 30);
    }
}
