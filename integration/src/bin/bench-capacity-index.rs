//! In-process benchmark of storage capacity tracking's bookkeeping (no
//! cluster, no driver): one poll over `--segments` × `--classes`
//! CSIStorageCapacity objects (each desired item with its object), as the
//! counter test `a_poll_over_3000_objects_costs_work_linear_in_the_objects`
//! drives it: a reconciliation at the start of the poll, then per item the
//! desired check, the lookup of the object kept for it and the watch event
//! of its rewritten object. Measured per poll: wall time (the median of
//! `--before-runs` and of `--runs` polls) and heap allocations (count and
//! bytes, from a counting allocator around the system's), BEFORE (every
//! lookup, delete check and own write's reconciliation a scan of every
//! cached object, the desired set cloned per item: the controller before
//! the index, kept below in [`baseline`] as it was) and AFTER
//! (`capacity::index::Tracker`, the index kept per watch event).
//! GetCapacity, the API writes, the shared cache's own apply and the
//! desired set's computation from the cluster are left out of both.
//!
//! ```text
//! cargo run --release -p csi-sidecar-integration --bin bench-capacity-index
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use argh::FromArgs;
use csi_sidecar::modules::provisioner::capacity::{
    decide::Item,
    index::{Plan, Tracker},
};
use k8s_openapi::{
    api::storage::v1::CSIStorageCapacity,
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time},
};

#[global_allocator]
static HEAP: counting::Counting = counting::Counting;

/// csi-sidecar capacity tracking benchmark: one poll (in-process).
#[derive(FromArgs)]
struct Args {
    /// topology segments (default 100)
    #[argh(option, default = "100")]
    segments: usize,
    /// storage classes (default 30)
    #[argh(option, default = "30")]
    classes: usize,
    /// polls after; the table shows the median time (default 5)
    #[argh(option, default = "5")]
    runs: usize,
    /// polls before, each about 100 s at the defaults (default 3)
    #[argh(option, default = "3")]
    before_runs: usize,
}

/// A counting allocator: every call passed on to [`System`] unchanged, the
/// allocations and the bytes they asked for added up (a `realloc` counts
/// as one allocation of its new size).
///
/// [`System`]: std::alloc::System
mod counting {
    use std::{
        alloc::{GlobalAlloc, Layout, System},
        sync::atomic::{AtomicU64, Ordering::Relaxed},
    };

    static COUNT: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);

    /// The global allocator of this binary.
    pub struct Counting;

    fn count(size: usize) {
        COUNT.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
    }

    // SAFETY: each method passes its arguments to `System`'s, whose contract
    // is the same; the counting touches atomics only (no allocation).
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            // SAFETY: the caller's guarantees for `alloc`, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            // SAFETY: as `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator, that is from `System`.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size);
            // SAFETY: as `dealloc`, and the caller's guarantees for `new_size`.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    /// (allocations, bytes) so far.
    pub fn totals() -> (u64, u64) {
        (COUNT.load(Relaxed), BYTES.load(Relaxed))
    }
}

/// The capacity controller's bookkeeping before the index (the BASELINE of
/// this benchmark, not used anywhere else), from `capacity/mod.rs` before
/// commit a47fe3c: the desired set behind a lock, cloned by every reader;
/// the objects read as the shared cache's `state()` (every object's `Arc`
/// in a new `Vec`) and regrouped by item (`decide::by_item`) per lookup;
/// the delete check `decide::to_delete` over every object; and each watch
/// event of an object queueing a full reconciliation (`reconcile`: the
/// objects by item, `to_delete`, `counts`). The process's own writes not
/// yet in the cache (`written`) are empty here, as when each write's event
/// has come back; `compute_desired` is given its result (the same set).
mod baseline {
    use std::{
        collections::{BTreeSet, HashMap},
        hint::black_box,
        sync::Arc,
    };

    use csi_sidecar::modules::provisioner::capacity::{
        decide::{self, Item},
        index::Plan,
    };
    use k8s_openapi::api::storage::v1::CSIStorageCapacity;

    /// The desired items and the store of the objects.
    #[derive(Default)]
    pub struct Controller {
        desired: BTreeSet<Item>,
        /// Stands for the shared cache's store of the objects (name → the
        /// cached object).
        objects: HashMap<String, Arc<CSIStorageCapacity>>,
        /// Items written by this process and not yet seen in the cache.
        written: HashMap<Item, Arc<CSIStorageCapacity>>,
    }

    impl Controller {
        /// `Cache::state`: every object's `Arc`, in a new `Vec`.
        fn state(&self) -> Vec<Arc<CSIStorageCapacity>> {
            self.objects.values().cloned().collect()
        }

        /// `Handle::desired`: the set, cloned.
        pub fn desired(&self) -> BTreeSet<Item> {
            self.desired.clone()
        }

        /// `reconcile`, with `desired` as `compute_desired`'s answer; what
        /// it queued, as a [`Plan`] (the gauges computed and dropped).
        pub fn reconcile(&mut self, desired: BTreeSet<Item>) -> Plan {
            let objects = self.state();
            let have = decide::by_item(objects.iter().map(|o| &**o));
            let written = self.written.clone();
            let previous = std::mem::replace(&mut self.desired, desired.clone());
            let mut queue = Vec::new();
            for i in &desired {
                if !previous.contains(i) || (!have.contains_key(i) && !written.contains_key(i)) {
                    queue.push(i.clone());
                }
            }
            let delete = decide::to_delete(objects.iter().map(|o| &**o), &desired);
            let (goal, current, obsolete) = decide::counts(objects.iter().map(|o| &**o), &desired);
            let current =
                current.max(desired.iter().filter(|i| have.contains_key(*i) || written.contains_key(*i)).count());
            black_box((goal, current, obsolete));
            Plan { queue, delete }
        }

        /// `sync_item`'s first check.
        pub fn is_desired(&self, item: &Item) -> bool {
            self.desired().contains(item)
        }

        /// `current`: the object kept for `item` (the oldest), by name.
        pub fn keep(&self, item: &Item) -> Option<String> {
            if let Some(w) = self.written.get(item) {
                return w.metadata.name.clone();
            }
            let objects = self.state();
            let by = decide::by_item(objects.iter().map(|o| &**o));
            let name = by.get(item).and_then(|l| l.first()).and_then(|o| o.metadata.name.clone())?;
            objects
                .into_iter()
                .find(|o| o.metadata.name.as_deref() == Some(&name))
                .and_then(|o| o.metadata.name.clone())
        }

        /// `sync_delete`'s check: whether the object `name` with `uid` is
        /// still obsolete or a duplicate.
        pub fn should_delete(&self, name: &str, uid: &str) -> bool {
            let objects = self.state();
            let desired = self.desired();
            decide::to_delete(objects.iter().map(|o| &**o), &desired).contains(&(name.to_string(), uid.to_string()))
        }

        /// The cache stores an object of a watch event (nothing else: before
        /// the first reconciliation).
        pub fn store(&mut self, obj: Arc<CSIStorageCapacity>) {
            self.objects.insert(obj.metadata.name.clone().unwrap_or_default(), obj);
        }

        /// A watch event of an object: stored, and the handler's queued
        /// reconciliation (`compute_desired` giving the same set).
        pub fn event(&mut self, obj: Arc<CSIStorageCapacity>) -> Plan {
            self.store(obj);
            let desired = self.desired();
            self.reconcile(desired)
        }
    }
}

fn item(segment: usize, class: &str) -> Item {
    Item { segment: BTreeMap::from([("zone".to_string(), format!("z{segment}"))]), class: class.to_string() }
}

fn name(n: usize) -> String {
    format!("csisc-{n}")
}

/// A CSIStorageCapacity of `item` (none: without a node topology), as the
/// counter test builds it.
fn object(name: &str, item: Option<&Item>, created: i64, rv: usize) -> Arc<CSIStorageCapacity> {
    let created = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created).expect("a valid time");
    Arc::new(CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.to_string()),
            creation_timestamp: Some(Time(created)),
            ..Default::default()
        },
        storage_class_name: item.map(|i| i.class.clone()).unwrap_or_else(|| "c0".into()),
        node_topology: item.map(|i| LabelSelector { match_labels: Some(i.segment.clone()), match_expressions: None }),
        capacity: None,
        maximum_volume_size: None,
    })
}

fn sorted(mut p: Plan) -> Plan {
    p.queue.sort();
    p.delete.sort();
    p
}

/// Before and after give the same answers on the scenario with a few
/// objects to delete added: a newer duplicate of every hundredth item, an
/// object of a class no longer desired per segment, one without a node
/// topology. The first reconciliation queues and deletes the same; then,
/// over a poll, each item's desired check and kept object, and each
/// object's delete check, agree.
fn check_agreement(items: &[Item], desired: &BTreeSet<Item>, segments: usize) {
    let mut objects: Vec<Arc<CSIStorageCapacity>> =
        items.iter().enumerate().map(|(n, i)| object(&name(n), Some(i), 1, n)).collect();
    let rv = objects.len();
    objects.extend(items.iter().enumerate().step_by(100).map(|(n, i)| object(&format!("dup-{n}"), Some(i), 2, rv + n)));
    objects.extend((0..segments).map(|s| object(&format!("gone-{s}"), Some(&item(s, "c-gone")), 1, 2 * rv + s)));
    objects.push(object("no-topology", None, 1, 3 * rv));
    let (mut before, mut after) = (baseline::Controller::default(), Tracker::default());
    for o in &objects {
        before.store(o.clone());
        assert_eq!(after.upsert(o), Plan::default(), "nothing before the first reconciliation");
    }
    let (b, a) = (sorted(before.reconcile(desired.clone())), sorted(after.set_desired(desired.clone(), &|_| false)));
    assert_eq!(a, b, "the first reconciliation");
    assert_eq!(a.queue.len(), items.len(), "every item is new");
    assert_eq!(a.delete.len(), items.len().div_ceil(100) + segments + 1, "the duplicates and the obsolete objects");
    for (n, i) in items.iter().enumerate() {
        assert!(before.is_desired(i) && after.is_desired(i), "{i}");
        let keep = before.keep(i);
        assert_eq!(keep, Some(name(n)), "{i}: the older object is kept");
        assert_eq!(after.keep(i), keep, "{i}");
        let o = object(&name(n), Some(i), 1, 4 * rv + n);
        before.event(o.clone());
        after.upsert(&o);
    }
    assert!(!before.is_desired(&item(0, "c-gone")) && !after.is_desired(&item(0, "c-gone")));
    for o in &objects {
        let (n, u) = (o.metadata.name.as_deref().unwrap_or_default(), o.metadata.uid.as_deref().unwrap_or_default());
        let should = a.delete.contains(&(n.to_string(), u.to_string()));
        assert_eq!(before.should_delete(n, u), should, "{n}");
        assert_eq!(after.should_delete(n, u), should, "{n}");
    }
}

/// What one poll cost; over several, the median time and its range.
struct Cost {
    time: Duration,
    range: (Duration, Duration),
    allocations: u64,
    bytes: u64,
}

/// Runs `poll` once, measured.
fn measure(poll: &mut dyn FnMut()) -> Cost {
    let (count, bytes) = counting::totals();
    let start = Instant::now();
    poll();
    let time = start.elapsed();
    let (count2, bytes2) = counting::totals();
    Cost { time, range: (time, time), allocations: count2 - count, bytes: bytes2 - bytes }
}

/// The median time of `runs` polls, their range, and the allocations of
/// the median one (the same in every poll).
fn median(runs: usize, poll: &mut dyn FnMut()) -> Cost {
    let mut costs: Vec<Cost> = (0..runs.max(1)).map(|_| measure(poll)).collect();
    costs.sort_by_key(|c| c.time);
    let (lo, hi) = (costs[0].allocations, costs[costs.len() - 1].allocations);
    assert!(lo.abs_diff(hi) <= lo / 100 + 10, "allocations differ between polls: {lo} and {hi}");
    let range = (costs[0].time, costs[costs.len() - 1].time);
    Cost { range, ..costs.swap_remove(costs.len() / 2) }
}

fn size(bytes: u64) -> String {
    let mib = bytes as f64 / (1 << 20) as f64;
    if mib >= 1024.0 { format!("{:.1} GiB", mib / 1024.0) } else { format!("{mib:.1} MiB") }
}

/// A count with thin spaces between thousands (as docs/benchmarks.md).
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn main() {
    let args: Args = argh::from_env();
    let classes: Vec<String> = (0..args.classes).map(|c| format!("c{c}")).collect();
    let desired: BTreeSet<Item> = (0..args.segments).flat_map(|s| classes.iter().map(move |c| item(s, c))).collect();
    // In the set's order, the order of a poll.
    let items: Vec<Item> = desired.iter().cloned().collect();
    let k = items.len();
    check_agreement(&items, &desired, args.segments);

    // The poll's scenario: every item with its object; the watch events of
    // the rewritten objects built in advance (as the informer decodes them).
    let objects: Vec<Arc<CSIStorageCapacity>> =
        items.iter().enumerate().map(|(n, i)| object(&name(n), Some(i), 1, n)).collect();
    let events: Vec<Arc<CSIStorageCapacity>> =
        items.iter().enumerate().map(|(n, i)| object(&name(n), Some(i), 1, k + n)).collect();
    let (mut before, mut after) = (baseline::Controller::default(), Tracker::default());
    for o in &objects {
        before.store(o.clone());
        after.upsert(o);
    }
    let (b, a) = (before.reconcile(desired.clone()), after.set_desired(desired.clone(), &|_| false));
    assert_eq!(sorted(b), sorted(a), "the first reconciliation");

    let work = after.work();
    // One poll each: the reconciliation (its desired set given, cloned as
    // `compute_desired` builds it anew), the items to refresh, then per item
    // what `sync_item` asks and the watch event of its write.
    let mut poll_before = || {
        let plan = before.reconcile(desired.clone());
        assert!(plan.queue.is_empty() && plan.delete.is_empty(), "{plan:?}");
        for (n, i) in before.desired().into_iter().enumerate() {
            assert!(before.is_desired(&i));
            assert_eq!(before.keep(&i), Some(name(n)));
            let plan = before.event(events[n].clone());
            assert!(plan.queue.is_empty() && plan.delete.is_empty(), "{plan:?}");
        }
    };
    let mut poll_after = || {
        let plan = after.set_desired(desired.clone(), &|_| false);
        assert!(plan.queue.is_empty() && plan.delete.is_empty(), "{plan:?}");
        let refresh: Vec<Item> = after.desired().iter().cloned().collect();
        for (n, i) in refresh.iter().enumerate() {
            assert!(after.is_desired(i));
            assert_eq!(after.keep(i), Some(name(n)));
            let plan = after.upsert(&events[n]);
            assert!(plan.queue.is_empty() && plan.delete.is_empty(), "{plan:?}");
        }
    };
    let b = median(args.before_runs, &mut poll_before);
    let a = median(args.runs, &mut poll_after);
    let visits = (after.work() - work) / args.runs.max(1) as u64;
    black_box(&before);

    println!(
        "{k} objects ({} segments × {} classes), each item with its object; before and after agree (kept and deleted objects, with duplicates and obsolete objects added); median time of {} polls before, {} after: {visits} visits per poll ({:.1} per object)",
        args.segments,
        args.classes,
        args.before_runs,
        args.runs,
        visits as f64 / k as f64
    );
    println!();
    println!("| per poll | before: a scan of every object | after: the index | before / after |");
    println!("|---|---:|---:|---:|");
    let ms = |c: &Cost| c.time.as_secs_f64() * 1e3;
    let range =
        |c: &Cost, scale: f64| format!("{:.1}-{:.1}", c.range.0.as_secs_f64() * scale, c.range.1.as_secs_f64() * scale);
    println!(
        "| time | {:.1} s ({} s) | {:.1} ms ({} ms) | {:.0}× |",
        ms(&b) / 1e3,
        range(&b, 1.0),
        ms(&a),
        range(&a, 1e3),
        ms(&b) / ms(&a)
    );
    println!(
        "| allocations | {} | {} | {:.0}× |",
        count(b.allocations),
        count(a.allocations),
        b.allocations as f64 / a.allocations.max(1) as f64
    );
    println!(
        "| bytes allocated | {} | {} | {:.0}× |",
        size(b.bytes),
        size(a.bytes),
        b.bytes as f64 / a.bytes.max(1) as f64
    );
    println!(
        "| per object | {:.1} ms, {:.0} allocations | {:.2} µs, {:.1} allocations | |",
        ms(&b) / k as f64,
        b.allocations as f64 / k as f64,
        ms(&a) * 1e3 / k as f64,
        a.allocations as f64 / k as f64
    );
}
