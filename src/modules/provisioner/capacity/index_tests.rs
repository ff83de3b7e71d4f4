//! The tracker: the same answers as the full scans of [`decide`], at a
//! cost per change that does not grow with the number of objects.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use super::*;

fn item(segment: usize, class: usize) -> Item {
    Item { segment: BTreeMap::from([("zone".to_string(), format!("z{segment}"))]), class: format!("c{class}") }
}

fn object(name: &str, item: Option<&Item>, created: i64, rv: u64) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.to_string()),
            creation_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created).expect("time"),
            )),
            ..Default::default()
        },
        storage_class_name: item.map(|i| i.class.clone()).unwrap_or_else(|| "c0".into()),
        node_topology: item.map(|i| LabelSelector { match_labels: Some(i.segment.clone()), match_expressions: None }),
        capacity: None,
        maximum_volume_size: None,
    }
}

fn sorted(mut p: Plan) -> Plan {
    p.queue.sort();
    p.delete.sort();
    p
}

#[test]
fn the_tracker_agrees_with_the_full_scans() {
    let desired: BTreeSet<Item> = (0..3).flat_map(|s| (0..2).map(move |c| item(s, c))).collect();
    // (name, item, created): a duplicate pair (the older kept), an object
    // of an item no longer desired, one without a topology, and items
    // without an object.
    let objects = vec![
        object("a", Some(&item(0, 0)), 10, 1),
        object("b-dup-newer", Some(&item(0, 0)), 20, 2),
        object("b-dup-older", Some(&item(0, 1)), 5, 3),
        object("a-dup-newer", Some(&item(0, 1)), 6, 4),
        object("gone-segment", Some(&item(9, 0)), 1, 5),
        object("no-topology", None, 1, 6),
        object("c", Some(&item(1, 1)), 1, 7),
    ];
    let mut t = Tracker::default();
    for o in &objects {
        assert_eq!(t.upsert(o), Plan::default(), "nothing before the first reconciliation");
    }
    let written = item(2, 0);
    let plan = sorted(t.set_desired(desired.clone(), &|i| *i == written));
    let mut want_queue: Vec<Item> = desired.iter().cloned().collect();
    want_queue.sort();
    assert_eq!(plan.queue, want_queue, "every item is new to the first reconciliation");
    assert_eq!(plan.delete, decide::to_delete(objects.iter(), &desired));
    assert_eq!(t.counts(), decide::counts(objects.iter(), &desired));
    let by = decide::by_item(objects.iter());
    for i in &desired {
        let want = by.get(i).and_then(|l| l.first()).and_then(|o| o.metadata.name.clone());
        assert_eq!(t.keep(i).as_deref(), want.as_deref(), "{i}");
    }
    for o in &objects {
        let (n, u) = (o.metadata.name.clone().unwrap(), o.metadata.uid.clone().unwrap());
        let want = plan.delete.contains(&(n.clone(), u.clone()));
        assert_eq!(t.should_delete(&n, &u), want, "{n}");
        assert!(!t.should_delete(&n, "another-uid"), "{n}: another object of that name");
    }
    // The same desired set again: only the items without an object (and
    // not just written) are queued.
    let again = sorted(t.set_desired(desired.clone(), &|i| *i == written));
    assert_eq!(again.queue, vec![item(1, 0), item(2, 1)]);
    // The kept duplicate goes: the newer one is kept now, and the item is
    // not queued.
    let p = sorted(t.remove("a"));
    assert_eq!(p.queue, Vec::<Item>::new());
    assert_eq!(t.keep(&item(0, 0)).as_deref(), Some("b-dup-newer"));
    assert!(!t.should_delete("b-dup-newer", "uid-b-dup-newer"));
    // The last object of a desired item goes: the item is queued.
    let p = sorted(t.remove("c"));
    assert_eq!(p.queue, vec![item(1, 1)]);
    assert!(!t.has_object(&item(1, 1)));
    // An object moves to another item (its topology edited): the new item
    // has an object, the old one is queued.
    let p = sorted(t.upsert(&object("b-dup-older", Some(&item(1, 1)), 5, 8)));
    assert!(p.queue.is_empty() || p.queue == vec![item(0, 1)], "{p:?}");
    assert_eq!(t.keep(&item(1, 1)).as_deref(), Some("b-dup-older"));
    assert_eq!(t.keep(&item(0, 1)).as_deref(), Some("a-dup-newer"));
    let now: Vec<CSIStorageCapacity> = vec![
        object("b-dup-newer", Some(&item(0, 0)), 20, 2),
        object("b-dup-older", Some(&item(1, 1)), 5, 8),
        object("a-dup-newer", Some(&item(0, 1)), 6, 4),
        object("gone-segment", Some(&item(9, 0)), 1, 5),
        object("no-topology", None, 1, 6),
    ];
    assert_eq!(t.counts(), decide::counts(now.iter(), &desired));
    // A smaller desired set: the objects of the dropped class go.
    let fewer: BTreeSet<Item> = desired.iter().filter(|i| i.class == "c0").cloned().collect();
    let p = sorted(t.set_desired(fewer.clone(), &|_| false));
    assert_eq!(p.delete, decide::to_delete(now.iter(), &fewer));
    assert_eq!(t.counts(), decide::counts(now.iter(), &fewer));
}

/// One poll over 3 000 objects (100 segments × 30 classes, each with its
/// object): every item is checked, its object looked up and rewritten (the
/// write comes back as a watch event). The work must stay linear in the
/// number of objects: a few visits per object, not a scan of all of them
/// per object.
#[test]
fn a_poll_over_3000_objects_costs_work_linear_in_the_objects() {
    let (segments, classes) = (100, 30);
    let items: Vec<Item> = (0..segments).flat_map(|s| (0..classes).map(move |c| item(s, c))).collect();
    let name = |i: usize| format!("csisc-{i}");
    let mut t = Tracker::default();
    for (n, i) in items.iter().enumerate() {
        t.upsert(&object(&name(n), Some(i), 1, n as u64));
    }
    let plan = t.set_desired(items.iter().cloned().collect(), &|_| false);
    assert_eq!(plan.delete, Vec::<(String, String)>::new());
    let before = t.work();
    for (n, i) in items.iter().enumerate() {
        assert!(t.is_desired(i));
        assert_eq!(t.keep(i), Some(name(n)));
        let plan = t.upsert(&object(&name(n), Some(i), 1, (items.len() + n) as u64));
        assert!(plan.queue.is_empty() && plan.delete.is_empty(), "{plan:?}");
    }
    let k = items.len() as u64;
    let work = t.work() - before;
    assert!(work <= 10 * k, "one poll over {k} objects visited {work} items and objects (more than 10 per object)");
}
