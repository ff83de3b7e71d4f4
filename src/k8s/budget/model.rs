//! The budget's contract, property-tested against a small model: one plain
//! token bucket per module and the lending rule written out directly.
//! Random schedules of takes, waiters and time check that
//!
//! - the state grants a token exactly when the model has one the taker may
//!   take (work-conserving: nothing is refused that a bucket could give),
//!   from a bucket the taker may take from, its own first;
//! - an event waits only while a critical request of its own module waits
//!   (never behind another module's);
//! - a module whose events wait lends its bucket to other modules' critical
//!   requests for at most one period of its bucket (`1 / qps`) since its
//!   events started waiting or last got a token;
//! - in every window, every bucket and the whole budget stay within
//!   `burst + qps · t` (the total never exceeds what separate processes had);
//! - the usage the metrics show counts each taker's grants and waiters, and
//!   holds a module's events back exactly while its own critical request
//!   waits.

use std::time::Duration;

use proptest::prelude::*;

use super::state::{BudgetState, Taker, Urgency, Usage, Wait};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Take(Option<usize>, bool),
    StartWaiting(usize, bool),
    StopWaiting(usize, bool),
}

fn op(accounts: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..700).prop_map(Op::Advance),
        8 => (proptest::option::weighted(0.9, 0..accounts), proptest::bool::weighted(0.8))
            .prop_map(|(a, critical)| Op::Take(a, critical)),
        2 => (0..accounts, proptest::bool::weighted(0.7)).prop_map(|(a, c)| Op::StartWaiting(a, c)),
        2 => (0..accounts, proptest::bool::weighted(0.7)).prop_map(|(a, c)| Op::StopWaiting(a, c)),
    ]
}

/// A plain token bucket, in exact units of 1/2000 token (rates are halves
/// of whole numbers per second, time is in milliseconds).
#[derive(Clone, Debug)]
struct Bucket {
    /// Units per millisecond (= twice the tokens per second).
    rate: i64,
    burst: i64,
    tokens: i64,
    critical: usize,
    deferred: usize,
    /// Since when (ms) its events wait without a token: since the first
    /// started waiting, or the last got one.
    events_since: Option<u64>,
}

impl Bucket {
    /// Whether its events have waited a whole period of the bucket: then
    /// it lends nothing to other modules' critical requests.
    fn keeps_for_events(&self, now: u64) -> bool {
        self.events_since.is_some_and(|since| (now - since) as i64 * self.rate >= UNIT)
    }
}

fn urgency(critical: bool) -> Urgency {
    if critical { Urgency::Critical } else { Urgency::Deferrable }
}

const UNIT: i64 = 2000;

/// `specs`: (twice the QPS, burst) per account.
fn check(specs: &[(u32, u32)], ops: &[Op]) -> Result<(), TestCaseError> {
    let float: Vec<(f64, u32)> = specs.iter().map(|&(q2, b)| (f64::from(q2) / 2.0, b)).collect();
    let mut state = BudgetState::new(&float, Duration::ZERO);
    let mut model: Vec<Bucket> = specs
        .iter()
        .map(|&(q2, burst)| {
            let burst = i64::from(burst.max(1)) * UNIT;
            Bucket { rate: i64::from(q2), burst, tokens: burst, critical: 0, deferred: 0, events_since: None }
        })
        .collect();
    let mut now = Duration::ZERO;
    // (time, source account) of every granted token.
    let mut grants: Vec<(f64, usize)> = Vec::new();
    // Tokens granted to each account's requests, and to the shared services.
    let mut granted = vec![0u64; model.len()];
    let mut shared_granted = 0u64;
    for op in ops {
        match *op {
            Op::Advance(ms) => {
                let dt = Duration::from_millis(ms);
                now += dt;
                for b in &mut model {
                    b.tokens = (b.tokens + ms as i64 * b.rate).min(b.burst);
                }
            }
            Op::StartWaiting(i, critical) => {
                state.start_waiting(Taker::Account(i), urgency(critical), now);
                let b = &mut model[i];
                if !critical && b.deferred == 0 {
                    b.events_since = Some(now.as_millis() as u64);
                }
                *if critical { &mut b.critical } else { &mut b.deferred } += 1;
            }
            Op::StopWaiting(i, critical) => {
                let freed = state.stop_waiting(Taker::Account(i), urgency(critical));
                let count = if critical { &mut model[i].critical } else { &mut model[i].deferred };
                let was = *count;
                *count = was.saturating_sub(1);
                if !critical && model[i].deferred == 0 {
                    model[i].events_since = None;
                }
                prop_assert_eq!(freed, was == 1, "stop_waiting says when the last waiter of a kind left");
            }
            Op::Take(who, critical) => {
                let taker = who.map_or(Taker::Shared, Taker::Account);
                let ms = now.as_millis() as u64;
                let behind = !critical && who.is_some_and(|own| model[own].critical > 0);
                // The rule written out: own bucket; a critical request
                // borrows from a module without a critical waiter whose
                // events have not waited a whole period, an event (only
                // while no critical request of its module waits) from a
                // module with no waiter at all; the shared services take
                // from any.
                let may = |i: usize| match who {
                    None => true,
                    Some(own) if i == own => true,
                    Some(_) if critical => model[i].critical == 0 && !model[i].keeps_for_events(ms),
                    Some(_) => model[i].critical + model[i].deferred == 0,
                };
                let has = |b: &Bucket| b.tokens >= UNIT;
                let available: Vec<usize> = (0..model.len()).filter(|&i| may(i) && has(&model[i])).collect();
                match state.try_take(taker, urgency(critical), now) {
                    Ok(src) => {
                        prop_assert!(!behind, "an event went before a waiting critical request of its module");
                        if let Some(own) = who.filter(|&own| critical && src != own) {
                            prop_assert!(
                                !model[src].keeps_for_events(ms),
                                "module {}'s events waited a period while module {} borrowed its tokens",
                                src,
                                own
                            );
                        }
                        prop_assert!(available.contains(&src), "took from {} which it may not or which is empty", src);
                        if let Some(own) = who {
                            prop_assert!(src == own || !has(&model[own]), "borrowed while its own bucket had a token");
                        }
                        if let Some(own) = who.filter(|&own| !critical && model[own].deferred > 0) {
                            model[own].events_since = Some(ms);
                        }
                        model[src].tokens -= UNIT;
                        grants.push((now.as_secs_f64(), src));
                        match who {
                            Some(own) => granted[own] += 1,
                            None => shared_granted += 1,
                        }
                    }
                    Err(Wait::CriticalDone) => {
                        prop_assert!(behind, "an event deferred although no critical request of its module waits");
                    }
                    Err(Wait::For(d)) => {
                        prop_assert!(!behind, "an event behind critical requests waits for them");
                        prop_assert!(available.is_empty(), "refused although {:?} had a token", available);
                        prop_assert!(d > Duration::ZERO && d <= Duration::from_secs(2), "wait {:?}", d);
                    }
                }
            }
        }
    }
    let usage = state.usage();
    for (i, b) in model.iter().enumerate() {
        let want = Usage {
            waiting: b.critical + b.deferred,
            deferred: if b.critical > 0 { b.deferred } else { 0 },
            granted: granted[i],
        };
        prop_assert_eq!(usage.accounts[i], want, "usage of account {}", i);
    }
    prop_assert_eq!(usage.shared, Usage { waiting: 0, deferred: 0, granted: shared_granted });
    // Every window, per bucket and in total.
    let qps = |b: &Bucket| b.rate as f64 * 1000.0 / UNIT as f64;
    let burst = |b: &Bucket| (b.burst / UNIT) as f64;
    let total_qps: f64 = model.iter().map(qps).sum();
    let total_burst: f64 = model.iter().map(burst).sum();
    for (i, &(t0, _)) in grants.iter().enumerate() {
        for (j, &(t1, _)) in grants.iter().enumerate().skip(i) {
            let window = &grants[i..=j];
            let n = window.len() as f64;
            prop_assert!(n <= total_burst + total_qps * (t1 - t0) + 1e-6, "{} grants in {}s", n, t1 - t0);
            for (k, b) in model.iter().enumerate() {
                let nk = window.iter().filter(|g| g.1 == k).count() as f64;
                prop_assert!(nk <= burst(b) + qps(b) * (t1 - t0) + 1e-6, "bucket {} gave {} in {}s", k, nk, t1 - t0);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_budget_keeps_its_contract(
        specs in proptest::collection::vec((1u32..20, 1u32..12), 1..4),
        ops in proptest::collection::vec(op(3), 0..160),
    ) {
        let n = specs.len();
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|o| match o {
                Op::Take(a, c) => Op::Take(a.map(|a| a % n), c),
                Op::StartWaiting(a, c) => Op::StartWaiting(a % n, c),
                Op::StopWaiting(a, c) => Op::StopWaiting(a % n, c),
                other => other,
            })
            .collect();
        check(&specs, &ops)?;
    }
}
