//! The waiting-object gauges, computed from the ledgers at each scrape (so
//! they cost nothing between scrapes): how many objects each module holds
//! not done, per reason, and how long the longest-waiting one has waited.

use std::{fmt::Write as _, time::Instant};

use super::{Ledger, Registry, WaitingFor};

/// Metric names.
pub mod names {
    /// Not-done objects per module and reason.
    pub const OBJECTS_WAITING: &str = "csi_sidecar_objects_waiting";
    /// Seconds the longest-waiting not-done object of a module has waited.
    pub const LONGEST_WAIT: &str = "csi_sidecar_object_longest_wait_seconds";
}

/// Registers the rendering of `registry`'s ledgers with the process metrics.
pub(super) fn export(registry: Registry) {
    crate::metrics::add_text_source(std::sync::Arc::new(move |out: &mut String| {
        render(&registry.ledgers(), Instant::now(), out);
    }));
}

/// Renders both families for `ledgers` at `now` (every module and reason
/// has a series, zero included, so alerts see the series before anything
/// waits).
pub fn render(ledgers: &[Ledger], now: Instant, out: &mut String) {
    if ledgers.is_empty() {
        return;
    }
    let mut counts = Vec::with_capacity(ledgers.len());
    for l in ledgers {
        let mut per = [0usize; WaitingFor::ALL.len()];
        let mut longest = 0.0f64;
        l.for_each(|_, e| {
            if let Some(i) = WaitingFor::ALL.iter().position(|w| *w == e.waiting_for) {
                per[i] += 1;
            }
            longest = longest.max(e.waited(now).as_secs_f64());
        });
        counts.push((l.module(), per, longest));
    }
    let _ = writeln!(
        out,
        "# HELP {} Objects a module holds that are not done, by what they wait for.\n# TYPE {} gauge",
        names::OBJECTS_WAITING,
        names::OBJECTS_WAITING
    );
    for (module, per, _) in &counts {
        for (w, n) in WaitingFor::ALL.iter().zip(per) {
            let _ =
                writeln!(out, "{}{{module=\"{module}\",waiting_for=\"{}\"}} {n}", names::OBJECTS_WAITING, w.as_str());
        }
    }
    let _ = writeln!(
        out,
        "# HELP {} Seconds the longest-waiting not-done object of a module has waited (0: none).\n# TYPE {} gauge",
        names::LONGEST_WAIT,
        names::LONGEST_WAIT
    );
    for (module, _, longest) in &counts {
        let _ = writeln!(out, "{}{{module=\"{module}\"}} {longest:.3}", names::LONGEST_WAIT);
    }
}
