//! The versions of objects a controller has itself superseded, so a sync
//! can tell a cache copy that predates its own last write from a newer one.
//!
//! A controller writes an object (version A read, version B returned), then
//! writes again (C). The watch delivers B while the sync runs, so the key
//! is queued again; when that second sync starts, the cache may still hold
//! B. Acting on B repeats work C finished, and its patch, built against B,
//! is refused (a conflict, or worse, a merge error), costing a request and
//! a retry. Every version the controller read before a write, or got back
//! from a write it later replaced, is known to be stale: a sync that finds
//! one in the cache can stop, because the watch still owes the controller
//! its own newer version. It must leave the key owed (retried soon), not
//! done: the newer version's event queues the key again only if the
//! queue's handler sees something to do in it, and a write of another
//! controller sharing the set (the resizer's modify sync, seen by its
//! resize queue) may change nothing that handler looks at.
//!
//! Versions are compared for equality only (they are opaque strings); a
//! version not in the set (our newest, or anybody's later write) means the
//! cache caught up and the key's entry is dropped.

use parking_lot::Mutex;
use std::collections::HashMap;

/// At most this many stale versions kept per key: a sync writes a handful
/// of times; older ones are long gone from any cache.
const KEPT_PER_KEY: usize = 8;

#[derive(Default)]
struct Versions {
    /// The version our last write returned: not stale.
    newest: String,
    /// Versions our writes superseded, oldest first.
    stale: Vec<String>,
}

/// Per key, the versions this controller's own writes superseded.
#[derive(Default)]
pub struct OwnWrites(Mutex<HashMap<String, Versions>>);

impl OwnWrites {
    /// Records a write of `key` built on version `read` that returned `written`.
    pub fn wrote(&self, key: &str, read: Option<&str>, written: Option<&str>) {
        let Some(written) = written.filter(|w| !w.is_empty()) else { return };
        let mut map = self.0.lock();
        let v = map.entry(key.to_string()).or_default();
        let previous = std::mem::replace(&mut v.newest, written.to_string());
        for old in [Some(previous.as_str()), read].into_iter().flatten() {
            if !old.is_empty() && old != written && !v.stale.iter().any(|s| s == old) {
                v.stale.push(old.to_string());
            }
        }
        let excess = v.stale.len().saturating_sub(KEPT_PER_KEY);
        v.stale.drain(..excess);
    }

    /// Whether `version` of `key` is one our own writes replaced. A version
    /// that is not (the cache caught up) forgets the key.
    pub fn is_stale(&self, key: &str, version: Option<&str>) -> bool {
        let mut map = self.0.lock();
        let Some(v) = map.get(key) else { return false };
        if version.is_some_and(|ver| v.stale.iter().any(|s| s == ver)) {
            return true;
        }
        map.remove(key);
        false
    }

    /// Forgets `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        self.0.lock().remove(key);
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.0.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_copy_our_later_write_replaced_is_stale_until_the_cache_catches_up() {
        let w = OwnWrites::default();
        // Read 1, wrote 2 (in progress), then 3 (done).
        w.wrote("ns/c", Some("1"), Some("2"));
        w.wrote("ns/c", Some("2"), Some("3"));
        assert!(w.is_stale("ns/c", Some("2")), "our own earlier write");
        assert!(w.is_stale("ns/c", Some("1")), "the copy we read");
        assert!(!w.is_stale("ns/c", Some("3")), "our newest write is current");
        assert_eq!(w.tracked(), 0, "caught up: forgotten");
        assert!(!w.is_stale("ns/c", Some("2")), "nothing known any more: acted on");
    }

    #[test]
    fn somebody_elses_newer_version_is_never_stale() {
        let w = OwnWrites::default();
        w.wrote("ns/c", Some("1"), Some("2"));
        assert!(!w.is_stale("ns/c", Some("7")));
        assert!(!w.is_stale("ns/other", Some("1")), "keys are apart");
        assert!(!w.is_stale("ns/c", None));
    }

    #[test]
    fn a_write_without_a_returned_version_records_nothing() {
        let w = OwnWrites::default();
        w.wrote("ns/c", Some("1"), None);
        w.wrote("ns/c", Some("1"), Some(""));
        assert!(!w.is_stale("ns/c", Some("1")));
        w.wrote("ns/c", Some("1"), Some("2"));
        w.forget("ns/c");
        assert!(!w.is_stale("ns/c", Some("1")), "forgotten with the object");
    }

    proptest! {
        /// Against a model: after any sequence of writes (each built on the
        /// version the previous one returned, or on the first read), a
        /// version is stale exactly when it is among the last
        /// KEPT_PER_KEY versions written or read before the newest write,
        /// and the newest write is never stale.
        #[test]
        fn stale_exactly_when_superseded_by_our_own_write(n in 1usize..20, probe in 0usize..25) {
            let w = OwnWrites::default();
            let mut seen: Vec<String> = vec!["0".into()];
            for i in 1..=n {
                let read = seen.last().cloned();
                w.wrote("k", read.as_deref(), Some(&i.to_string()));
                seen.push(i.to_string());
            }
            let newest = n.to_string();
            let superseded: Vec<&String> = seen[..n].iter().rev().take(KEPT_PER_KEY).collect();
            let p = probe.to_string();
            let want = superseded.contains(&&p);
            prop_assert_eq!(w.is_stale("k", Some(&p)), want);
            if want {
                prop_assert!(!w.is_stale("k", Some(&newest)));
            }
        }
    }
}
