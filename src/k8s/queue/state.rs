//! The state of a group of sibling queues, without I/O: no metrics, no
//! wake-ups, no clock. Every operation that needs the time is given it, so
//! tests and the model check drive it with a synthetic clock; the caller
//! (`WorkQueue`) turns the returned facts into metrics and notifications.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    hash::Hash,
    time::Duration,
};

use tokio::time::Instant;

use super::Backoff;

/// Index of one queue in its group.
pub(super) type QueueId = usize;

/// What `add` did with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Added {
    /// Already waiting (or already due again after the current handling).
    Ignored,
    /// This queue is handling it: it waits again when that is done.
    Dirty,
    /// Ready for one of this queue's workers.
    Ready,
    /// Waiting until the sibling that handles it is done.
    Parked,
}

impl Added {
    /// Whether the key counts as added (`workqueue_adds_total`).
    pub(super) fn counts(self) -> bool {
        self != Added::Ignored
    }
}

/// What `add_after` did with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scheduled {
    /// No delay: added at once.
    Now(Added),
    /// Pending; `earlier` when this moved the key's due time forward (the
    /// timer may have to wake sooner).
    Later { earlier: bool },
}

/// One queue's keys.
struct Lane<K> {
    backoff: Backoff,
    /// Keys a worker may take, in order.
    ready: VecDeque<K>,
    /// Keys waiting (ready or parked), with the time they were added.
    waiting: HashMap<K, Instant>,
    /// Waiting keys a sibling handles: made ready when the sibling is done.
    parked: HashSet<K>,
    /// Keys added while this queue handles them: waiting again when done.
    dirty: HashMap<K, Instant>,
    /// Consecutive failures per key.
    failures: HashMap<K, u32>,
    /// The one pending delay per key: due time and a tie-breaker.
    pending: HashMap<K, (Instant, u64)>,
    /// The same delays ordered by due time.
    timeline: BTreeMap<(Instant, u64), K>,
}

impl<K> Lane<K> {
    fn new(backoff: Backoff) -> Self {
        Lane {
            backoff,
            ready: VecDeque::new(),
            waiting: HashMap::new(),
            parked: HashSet::new(),
            dirty: HashMap::new(),
            failures: HashMap::new(),
            pending: HashMap::new(),
            timeline: BTreeMap::new(),
        }
    }
}

/// Sibling queues sharing per-key exclusion: a key is handled by at most one
/// worker of the whole group at a time.
pub(super) struct Group<K> {
    lanes: Vec<Lane<K>>,
    /// Keys being handled, and by which queue.
    active: HashMap<K, QueueId>,
    seq: u64,
}

impl<K: Clone + Eq + Hash> Group<K> {
    /// A group with no queues yet.
    pub(super) fn new() -> Self {
        Group { lanes: Vec::new(), active: HashMap::new(), seq: 0 }
    }

    /// Adds a queue to the group.
    pub(super) fn new_queue(&mut self, backoff: Backoff) -> QueueId {
        self.lanes.push(Lane::new(backoff));
        self.lanes.len() - 1
    }

    /// The backoff of queue `q`.
    pub(super) fn backoff(&self, q: QueueId) -> Backoff {
        self.lanes[q].backoff
    }

    /// Queues `key` in `q` now.
    pub(super) fn add(&mut self, q: QueueId, key: K, now: Instant) -> Added {
        let lane = &mut self.lanes[q];
        if lane.waiting.contains_key(&key) || lane.dirty.contains_key(&key) {
            return Added::Ignored;
        }
        match self.active.get(&key) {
            Some(&owner) if owner == q => {
                lane.dirty.insert(key, now);
                Added::Dirty
            }
            Some(_) => {
                lane.waiting.insert(key.clone(), now);
                lane.parked.insert(key);
                Added::Parked
            }
            None => {
                lane.waiting.insert(key.clone(), now);
                lane.ready.push_back(key);
                Added::Ready
            }
        }
    }

    /// Queues `key` in `q` after `delay`, unless it is already due earlier.
    pub(super) fn add_after(&mut self, q: QueueId, key: K, now: Instant, delay: Duration) -> Scheduled {
        if delay.is_zero() {
            return Scheduled::Now(self.add(q, key, now));
        }
        let due = now + delay;
        let lane = &mut self.lanes[q];
        if let Some(&(when, seq)) = lane.pending.get(&key) {
            if when <= due {
                return Scheduled::Later { earlier: false };
            }
            lane.timeline.remove(&(when, seq));
        }
        self.seq += 1;
        lane.pending.insert(key.clone(), (due, self.seq));
        lane.timeline.insert((due, self.seq), key);
        Scheduled::Later { earlier: true }
    }

    /// Counts a failure of `key` in `q` and queues it after its backoff.
    pub(super) fn add_rate_limited(&mut self, q: QueueId, key: K, now: Instant) -> Scheduled {
        let lane = &mut self.lanes[q];
        let failures = lane.failures.entry(key.clone()).or_insert(0);
        *failures = failures.saturating_add(1);
        let delay = lane.backoff.delay(*failures);
        self.add_after(q, key, now, delay)
    }

    /// Resets `key`'s backoff in `q`.
    pub(super) fn forget(&mut self, q: QueueId, key: &K) {
        self.lanes[q].failures.remove(key);
    }

    /// Consecutive failures of `key` in `q`.
    pub(super) fn failures(&self, q: QueueId, key: &K) -> u32 {
        self.lanes[q].failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting in `q` (ready or parked; not delayed or being handled).
    pub(super) fn len(&self, q: QueueId) -> usize {
        self.lanes[q].waiting.len()
    }

    /// When the longest-waiting key of `q` was added (approximately: the
    /// first ready key and every parked one are looked at).
    pub(super) fn oldest(&self, q: QueueId) -> Option<Instant> {
        let lane = &self.lanes[q];
        let first = lane.ready.front().into_iter();
        first.chain(lane.parked.iter()).filter_map(|k| lane.waiting.get(k)).min().copied()
    }

    /// Hands a key of `q` to a worker, with the time it was added. Keys a
    /// sibling handles are parked on the way, so they block no other key.
    pub(super) fn take(&mut self, q: QueueId, now: Instant) -> Option<(K, Instant)> {
        let lane = &mut self.lanes[q];
        while let Some(key) = lane.ready.pop_front() {
            if self.active.contains_key(&key) {
                lane.parked.insert(key);
                continue;
            }
            let added = lane.waiting.remove(&key).unwrap_or(now);
            self.active.insert(key.clone(), q);
            return Some((key, added));
        }
        None
    }

    /// Ends `q`'s handling of `key`: a key re-added meanwhile waits again and
    /// siblings' parked copies become ready. Returns the queues with new
    /// ready keys. A key `q` does not handle is left alone.
    pub(super) fn done(&mut self, q: QueueId, key: &K) -> Vec<QueueId> {
        if self.active.get(key) != Some(&q) {
            return Vec::new();
        }
        self.active.remove(key);
        let mut woken = Vec::new();
        for (id, lane) in self.lanes.iter_mut().enumerate() {
            if id == q {
                if let Some(added) = lane.dirty.remove(key) {
                    lane.waiting.insert(key.clone(), added);
                    lane.ready.push_back(key.clone());
                    woken.push(id);
                }
            } else if lane.parked.remove(key) {
                // It was at the head of the line when it was parked.
                lane.ready.push_front(key.clone());
                woken.push(id);
            }
        }
        woken
    }

    /// Adds `q`'s keys due by `now`; returns what each add did and when the
    /// next pending key is due.
    pub(super) fn promote_due(&mut self, q: QueueId, now: Instant) -> (Vec<Added>, Option<Instant>) {
        let mut added = Vec::new();
        while let Some(key) = self.pop_due(q, now) {
            added.push(self.add(q, key, now));
        }
        (added, self.next_due(q))
    }

    fn pop_due(&mut self, q: QueueId, now: Instant) -> Option<K> {
        let lane = &mut self.lanes[q];
        let (&(when, _), _) = lane.timeline.first_key_value()?;
        if when > now {
            return None;
        }
        let (_, key) = lane.timeline.pop_first()?;
        lane.pending.remove(&key);
        Some(key)
    }

    /// When `q`'s next pending key is due.
    pub(super) fn next_due(&self, q: QueueId) -> Option<Instant> {
        self.lanes[q].timeline.first_key_value().map(|(&(when, _), _)| when)
    }

    /// When `key`'s pending delay in `q` is due.
    pub(super) fn pending_due(&self, q: QueueId, key: &K) -> Option<Instant> {
        self.lanes[q].pending.get(key).map(|&(when, _)| when)
    }
}

/// What tests see of one queue.
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub(super) struct View<K: Ord> {
    pub waiting: std::collections::BTreeSet<K>,
    pub dirty: std::collections::BTreeSet<K>,
    pub handling: std::collections::BTreeSet<K>,
    pub pending: BTreeMap<K, Instant>,
}

#[cfg(test)]
impl<K: Clone + Eq + Hash + Ord + std::fmt::Debug> Group<K> {
    /// Queue `q`'s keys.
    pub(super) fn view(&self, q: QueueId) -> View<K> {
        let lane = &self.lanes[q];
        View {
            waiting: lane.waiting.keys().cloned().collect(),
            dirty: lane.dirty.keys().cloned().collect(),
            handling: self.active.iter().filter(|&(_, &o)| o == q).map(|(k, _)| k.clone()).collect(),
            pending: lane.pending.iter().map(|(k, &(when, _))| (k.clone(), when)).collect(),
        }
    }

    /// The structure's own invariants; the first broken one.
    pub(super) fn check(&self) -> Result<(), String> {
        for (q, lane) in self.lanes.iter().enumerate() {
            let ready: HashSet<&K> = lane.ready.iter().collect();
            if ready.len() != lane.ready.len() {
                return Err(format!("queue {q}: a key is ready twice: {:?}", lane.ready));
            }
            if ready.len() + lane.parked.len() != lane.waiting.len()
                || !lane.waiting.keys().all(|k| ready.contains(k) != lane.parked.contains(k))
            {
                return Err(format!("queue {q}: waiting keys are not exactly the ready plus the parked ones"));
            }
            if let Some(k) = lane.parked.iter().find(|k| self.active.get(*k).is_none_or(|&o| o == q)) {
                return Err(format!("queue {q}: {k:?} is parked but no sibling handles it"));
            }
            if let Some(k) =
                lane.dirty.keys().find(|k| self.active.get(*k) != Some(&q) || lane.waiting.contains_key(*k))
            {
                return Err(format!("queue {q}: {k:?} is dirty but not handled here, or also waiting"));
            }
            if lane.pending.len() != lane.timeline.len()
                || !lane.pending.iter().all(|(k, at)| lane.timeline.get(at) == Some(k))
            {
                return Err(format!("queue {q}: pending delays and their timeline disagree"));
            }
        }
        Ok(())
    }
}
