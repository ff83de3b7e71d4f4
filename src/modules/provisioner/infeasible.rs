//! Claims whose CreateVolume the driver called infeasible (InvalidArgument),
//! pure: until `--retry-interval-max` has passed, and while their
//! StorageClass is the version the create failed with, their syncs do not
//! call CreateVolume again, whatever brought them (a claim event, a resync,
//! an earlier backoff delay still pending in the queue). Upstream's rule.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// One claim's infeasible create.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry<K> {
    /// The claim's work-queue key.
    key: K,
    /// No CreateVolume before this.
    until: Instant,
    /// The class's name and `resourceVersion` the create failed with.
    class: String,
    class_version: String,
}

/// The claims (by UID) with an infeasible create; time passed explicitly.
#[derive(Debug)]
pub struct Infeasible<K> {
    by_uid: HashMap<String, Entry<K>>,
}

impl<K> Default for Infeasible<K> {
    fn default() -> Self {
        Infeasible { by_uid: HashMap::new() }
    }
}

impl<K: Clone + PartialEq> Infeasible<K> {
    /// Records an infeasible create of claim `uid` (queue key `key`) with
    /// class `class` at `class_version`: no new one before `now + delay`.
    pub fn record(&mut self, uid: &str, key: &K, class: &str, class_version: &str, now: Instant, delay: Duration) {
        let entry = Entry {
            key: key.clone(),
            until: now + delay,
            class: class.to_string(),
            class_version: class_version.to_string(),
        };
        self.by_uid.insert(uid.to_string(), entry);
    }

    /// How long claim `uid`, of class `class` now at `class_version`, must
    /// still wait before CreateVolume; `None`: it may call now (nothing
    /// recorded, the delay is over, or the class changed; the entry is
    /// dropped then).
    pub fn wait(&mut self, uid: &str, class: &str, class_version: &str, now: Instant) -> Option<Duration> {
        let entry = self.by_uid.get(uid)?;
        if entry.until > now && entry.class == class && entry.class_version == class_version {
            return Some(entry.until - now);
        }
        self.by_uid.remove(uid);
        None
    }

    /// Forgets claim `uid` (provisioned).
    pub fn forget(&mut self, uid: &str) {
        self.by_uid.remove(uid);
    }

    /// Forgets the claims named `key` other than the live one `live` (a
    /// claim deleted, or deleted and re-created under its name).
    pub fn forget_named(&mut self, key: &K, live: Option<&str>) {
        self.by_uid.retain(|uid, e| e.key != *key || Some(uid.as_str()) == live);
    }

    /// The queue keys of the claims waiting because of class `class` (told
    /// when the class changes: their next sync may call the driver).
    pub fn keys_of_class(&self, class: &str) -> Vec<K> {
        self.by_uid.values().filter(|e| e.class == class).map(|e| e.key.clone()).collect()
    }

    /// How many claims are remembered.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether no claim is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(300);

    #[test]
    fn an_infeasible_create_waits_for_its_delay_or_a_class_change() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (what, uid, class, version, time since the failure, wait, remembered after)
        let cases = [
            ("unknown claim", "other", "fast", "7", s(1), None, 1),
            ("a claim event 1 s later", "u1", "fast", "7", s(1), Some(s(299)), 1),
            (
                "an earlier backoff delay",
                "u1",
                "fast",
                "7",
                Duration::from_millis(200),
                Some(MAX - Duration::from_millis(200)),
                1,
            ),
            ("a resync just before the deadline", "u1", "fast", "7", s(299), Some(s(1)), 1),
            ("the class changed", "u1", "fast", "8", s(1), None, 0),
            ("another class", "u1", "slow", "7", s(1), None, 0),
            ("the deadline", "u1", "fast", "7", MAX, None, 0),
            ("after the deadline", "u1", "fast", "7", s(301), None, 0),
        ];
        for (what, uid, class, version, after, want, left) in cases {
            let mut inf = Infeasible::default();
            inf.record("u1", &"ns/c", "fast", "7", t0, MAX);
            assert_eq!(inf.wait(uid, class, version, t0 + after), want, "{what}");
            assert_eq!(inf.len(), left, "{what}");
        }
    }

    #[test]
    fn a_new_failure_restarts_the_delay_and_forget_drops_it() {
        let t0 = Instant::now();
        let mut inf = Infeasible::default();
        inf.record("u1", &"ns/c", "fast", "7", t0, MAX);
        // The class changed, the retry failed again: a new deadline for the new version.
        assert_eq!(inf.wait("u1", "fast", "8", t0 + MAX / 2), None);
        inf.record("u1", &"ns/c", "fast", "8", t0 + MAX / 2, MAX);
        assert_eq!(inf.wait("u1", "fast", "8", t0 + MAX), Some(MAX / 2));
        inf.forget("u1");
        assert!(inf.is_empty());
        assert_eq!(inf.wait("u1", "fast", "8", t0 + MAX), None);
    }

    #[test]
    fn claims_by_name_and_by_class() {
        let t0 = Instant::now();
        let mut inf = Infeasible::default();
        inf.record("old", &"ns/c", "fast", "7", t0, MAX);
        inf.record("new", &"ns/c", "fast", "7", t0, MAX);
        inf.record("u2", &"ns/d", "slow", "3", t0, MAX);
        let mut fast = inf.keys_of_class("fast");
        fast.sort();
        assert_eq!(fast, ["ns/c", "ns/c"]);
        assert_eq!(inf.keys_of_class("slow"), ["ns/d"]);
        // "ns/c" re-created: only the live claim is kept.
        inf.forget_named(&"ns/c", Some("new"));
        assert_eq!(inf.len(), 2);
        assert!(inf.wait("new", "fast", "7", t0).is_some());
        // Deleted.
        inf.forget_named(&"ns/d", None);
        assert_eq!(inf.keys_of_class("slow"), Vec::<&str>::new());
    }
}
