use std::time::{Duration, Instant, SystemTime};

use super::{query::*, *};

fn entry(waiting_for: WaitingFor, error: Option<&str>) -> Entry {
    Entry {
        queue: "claims",
        waiting_for,
        attempts: 2,
        last_error: error.map(str::to_string),
        next_retry: None,
        csi_call: None,
        since: SystemTime::now(),
        since_mono: Instant::now(),
    }
}

#[test]
fn a_sync_outcome_decides_what_the_ledger_keeps() {
    let s = Duration::from_secs;
    let again = |secs, attempts| Finish::Again { delay: s(secs), attempts };
    let old = entry(WaitingFor::Secret, Some("secret missing"));
    #[allow(clippy::type_complexity)]
    let cases: &[(
        &str,
        Option<&Entry>,
        Option<WaitingFor>,
        Option<&str>,
        Finish,
        Option<(WaitingFor, u32, Option<&str>, Option<Duration>)>,
    )] = &[
        ("done without a reason: gone", Some(&old), None, None, Finish::Done, None),
        ("done and never seen: nothing", None, None, None, Finish::Done, None),
        (
            "done but waiting (scheduler): kept without attempts or retry",
            None,
            Some(WaitingFor::Scheduler),
            None,
            Finish::Done,
            Some((WaitingFor::Scheduler, 0, None, None)),
        ),
        (
            "done waiting again drops an old error",
            Some(&old),
            Some(WaitingFor::Scheduler),
            None,
            Finish::Done,
            Some((WaitingFor::Scheduler, 0, None, None)),
        ),
        (
            "a failure with its reason and error",
            None,
            Some(WaitingFor::Driver),
            Some("rpc error: code = Internal"),
            again(4, 3),
            Some((WaitingFor::Driver, 3, Some("rpc error: code = Internal"), Some(s(4)))),
        ),
        (
            "a retry without a new error keeps the last one and its reason",
            Some(&old),
            None,
            None,
            again(300, 1),
            Some((WaitingFor::Secret, 1, Some("secret missing"), Some(s(300)))),
        ),
        (
            "a first failure without a reason is a retry",
            None,
            None,
            Some("boom"),
            again(1, 1),
            Some((WaitingFor::Retry, 1, Some("boom"), Some(s(1)))),
        ),
    ];
    for (what, prev, waiting, error, finish, want) in cases {
        let got = after_sync(*prev, *waiting, error.map(str::to_string), *finish);
        let want = want.map(|(w, a, e, d)| (w, a, e.map(str::to_string), d));
        assert_eq!(got, want, "{what}");
    }
}

fn now() -> Now {
    Now { wall: SystemTime::now(), mono: Instant::now() }
}

/// A registry with `n` claims waiting in `provisioner` (`ns-{i%3}/claim-{i:04}`)
/// and one attachment in `attacher`.
fn filled(n: usize) -> Registry {
    let r = Registry::default();
    let p = r.ledger("provisioner");
    for i in 0..n {
        let scope = p.scope("claims", "PersistentVolumeClaim", format!("ns-{}/claim-{i:04}", i % 3));
        *scope.0.notes.lock() = Notes { waiting_for: Some(WaitingFor::Secret), last_error: Some(format!("e{i}")) };
        scope.finish(Finish::Again { delay: Duration::from_secs(10), attempts: 1 });
    }
    let a = r.ledger("attacher");
    let scope = a.scope("csi-attacher-va", "VolumeAttachment", "csi-123".into());
    *scope.0.notes.lock() = Notes { waiting_for: Some(WaitingFor::Node), last_error: None };
    scope.finish(Finish::Done);
    r
}

#[test]
fn pages_cover_every_match_once_in_order() {
    let r = filled(25);
    let mut q = Query { limit: Some(7), ..Query::default() };
    let mut seen = Vec::new();
    loop {
        let p = page(&q, &r.ledgers(), now());
        assert_eq!(p.matching, 26);
        assert!(p.objects.len() <= 7);
        seen.extend(p.objects.iter().map(|o| format!("{}/{}/{:?}/{}", o.module, o.kind, o.namespace, o.name)));
        match p.after {
            Some(t) => q.after = Some(t),
            None => break,
        }
    }
    assert_eq!(seen.len(), 26, "{seen:?}");
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "ordered, without repeats");
    assert!(seen[0].starts_with("attacher/"), "modules by name: {}", seen[0]);
}

#[test]
fn filters_by_module_kind_alias_namespace_and_name() {
    let r = filled(9);
    let count = |q: Query| page(&q, &r.ledgers(), now()).objects.len();
    assert_eq!(count(Query { module: Some("attacher".into()), ..Query::default() }), 1);
    assert_eq!(count(Query { kind: Some("pvc".into()), ..Query::default() }), 9);
    assert_eq!(count(Query { kind: Some("va".into()), ..Query::default() }), 1);
    assert_eq!(count(Query { namespace: Some("ns-1".into()), ..Query::default() }), 3);
    let one = Query { namespace: Some("ns-2".into()), name: Some("claim-0005".into()), ..Query::default() };
    let p = page(&one, &r.ledgers(), now());
    assert_eq!(p.objects.len(), 1);
    let o = &p.objects[0];
    assert_eq!((o.waiting_for, o.attempts, o.last_error.as_deref()), (WaitingFor::Secret, 1, Some("e5")));
    let retry = o.next_retry_in_seconds.expect("a retry time");
    assert!((0.0..=10.0).contains(&retry), "{retry}");
    assert_eq!(
        p.modules.iter().map(|m| (m.module.as_str(), m.not_done)).collect::<Vec<_>>(),
        [("attacher", 1), ("provisioner", 9)]
    );
}

#[test]
fn the_query_string_parses_and_rejects_by_name() {
    let q = Query::parse("module=provisioner&kind=pvc&namespace=a%2Db&name=x+y&limit=5&continue=p%7CK%7Ca%2Fb%7Cq")
        .unwrap();
    assert_eq!(q.module.as_deref(), Some("provisioner"));
    assert_eq!(q.namespace.as_deref(), Some("a-b"));
    assert_eq!(q.name.as_deref(), Some("x y"));
    assert_eq!(q.limit, Some(5));
    let after = Cursor { module: "p".into(), kind: "K".into(), key: "a/b".into(), queue: "q".into() };
    assert_eq!(q.after, Some(after));
    assert_eq!(Query::parse(&q.to_query_string()).unwrap(), q, "round trip");
    assert_eq!(Query::parse("").unwrap(), Query::default());
    assert_eq!(Query::parse("name=").unwrap(), Query::default(), "empty is no filter");
    assert_eq!(Query::parse("token=x").unwrap_err(), QueryError::Unknown("token".into()));
    assert_eq!(Query::parse("limit=0").unwrap_err(), QueryError::Limit("0".into()));
    assert_eq!(Query::parse("limit=lots").unwrap_err(), QueryError::Limit("lots".into()));
    assert!(matches!(Query::parse("name=%ZZ"), Err(QueryError::Encoding(_))));
    assert!(Query::parse("limit=9999").unwrap_err().to_string().contains("limit"));
    for token in ["p|K|a/b", "p|K|a/b|q|x", "p|K|a%2Fb|q", "p|K|a%7|q"] {
        let raw = format!("continue={}", token.replace('%', "%25").replace('|', "%7C"));
        let err = Query::parse(&raw).unwrap_err();
        assert_eq!(err, QueryError::Continue(token.into()), "{token}");
        assert!(err.to_string().starts_with("continue "), "{err}");
    }
}

#[test]
fn the_json_has_the_documented_shape() {
    let r = filled(1);
    let p = page(&Query::default(), &r.ledgers(), now());
    let v = serde_json::to_value(&p).unwrap();
    let o = &v["objects"][1];
    assert_eq!(o["kind"], "PersistentVolumeClaim");
    assert_eq!(o["namespace"], "ns-0");
    assert_eq!(o["name"], "claim-0000");
    assert_eq!(o["queue"], "claims");
    assert_eq!(o["waiting_for"], "secret");
    assert_eq!(o["attempts"], 1);
    assert_eq!(o["last_error"], "e0");
    assert!(o["next_retry"].as_str().unwrap().ends_with('Z'));
    assert!(o.get("csi_call").is_none());
    assert_eq!(v["objects"][0]["namespace"], serde_json::Value::Null, "a cluster-scoped kind has none");
    assert_eq!(v["modules"][0]["phase"], "starting", "a module is starting until its workers run");
    let back: Page = serde_json::from_value(v).unwrap();
    assert_eq!(back, p, "explain reads back what the endpoint writes");
    let first = page(&Query { limit: Some(1), ..Query::default() }, &r.ledgers(), now());
    let v = serde_json::to_value(&first).unwrap();
    assert_eq!(v["continue"], "attacher|VolumeAttachment|csi-123|csi-attacher-va", "the token is text");
    assert_eq!(serde_json::from_value::<Page>(v).unwrap(), first);
}

#[test]
fn gauges_count_every_reason_per_module() {
    let r = filled(4);
    let mut out = String::new();
    gauges::render(&r.ledgers(), Instant::now() + Duration::from_secs(60), &mut out);
    assert!(out.contains("csi_sidecar_objects_waiting{module=\"provisioner\",waiting_for=\"secret\"} 4\n"), "{out}");
    assert!(out.contains("csi_sidecar_objects_waiting{module=\"provisioner\",waiting_for=\"driver\"} 0\n"), "{out}");
    assert!(out.contains("csi_sidecar_objects_waiting{module=\"attacher\",waiting_for=\"node\"} 1\n"), "{out}");
    let longest = |module: &str, w: &str| {
        let series = format!("csi_sidecar_object_longest_wait_seconds{{module=\"{module}\",waiting_for=\"{w}\"}} ");
        out.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.parse::<f64>().ok())
    };
    // Per reason too, so an alert can leave the normal waits out.
    assert!(longest("provisioner", "secret").is_some_and(|s| s >= 60.0), "{out}");
    assert_eq!(longest("provisioner", "scheduler"), Some(0.0), "{out}");
    assert!(longest("attacher", "node").is_some_and(|s| s >= 60.0), "{out}");
    assert_eq!(longest("attacher", "secret"), Some(0.0), "{out}");
    let mut empty = String::new();
    gauges::render(&[], Instant::now(), &mut empty);
    assert!(empty.is_empty());
}

#[tokio::test]
async fn notes_and_calls_reach_the_entry_only_inside_a_scope() {
    let r = Registry::default();
    let l = r.ledger("provisioner");
    waiting_for(WaitingFor::Secret);
    failed("outside");
    let g = csi_call("/csi.v1.Controller/CreateVolume");
    drop(g);
    assert!(l.is_empty(), "outside a sync nothing is filed");
    let scope = l.scope("claims", "PersistentVolumeClaim", "ns/a".into());
    let key: EntryKey = ("PersistentVolumeClaim", "ns/a".into());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<Entry>();
    let l2 = l.clone();
    let key2 = key.clone();
    let running = tokio::spawn(scope.clone().run_owned(async move {
        let _call = csi_call("/csi.v1.Controller/CreateVolume");
        let live = l2.entries().into_iter().find(|(k, _)| *k == key2).map(|(_, e)| e).unwrap();
        let _ = seen_tx.send(live);
        let _ = rx.await;
        failed("rpc error: code = Unavailable");
    }));
    let live = seen_rx.await.unwrap();
    assert_eq!(live.csi_call.map(|c| c.0), Some("/csi.v1.Controller/CreateVolume"));
    assert_eq!(live.waiting_for, WaitingFor::Driver);
    let _ = tx.send(());
    running.await.unwrap();
    scope.finish(Finish::Again { delay: Duration::from_secs(2), attempts: 1 });
    let (_, e) = l.entries().into_iter().next().unwrap();
    assert_eq!(e.csi_call, None, "the call ended");
    assert_eq!(e.last_error.as_deref(), Some("rpc error: code = Unavailable"));
    assert_eq!(e.waiting_for, WaitingFor::Driver, "the live reason stays when the sync names none");
    l.scope("claims", "PersistentVolumeClaim", "ns/a".into()).finish(Finish::Done);
    assert!(l.is_empty());
    assert_eq!(r.ledger("provisioner").module(), "provisioner");
    assert_eq!(r.ledgers().len(), 1, "one ledger per module");
}

#[test]
fn two_queues_of_one_object_keep_their_own_entries() {
    let l = Registry::default().ledger("resizer");
    let key: EntryKey = ("PersistentVolumeClaim", "ns/data".into());
    let file = |queue: &'static str, w: Option<WaitingFor>, finish: Finish| {
        let scope = l.scope(queue, key.0, key.1.clone());
        scope.0.notes.lock().waiting_for = w;
        scope.finish(finish);
    };
    file("resize", Some(WaitingFor::Driver), Finish::Again { delay: Duration::from_secs(5), attempts: 1 });
    file("modify", Some(WaitingFor::Class), Finish::Done);
    let queues = |l: &Ledger| l.entries().into_iter().map(|(_, e)| (e.queue, e.waiting_for)).collect::<Vec<_>>();
    assert_eq!(queues(&l), [("modify", WaitingFor::Class), ("resize", WaitingFor::Driver)]);
    // The modify queue finds nothing to do: only its entry goes.
    file("modify", None, Finish::Done);
    assert_eq!(queues(&l), [("resize", WaitingFor::Driver)]);
    // Both again, then the object is gone: every queue's entry goes.
    file("modify", Some(WaitingFor::Class), Finish::Done);
    l.remove(&("PersistentVolumeClaim", "ns/dat".into()));
    assert_eq!(l.len(), 2, "a key that is a prefix of another removes nothing");
    l.remove(&key);
    assert!(l.is_empty());
    // Both are served, one page after the other.
    file("resize", Some(WaitingFor::Driver), Finish::Done);
    file("modify", Some(WaitingFor::Class), Finish::Done);
    let q = Query { limit: Some(1), ..Query::default() };
    let first = page(&q, std::slice::from_ref(&l), now());
    let next = Query { after: first.after.clone(), ..q };
    let second = page(&next, std::slice::from_ref(&l), now());
    assert_eq!((first.objects[0].queue.as_str(), second.objects[0].queue.as_str()), ("modify", "resize"));
    assert_eq!(second.after, None);
}

/// One entry as the endpoint orders them: module, kind, key, queue.
type Row = (&'static str, &'static str, String, &'static str);

/// Ledgers holding `rows` (each waiting for the driver).
fn ledgers_of(rows: &[Row]) -> Vec<Ledger> {
    let r = Registry::default();
    for (module, kind, key, queue) in rows {
        let scope = r.ledger(module).scope(queue, kind, key.clone());
        scope.0.notes.lock().waiting_for = Some(WaitingFor::Driver);
        scope.finish(Finish::Done);
    }
    r.ledgers()
}

/// Every page of `ledgers`, `limit` objects at a time, concatenated.
fn every_page(ledgers: &[Ledger], limit: usize) -> Vec<(String, String, String, String)> {
    let mut q = Query { limit: Some(limit), ..Query::default() };
    let mut seen = Vec::new();
    for _ in 0..=ledgers.iter().map(Ledger::len).sum::<usize>() {
        let p = page(&q, ledgers, now());
        seen.extend(p.objects.iter().map(|o| {
            let key = o.namespace.as_ref().map_or_else(|| o.name.clone(), |ns| format!("{ns}/{}", o.name));
            (o.module.clone(), o.kind.clone(), key, o.queue.clone())
        }));
        match p.after {
            Some(t) => q.after = Some(t),
            None => return seen,
        }
    }
    panic!("paging does not end: {seen:?}");
}

fn owned(rows: &[Row]) -> Vec<(String, String, String, String)> {
    rows.iter().map(|(m, k, key, q)| (m.to_string(), k.to_string(), key.clone(), q.to_string())).collect()
}

#[test]
fn a_page_resumes_after_its_last_entry_whatever_follows_it() {
    let pv = |name: &str| ("provisioner", "PersistentVolume", name.to_string(), "volumes");
    let pvc = |key: &str| ("provisioner", "PersistentVolumeClaim", key.to_string(), "claims");
    let cases: &[(&str, Vec<Row>)] = &[
        ("a page ending on a PersistentVolume, claims after it", vec![pv("pv-1"), pvc("ns/a"), pvc("ns/b")]),
        (
            "a page ending at a key that prefixes the next ones",
            vec![pvc("ns/data-web-1"), pvc("ns/data-web-10"), pvc("ns/data-web-11"), pvc("ns/data-web-19")],
        ),
    ];
    let mut wrong = Vec::new();
    for (name, rows) in cases {
        let ledgers = ledgers_of(rows);
        for limit in 1..=rows.len() {
            let got = every_page(&ledgers, limit);
            if got != owned(rows) {
                wrong.push(format!("{name}, limit {limit}: served {:?}", got.iter().map(|r| &r.2).collect::<Vec<_>>()));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

proptest::proptest! {
    /// A cursor's token reads back as the cursor, whatever its parts hold.
    #[test]
    fn a_token_reads_back_as_its_cursor(parts in proptest::array::uniform4("[a|%7C2/-]{0,6}")) {
        let [module, kind, key, queue] = parts;
        let c = Cursor { module, kind, key, queue };
        proptest::prop_assert_eq!(Cursor::decode(&c.to_string()), Some(c.clone()));
        let q = Query { after: Some(c), ..Query::default() };
        proptest::prop_assert_eq!(Query::parse(&q.to_query_string()), Ok(q));
    }

    /// Paging with any limit serves every entry once, in the endpoint's
    /// order, whatever the keys (prefixes of each other, '-', '/', digits).
    #[test]
    fn paging_serves_every_entry_once_in_order(
        rows in proptest::collection::vec(
            (
                proptest::sample::select(&["attacher", "provisioner", "resizer"][..]),
                proptest::sample::select(&["PersistentVolume", "PersistentVolumeClaim", "VolumeAttachment"][..]),
                "[ab019/-]{1,5}",
                proptest::sample::select(&["modify", "resize"][..]),
            ),
            0..24,
        ),
        limit in 1usize..8,
    ) {
        let ledgers = ledgers_of(&rows);
        let model: std::collections::BTreeSet<_> = owned(&rows).into_iter().collect();
        proptest::prop_assert_eq!(every_page(&ledgers, limit), model.into_iter().collect::<Vec<_>>());
    }
}

mod summary {
    use proptest::prelude::*;

    use super::*;

    fn objects() -> impl Strategy<Value = Vec<(WaitingFor, Duration)>> {
        proptest::collection::vec(
            (0..WaitingFor::ALL.len(), 0..100_000u64)
                .prop_map(|(i, ms)| (WaitingFor::ALL[i], Duration::from_millis(ms))),
            0..40,
        )
    }

    proptest! {
        /// Against the model (a filter per reason): each reason's count and
        /// longest wait are those of its objects alone, whatever the order;
        /// together they count every object, and the longest of them all is
        /// the module's longest wait.
        #[test]
        fn per_reason_counts_and_longest_waits(objs in objects()) {
            let s = gauges::summarize(objs.iter().copied());
            for (i, w) in WaitingFor::ALL.iter().enumerate() {
                let mine: Vec<Duration> = objs.iter().filter(|(x, _)| x == w).map(|(_, d)| *d).collect();
                prop_assert_eq!(s[i].0, mine.len());
                prop_assert_eq!(s[i].1, mine.iter().copied().max().unwrap_or_default());
            }
            prop_assert_eq!(s.iter().map(|(n, _)| n).sum::<usize>(), objs.len());
            let overall = objs.iter().map(|(_, d)| *d).max().unwrap_or_default();
            prop_assert_eq!(s.iter().map(|(_, d)| *d).max().unwrap_or_default(), overall);
            let mut reversed = objs.clone();
            reversed.reverse();
            prop_assert_eq!(gauges::summarize(reversed), s);
        }
    }

    /// A claim waiting for the scheduler for an hour shows under
    /// `scheduler` only: the other reasons' longest waits stay at zero.
    #[test]
    fn a_normal_wait_stays_under_its_own_reason() {
        let hour = Duration::from_secs(3600);
        let s = gauges::summarize([(WaitingFor::Scheduler, hour), (WaitingFor::Populator, hour)]);
        for (w, (n, longest)) in WaitingFor::ALL.iter().zip(s) {
            let normal = matches!(w, WaitingFor::Scheduler | WaitingFor::Populator);
            assert_eq!((n, longest), if normal { (1, hour) } else { (0, Duration::ZERO) }, "{w:?}");
        }
    }
}
