//! Which attachments a ListVolumes pass may judge.
//!
//! The pass compares the driver's answer with the cached attachments. Both
//! can be stale for an attachment whose sync is in flight, or ended after
//! the pass asked the driver, or wrote a status the cache has not seen yet:
//! the driver may already have published a volume whose attachment still
//! reads `attached: false`. Upstream judges it anyway and forces a second
//! publish of the volume; here such an attachment waits for the next pass.
//! An attachment is skipped by at most one pass after its sync ends.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// What the syncs did to an attachment lately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touch {
    /// A sync is running; `wrote`: the resourceVersion its status write
    /// returned, if it wrote.
    InFlight { wrote: Option<String> },
    /// The last sync ended at `at`.
    Ended { at: Instant, wrote: Option<String> },
}

/// Whether a pass that asked the driver at `pass_started` may judge an
/// attachment cached at `cached_version`.
pub fn may_judge(touch: Option<&Touch>, pass_started: Instant, cached_version: Option<&str>) -> bool {
    match touch {
        None => true,
        Some(Touch::InFlight { .. }) => false,
        Some(Touch::Ended { at, .. }) if *at >= pass_started => false,
        Some(Touch::Ended { wrote: Some(version), .. }) => cached_version == Some(version.as_str()),
        Some(Touch::Ended { wrote: None, .. }) => true,
    }
}

/// The touches of the attachments, kept only when a reconciler reads them.
#[derive(Default)]
pub struct Settling {
    enabled: bool,
    touches: Mutex<HashMap<String, Touch>>,
}

impl Settling {
    pub fn new(enabled: bool) -> Settling {
        Settling { enabled, touches: Mutex::default() }
    }

    /// Marks a sync of `name` running until the guard drops.
    pub fn begin<'a>(&'a self, name: &str) -> SyncGuard<'a> {
        if self.enabled {
            self.touches.lock().insert(name.to_string(), Touch::InFlight { wrote: None });
        }
        SyncGuard { settling: self, name: name.to_string() }
    }

    /// The running sync of `name` wrote its status, now at `version`.
    pub fn wrote(&self, name: &str, version: Option<String>) {
        if let Some(Touch::InFlight { wrote }) = self.touches.lock().get_mut(name) {
            *wrote = version;
        }
    }

    /// Whether the pass started at `pass_started` may judge `name`; a touch
    /// that ended before the pass is dropped (it is settled now, or this
    /// pass was its one skip).
    pub fn judge(&self, name: &str, pass_started: Instant, cached_version: Option<&str>) -> bool {
        let mut touches = self.touches.lock();
        let touch = touches.get(name);
        let judge = may_judge(touch, pass_started, cached_version);
        if matches!(touch, Some(Touch::Ended { at, .. }) if *at < pass_started) {
            touches.remove(name);
        }
        judge
    }

    /// Drops the touches that ended before `pass_started` (of attachments
    /// the pass did not see: gone, or of no volume).
    pub fn prune(&self, pass_started: Instant) {
        self.touches.lock().retain(|_, t| !matches!(t, Touch::Ended { at, .. } if *at < pass_started));
    }
}

/// A running sync; ends it on drop (on every path out of the sync).
pub struct SyncGuard<'a> {
    settling: &'a Settling,
    name: String,
}

impl Drop for SyncGuard<'_> {
    fn drop(&mut self) {
        let mut touches = self.settling.touches.lock();
        if let Some(t) = touches.get_mut(&self.name)
            && let Touch::InFlight { wrote } = t
        {
            *t = Touch::Ended { at: Instant::now(), wrote: wrote.take() };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_pass_judges_only_what_settled_before_it_asked() {
        let pass = Instant::now();
        let before = pass - Duration::from_secs(1);
        let after = pass + Duration::from_millis(1);
        let v = |s: &str| Some(s.to_string());
        let cases: &[(Option<Touch>, Option<&str>, bool)] = &[
            (None, Some("7"), true),
            (Some(Touch::InFlight { wrote: None }), Some("7"), false),
            (Some(Touch::InFlight { wrote: v("8") }), Some("8"), false),
            // Ended after the driver answered: the answer may predate it.
            (Some(Touch::Ended { at: after, wrote: v("8") }), Some("8"), false),
            (Some(Touch::Ended { at: after, wrote: None }), Some("7"), false),
            // Ended before: judged once the cache holds what it wrote.
            (Some(Touch::Ended { at: before, wrote: v("8") }), Some("8"), true),
            (Some(Touch::Ended { at: before, wrote: v("8") }), Some("7"), false),
            (Some(Touch::Ended { at: before, wrote: None }), Some("7"), true),
        ];
        for (touch, cached, want) in cases {
            assert_eq!(may_judge(touch.as_ref(), pass, *cached), *want, "{touch:?} cached {cached:?}");
        }
    }

    #[test]
    fn a_sync_is_skipped_while_running_and_by_at_most_one_pass_after() {
        let s = Settling::new(true);
        let first = Instant::now();
        {
            let _sync = s.begin("va");
            s.wrote("va", Some("8".into()));
            assert!(!s.judge("va", first, Some("7")), "running");
        }
        // The pass that asked before the end skips it and keeps the touch.
        assert!(!s.judge("va", first, Some("8")));
        let second = Instant::now() + Duration::from_millis(1);
        // The cache has not seen the write: this pass skips it, once.
        assert!(!s.judge("va", second, Some("7")));
        assert!(s.judge("va", second, Some("7")), "the touch went with its one skip");
    }

    #[test]
    fn ended_touches_are_pruned_and_nothing_is_kept_when_disabled() {
        let s = Settling::new(true);
        drop(s.begin("gone"));
        s.prune(Instant::now() + Duration::from_millis(1));
        assert!(s.touches.lock().is_empty());
        let off = Settling::new(false);
        let sync = off.begin("va");
        off.wrote("va", Some("1".into()));
        assert!(off.judge("va", Instant::now(), None));
        drop(sync);
        assert!(off.touches.lock().is_empty());
    }
}
