//! Property test: random operations on two sibling queues, checked after
//! every step against a model written as plainly as possible (sets and maps,
//! time in milliseconds).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use proptest::prelude::*;
use tokio::time::Instant;

use super::{
    Backoff,
    state::{Group, QueueId, View},
};

type Key = u8;

const QUEUES: usize = 2;
const KEYS: Key = 3;
const START_MS: u64 = 2;
const MAX_MS: u64 = 8;

#[derive(Clone, Debug)]
enum Op {
    Add(QueueId, Key),
    AddAfter(QueueId, Key, u64),
    RateLimited(QueueId, Key),
    Forget(QueueId, Key),
    Take(QueueId),
    Done(QueueId, Key),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let q = 0..QUEUES;
    let k = 0..KEYS;
    prop_oneof![
        1 => (q.clone(), k.clone()).prop_map(|(q, k)| Op::Add(q, k)),
        1 => (q.clone(), k.clone(), 0..6u64).prop_map(|(q, k, d)| Op::AddAfter(q, k, d)),
        1 => (q.clone(), k.clone()).prop_map(|(q, k)| Op::RateLimited(q, k)),
        1 => (q.clone(), k.clone()).prop_map(|(q, k)| Op::Forget(q, k)),
        2 => q.clone().prop_map(Op::Take),
        2 => (q, k).prop_map(|(q, k)| Op::Done(q, k)),
        1 => (0..5u64).prop_map(Op::Advance),
    ]
}

/// One queue of the model.
#[derive(Default)]
struct Lane {
    waiting: BTreeSet<Key>,
    dirty: BTreeSet<Key>,
    /// Due time (ms) of each key's pending delay.
    pending: BTreeMap<Key, u64>,
    failures: BTreeMap<Key, u32>,
}

#[derive(Default)]
struct Model {
    now_ms: u64,
    lanes: [Lane; QUEUES],
    /// Which queue handles a key.
    handling: BTreeMap<Key, QueueId>,
}

impl Model {
    fn add(&mut self, q: QueueId, k: Key) {
        if self.handling.get(&k) == Some(&q) {
            self.lanes[q].dirty.insert(k);
        } else {
            self.lanes[q].waiting.insert(k);
        }
    }

    fn add_after(&mut self, q: QueueId, k: Key, delay_ms: u64) {
        if delay_ms == 0 {
            return self.add(q, k);
        }
        let due = self.now_ms + delay_ms;
        let pending = self.lanes[q].pending.entry(k).or_insert(due);
        *pending = (*pending).min(due);
    }

    fn rate_limited(&mut self, q: QueueId, k: Key) {
        let failures = self.lanes[q].failures.entry(k).or_insert(0);
        *failures += 1;
        let delay = (START_MS << (*failures - 1).min(16)).min(MAX_MS);
        self.add_after(q, k, delay);
    }

    /// Keys of `q` a worker may take: waiting and handled by no queue.
    fn takeable(&self, q: QueueId) -> BTreeSet<Key> {
        self.lanes[q].waiting.iter().copied().filter(|k| !self.handling.contains_key(k)).collect()
    }

    fn take(&mut self, q: QueueId, k: Key) {
        self.lanes[q].waiting.remove(&k);
        self.handling.insert(k, q);
    }

    fn done(&mut self, q: QueueId, k: Key) {
        if self.handling.get(&k) != Some(&q) {
            return;
        }
        self.handling.remove(&k);
        if self.lanes[q].dirty.remove(&k) {
            self.lanes[q].waiting.insert(k);
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        for q in 0..QUEUES {
            let due: Vec<Key> =
                self.lanes[q].pending.iter().filter(|&(_, &at)| at <= self.now_ms).map(|(&k, _)| k).collect();
            for k in due {
                self.lanes[q].pending.remove(&k);
                self.add(q, k);
            }
        }
    }

    fn view(&self, q: QueueId, base: Instant) -> View<Key> {
        let lane = &self.lanes[q];
        View {
            waiting: lane.waiting.clone(),
            dirty: lane.dirty.clone(),
            handling: self.handling.iter().filter(|&(_, &o)| o == q).map(|(&k, _)| k).collect(),
            pending: lane.pending.iter().map(|(&k, &at)| (k, base + Duration::from_millis(at))).collect(),
        }
    }
}

/// Applies `op` to both; checks what the group answered on the way.
fn step(group: &mut Group<Key>, model: &mut Model, base: Instant, op: &Op) -> Result<(), TestCaseError> {
    let now = base + Duration::from_millis(model.now_ms);
    match *op {
        Op::Add(q, k) => {
            group.add(q, k, now);
            model.add(q, k);
        }
        Op::AddAfter(q, k, d) => {
            group.add_after(q, k, now, Duration::from_millis(d));
            model.add_after(q, k, d);
        }
        Op::RateLimited(q, k) => {
            group.add_rate_limited(q, k, now);
            model.rate_limited(q, k);
        }
        Op::Forget(q, k) => {
            group.forget(q, &k);
            model.lanes[q].failures.remove(&k);
        }
        Op::Take(q) => {
            let takeable = model.takeable(q);
            match group.take(q, now) {
                Some((k, _)) => {
                    prop_assert!(takeable.contains(&k), "queue {q} handed out {k}; takeable: {takeable:?}");
                    model.take(q, k);
                }
                None => prop_assert!(takeable.is_empty(), "queue {q} handed out nothing; takeable: {takeable:?}"),
            }
        }
        Op::Done(q, k) => {
            group.done(q, &k);
            model.done(q, k);
        }
        Op::Advance(ms) => {
            model.advance(ms);
            let now = base + Duration::from_millis(model.now_ms);
            for q in 0..QUEUES {
                group.promote_due(q, now);
            }
        }
    }
    Ok(())
}

/// After every step: the structure is sound and every queue looks like the
/// model's (waiting keys, re-added keys, handled keys, earliest due times,
/// failure counts).
fn compare(group: &Group<Key>, model: &Model, base: Instant) -> Result<(), TestCaseError> {
    group.check().map_err(TestCaseError::fail)?;
    for q in 0..QUEUES {
        prop_assert_eq!(group.view(q), model.view(q, base), "queue {}", q);
        prop_assert_eq!(group.len(q), model.lanes[q].waiting.len());
        for k in 0..KEYS {
            prop_assert_eq!(group.failures(q, &k), model.lanes[q].failures.get(&k).copied().unwrap_or(0));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn sibling_queues_behave_like_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let backoff = Backoff { start: Duration::from_millis(START_MS), max: Duration::from_millis(MAX_MS) };
        let base = Instant::now();
        let mut group = Group::new();
        for _ in 0..QUEUES {
            group.new_queue(backoff);
        }
        let mut model = Model::default();
        for op in &ops {
            step(&mut group, &mut model, base, op)?;
            compare(&group, &model, base)?;
        }
    }
}

/// A failure after `forget` waits the start delay again, not the grown one.
#[test]
fn forget_resets_the_next_failure_delay_to_the_start() {
    let backoff = Backoff { start: Duration::from_millis(START_MS), max: Duration::from_millis(MAX_MS) };
    let now = Instant::now();
    let mut group = Group::new();
    let q = group.new_queue(backoff);
    group.add_rate_limited(q, 1, now);
    group.promote_due(q, now + backoff.max);
    group.add_rate_limited(q, 1, now + backoff.max);
    assert_eq!(group.pending_due(q, &1), Some(now + backoff.max + backoff.start * 2));
    group.promote_due(q, now + backoff.max * 2);
    group.forget(q, &1);
    group.add_rate_limited(q, 1, now + backoff.max * 2);
    assert_eq!(group.pending_due(q, &1), Some(now + backoff.max * 2 + backoff.start));
}
