//! What each module holds that is not done, and why: the state behind
//! `/debug/objects`, `csi-sidecar explain` and the waiting-object gauges.
//!
//! Each module has one [`Ledger`] from the process's [`Registry`]. A work
//! queue tracked with [`crate::k8s::queue::WorkQueue::tracked`] runs every
//! sync inside a [`SyncScope`]; the code of that sync says what the object
//! waits for ([`waiting_for`], the value its pure decision code returned),
//! the event recorder files the text of a Warning event ([`failed`]) and
//! the driver connection the CSI call in flight ([`csi_call`]). When the
//! sync ends the queue files the outcome: done without a reason removes the
//! entry; otherwise it keeps the reason, the attempts and the next retry.
//!
//! Nothing here reads a secret: the texts are the events' texts, which are
//! public already.

mod gauges;
pub mod query;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use gauges::names;

/// What a not-done object waits for: a closed set, returned by the
/// modules' decision code (never parsed from log text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    /// An attempt failed; the next one comes after the backoff.
    Retry,
    /// `WaitForFirstConsumer`: no pod using the claim has been scheduled.
    Scheduler,
    /// The CSI driver: a call failed or is in flight.
    Driver,
    /// The driver called the request infeasible; it is retried slowly
    /// unless the class changes.
    Infeasible,
    /// The StorageClass (or snapshot class) named does not exist.
    Class,
    /// A secret the class names is missing or unreadable.
    Secret,
    /// The data source (clone source, snapshot) is missing or unusable.
    DataSource,
    /// The claim's `dataSourceRef` names a kind of an external volume
    /// populator: it provisions the volume, this module leaves it be.
    Populator,
    /// The source snapshot is not ready to use yet.
    SnapshotReady,
    /// The node: its CSINode, its driver's node ID, or the node itself.
    Node,
    /// The claim's accessibility requirements cannot be built yet.
    Topology,
    /// The volume is in use and the driver cannot expand it online.
    VolumeInUse,
    /// A write to (or read from) the apiserver failed.
    ApiServer,
    /// Another object (the PV, the content, a finalizer holder) must change
    /// first.
    Dependent,
}

impl WaitingFor {
    /// Every value, for tables and gauges.
    pub const ALL: [WaitingFor; 14] = [
        WaitingFor::Retry,
        WaitingFor::Scheduler,
        WaitingFor::Driver,
        WaitingFor::Infeasible,
        WaitingFor::Class,
        WaitingFor::Secret,
        WaitingFor::DataSource,
        WaitingFor::Populator,
        WaitingFor::SnapshotReady,
        WaitingFor::Node,
        WaitingFor::Topology,
        WaitingFor::VolumeInUse,
        WaitingFor::ApiServer,
        WaitingFor::Dependent,
    ];

    /// The snake_case name used in JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingFor::Retry => "retry",
            WaitingFor::Scheduler => "scheduler",
            WaitingFor::Driver => "driver",
            WaitingFor::Infeasible => "infeasible",
            WaitingFor::Class => "class",
            WaitingFor::Secret => "secret",
            WaitingFor::DataSource => "data_source",
            WaitingFor::Populator => "populator",
            WaitingFor::SnapshotReady => "snapshot_ready",
            WaitingFor::Node => "node",
            WaitingFor::Topology => "topology",
            WaitingFor::VolumeInUse => "volume_in_use",
            WaitingFor::ApiServer => "api_server",
            WaitingFor::Dependent => "dependent",
        }
    }
}

/// One object a module holds that is not done.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The queue that syncs it (upstream's queue name).
    pub queue: &'static str,
    /// What it waits for.
    pub waiting_for: WaitingFor,
    /// Consecutive failed attempts (the queue's backoff count).
    pub attempts: u32,
    /// The text of the last Warning event about it, or of the last error
    /// written into its status (the last error).
    pub last_error: Option<String>,
    /// When the queue hands it to a worker again, if it will by itself.
    pub next_retry: Option<SystemTime>,
    /// The CSI call in flight for it, and since when.
    pub csi_call: Option<(&'static str, SystemTime)>,
    /// Since when it has not been done.
    pub since: SystemTime,
    /// The same, on the monotonic clock (for the longest-wait gauge).
    since_mono: Instant,
}

/// The key of an entry: the API kind and the queue's key
/// (`namespace/name` or `name`).
pub type EntryKey = (&'static str, String);

/// Where an entry is filed: its object and the queue that synced it. Two
/// queues of a module may sync one object with different decisions (the
/// resizer's resize and modify queues): each files its own entry, so one
/// queue's "done" does not erase what the other still waits for.
type Slot = (EntryKey, &'static str);

/// Who leads for a module, as its elector last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderView {
    /// The Lease, `namespace/name`.
    pub lease: String,
    /// Whether this process holds it.
    pub leading: bool,
    /// The holder this process last observed (`None`: unknown or nobody).
    pub holder: Option<String>,
}

/// Where a module is in its start-up (ordered: later phases are greater).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Starting: waiting for the CSI driver, checking what the apiserver
    /// serves.
    #[default]
    Starting,
    /// Waiting to lead (its Lease is held elsewhere, or not won yet).
    Standby,
    /// Leading (or without election), filling its caches from the API.
    SyncingCache,
    /// Its workers run.
    Running,
}

/// A source of the module's current [`LeaderView`].
pub type LeaderSource = Arc<dyn Fn() -> LeaderView + Send + Sync>;

/// One module's not-done objects. Cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<LedgerInner>,
}

struct LedgerInner {
    module: &'static str,
    entries: Mutex<BTreeMap<Slot, Entry>>,
    leader: Mutex<Option<LeaderSource>>,
    phase: Mutex<Phase>,
}

impl Ledger {
    fn new(module: &'static str) -> Self {
        Ledger {
            inner: Arc::new(LedgerInner {
                module,
                entries: Mutex::new(BTreeMap::new()),
                leader: Mutex::new(None),
                phase: Mutex::new(Phase::Starting),
            }),
        }
    }

    /// The module's name.
    pub fn module(&self) -> &'static str {
        self.inner.module
    }

    /// Where the module's leadership is read from (set once it campaigns).
    pub fn set_leader(&self, source: LeaderSource) {
        *self.inner.leader.lock() = Some(source);
    }

    /// Records where the module is in its start-up.
    pub fn set_phase(&self, phase: Phase) {
        *self.inner.phase.lock() = phase;
    }

    /// Where the module is in its start-up.
    pub fn phase(&self) -> Phase {
        *self.inner.phase.lock()
    }

    /// The module's leadership now (`None`: it runs without election).
    pub fn leader(&self) -> Option<LeaderView> {
        let source = self.inner.leader.lock().clone();
        source.map(|s| s())
    }

    /// A copy of the entries (for the endpoint and gauges), ordered by
    /// kind, key and queue (an object synced by two queues has two).
    pub fn entries(&self) -> Vec<(EntryKey, Entry)> {
        self.inner.entries.lock().iter().map(|((k, _), v)| (k.clone(), v.clone())).collect()
    }

    /// Calls `f` on each entry under the lock (no copy), in the order of
    /// [`entries`](Self::entries).
    pub fn for_each(&self, mut f: impl FnMut(&EntryKey, &Entry)) {
        for ((k, _), v) in self.inner.entries.lock().iter() {
            f(k, v);
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.inner.entries.lock().len()
    }

    /// Whether the module holds nothing that is not done.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry of `key` as `queue` files it, created if absent.
    fn with_entry<R>(&self, key: &EntryKey, queue: &'static str, f: impl FnOnce(&mut Entry) -> R) -> R {
        f(self.inner.entries.lock().entry((key.clone(), queue)).or_insert_with(|| Entry::new(queue)))
    }

    /// Forgets `key` as `queue` filed it.
    pub fn remove_in(&self, key: &EntryKey, queue: &'static str) {
        self.inner.entries.lock().remove(&(key.clone(), queue));
    }

    /// Forgets `key` in every queue (the object is gone).
    pub fn remove(&self, key: &EntryKey) {
        let mut entries = self.inner.entries.lock();
        let slots: Vec<Slot> =
            entries.range((key.clone(), "")..).take_while(|((k, _), _)| k == key).map(|(s, _)| s.clone()).collect();
        for slot in slots {
            entries.remove(&slot);
        }
    }

    /// Starts a sync of `key` from `queue`.
    pub fn scope(&self, queue: &'static str, kind: &'static str, key: String) -> SyncScope {
        SyncScope(Arc::new(ScopeInner {
            ledger: self.clone(),
            queue,
            key: (kind, key),
            notes: Mutex::new(Notes::default()),
        }))
    }
}

/// A source of the driver's name (`None` until discovered).
pub type DriverSource = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The process's ledgers, one per module. Cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    ledgers: Arc<Mutex<Vec<Ledger>>>,
    driver: Arc<Mutex<Option<DriverSource>>>,
}

impl Registry {
    /// Where the driver's name is read from (the driver connection).
    pub fn set_driver_source(&self, source: DriverSource) {
        *self.driver.lock() = Some(source);
    }

    /// The driver's name, once discovered.
    pub fn driver(&self) -> Option<String> {
        let source = self.driver.lock().clone();
        source.and_then(|s| s())
    }

    /// The ledger of `module` (the same one on every call).
    pub fn ledger(&self, module: &'static str) -> Ledger {
        let mut ledgers = self.ledgers.lock();
        if let Some(l) = ledgers.iter().find(|l| l.module() == module) {
            return l.clone();
        }
        let l = Ledger::new(module);
        ledgers.push(l.clone());
        l
    }

    /// Every module's ledger, in the order they were asked for.
    pub fn ledgers(&self) -> Vec<Ledger> {
        self.ledgers.lock().clone()
    }

    /// Serves the waiting-object gauges of every ledger (once per process).
    pub fn export_gauges(&self) {
        gauges::export(self.clone());
    }
}

/// What one sync said about its object.
#[derive(Default)]
struct Notes {
    waiting_for: Option<WaitingFor>,
    last_error: Option<String>,
}

struct ScopeInner {
    ledger: Ledger,
    queue: &'static str,
    key: EntryKey,
    notes: Mutex<Notes>,
}

/// One sync of one object, current for the task running it.
#[derive(Clone)]
pub struct SyncScope(Arc<ScopeInner>);

/// How the queue finished a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Done: the key's backoff is reset.
    Done,
    /// Queued again after `delay`, with `attempts` consecutive failures.
    Again {
        /// Until the next attempt.
        delay: Duration,
        /// The backoff count.
        attempts: u32,
    },
}

/// What to do with an entry after a sync (pure): `None` removes it.
pub fn after_sync(
    previous: Option<&Entry>,
    waiting: Option<WaitingFor>,
    error: Option<String>,
    finish: Finish,
) -> Option<(WaitingFor, u32, Option<String>, Option<Duration>)> {
    match (finish, waiting) {
        (Finish::Done, None) => None,
        (Finish::Done, Some(w)) => Some((w, 0, error, None)),
        (Finish::Again { delay, attempts }, w) => {
            let last = error.or_else(|| previous.and_then(|p| p.last_error.clone()));
            let w = w.or(previous.map(|p| p.waiting_for)).unwrap_or(WaitingFor::Retry);
            Some((w, attempts, last, Some(delay)))
        }
    }
}

impl SyncScope {
    /// Runs `f` with this scope current.
    pub async fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        self.clone().run_owned(f).await
    }

    /// Runs `f` with this scope current (a `'static` future, for spawning).
    pub async fn run_owned<F: std::future::Future>(self, f: F) -> F::Output {
        CURRENT.scope(self, f).await
    }

    /// Files the outcome of the sync.
    pub fn finish(&self, finish: Finish) {
        let s = &self.0;
        let (waiting, error) = {
            let mut n = s.notes.lock();
            (n.waiting_for.take(), n.last_error.take())
        };
        let slot = (s.key.clone(), s.queue);
        // One critical section: a CSI call guard of another sync cannot
        // slip between the decision and the write.
        let mut entries = s.ledger.inner.entries.lock();
        match after_sync(entries.get(&slot), waiting, error, finish) {
            None => {
                entries.remove(&slot);
            }
            Some((waiting_for, attempts, last_error, delay)) => {
                let e = entries.entry(slot).or_insert_with(|| Entry::new(s.queue));
                e.waiting_for = waiting_for;
                e.attempts = attempts;
                e.last_error = last_error;
                e.next_retry = delay.map(|d| SystemTime::now() + d);
            }
        }
    }
}

tokio::task_local! {
    static CURRENT: SyncScope;
}

/// Says what the object of the current sync waits for (no-op outside a
/// tracked sync). The last call of a sync wins.
pub fn waiting_for(w: WaitingFor) {
    let _ = CURRENT.try_with(|s| s.0.notes.lock().waiting_for = Some(w));
}

/// Files `text` (a Warning event's message, or the error a module without
/// events writes into the object's status) as the current sync's error.
pub fn failed(text: &str) {
    let _ = CURRENT.try_with(|s| s.0.notes.lock().last_error = Some(text.to_string()));
}

/// A CSI call in flight for the current sync's object, until dropped.
pub struct CallGuard(Option<SyncScope>);

/// Marks `method` in flight for the current sync's object (no-op outside a
/// tracked sync).
pub fn csi_call(method: &'static str) -> CallGuard {
    let scope = CURRENT.try_with(Clone::clone).ok();
    if let Some(s) = &scope {
        s.0.ledger.with_entry(&s.0.key, s.0.queue, |e| {
            e.csi_call = Some((method, SystemTime::now()));
            e.waiting_for = WaitingFor::Driver;
        });
    }
    CallGuard(scope)
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            let mut entries = s.0.ledger.inner.entries.lock();
            if let Some(e) = entries.get_mut(&(s.0.key.clone(), s.0.queue)) {
                e.csi_call = None;
            }
        }
    }
}

impl Entry {
    /// A new entry of `queue`: not done since now, no reason noted yet.
    fn new(queue: &'static str) -> Self {
        Entry {
            queue,
            waiting_for: WaitingFor::Retry,
            attempts: 0,
            last_error: None,
            next_retry: None,
            csi_call: None,
            since: SystemTime::now(),
            since_mono: Instant::now(),
        }
    }

    /// How long the object has not been done, at `now`.
    pub fn waited(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since_mono)
    }
}
