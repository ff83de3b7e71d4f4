//! The waiting-object gauges, computed from the ledgers at each scrape (so
//! they cost nothing between scrapes): how many objects each module holds
//! not done, and how long the longest-waiting one has waited, per reason.
//!
//! Both are per reason so that an alert can leave out the normal waits
//! (`scheduler`: a WaitForFirstConsumer claim whose pod is not scheduled
//! yet; `populator`: a claim an external populator provisions), which last
//! as long as the cluster's users make them; `max without (waiting_for)` of
//! the longest wait is the module's.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use super::{Ledger, Registry, WaitingFor};

/// Metric names.
pub mod names {
    /// Not-done objects per module and reason.
    pub const OBJECTS_WAITING: &str = "csi_sidecar_objects_waiting";
    /// Seconds the longest-waiting not-done object of a module has waited,
    /// per reason.
    pub const LONGEST_WAIT: &str = "csi_sidecar_object_longest_wait_seconds";
}

/// Registers the rendering of `registry`'s ledgers with the process metrics.
pub(super) fn export(registry: Registry) {
    crate::metrics::add_text_source(std::sync::Arc::new(move |out: &mut String| {
        render(&registry.ledgers(), Instant::now(), out);
    }));
}

/// Per reason (in the order of [`WaitingFor::ALL`]): how many objects wait
/// for it and the longest wait among them (zero: none).
pub type Summary = [(usize, Duration); WaitingFor::ALL.len()];

/// The gauges' values for one module's objects, given as what each waits
/// for and how long it has waited (pure).
pub fn summarize(objects: impl IntoIterator<Item = (WaitingFor, Duration)>) -> Summary {
    let mut out = [(0, Duration::ZERO); WaitingFor::ALL.len()];
    for (w, waited) in objects {
        if let Some(i) = WaitingFor::ALL.iter().position(|x| *x == w) {
            out[i].0 += 1;
            out[i].1 = out[i].1.max(waited);
        }
    }
    out
}

/// Renders both families for `ledgers` at `now` (every module and reason
/// has a series, zero included, so alerts see the series before anything
/// waits).
pub fn render(ledgers: &[Ledger], now: Instant, out: &mut String) {
    if ledgers.is_empty() {
        return;
    }
    let summaries: Vec<(&str, Summary)> = ledgers
        .iter()
        .map(|l| {
            let mut objects = Vec::new();
            l.for_each(|_, e| objects.push((e.waiting_for, e.waited(now))));
            (l.module(), summarize(objects))
        })
        .collect();
    let _ = writeln!(
        out,
        "# HELP {} Objects a module holds that are not done, by what they wait for.\n# TYPE {} gauge",
        names::OBJECTS_WAITING,
        names::OBJECTS_WAITING
    );
    for (module, per) in &summaries {
        for (w, (n, _)) in WaitingFor::ALL.iter().zip(per) {
            let _ =
                writeln!(out, "{}{{module=\"{module}\",waiting_for=\"{}\"}} {n}", names::OBJECTS_WAITING, w.as_str());
        }
    }
    let _ = writeln!(
        out,
        "# HELP {} Seconds the longest-waiting not-done object of a module has waited, by what it waits for now \
         (0: none).\n# TYPE {} gauge",
        names::LONGEST_WAIT,
        names::LONGEST_WAIT
    );
    for (module, per) in &summaries {
        for (w, (_, longest)) in WaitingFor::ALL.iter().zip(per) {
            let _ = writeln!(
                out,
                "{}{{module=\"{module}\",waiting_for=\"{}\"}} {:.3}",
                names::LONGEST_WAIT,
                w.as_str(),
                longest.as_secs_f64()
            );
        }
    }
}
