//! The node process's documented memory figures (docs/benchmarks.md, "Node
//! process") and the check `bench-node` makes against them, so a growth shows
//! in the change that causes it. The documentation is the only place the
//! figures are kept: updating them there moves the limit.
//!
//! Two kinds of figure, two tolerances. The anonymous memory (heap, stacks:
//! the process's own state) does not depend on the link's layout and may be
//! [`STATE_TOLERANCE`] above its figure. The total RSS is mostly text pages,
//! and which of them a process touches moves with LLVM's inlining whenever
//! any code changes, however far from the node paths, until
//! `src/node-text.order` is regenerated: it may be [`LAYOUT_TOLERANCE`] above
//! its figure, which covers a list gone stale that way but not one that no
//! longer matches (a dependency change renames every function).

use std::fmt;

/// The documentation file holding the figures, relative to the workspace root.
pub const DOCS: &str = "docs/benchmarks.md";

/// How far above its documented figure the anonymous memory may be.
pub const STATE_TOLERANCE: f64 = 0.10;

/// How far above its documented figure the total RSS may be. After a
/// controller-only change the list measured +28 % (6.4 / 7.0 MiB idle / peak
/// for 5.0 / 5.5); a build without it +112 % (10.6 / 11.2).
pub const LAYOUT_TOLERANCE: f64 = 0.50;

/// The least a figure may move by: the anonymous memory is about half a MiB,
/// where 10 % is a dozen pages and two runs differ by as much (0.45 to 0.52).
pub const MIN_SLACK_MIB: f64 = 0.25;

/// The largest measurement `documented` allows at `tolerance`.
pub fn limit(documented_mib: f64, tolerance: f64) -> f64 {
    documented_mib + (documented_mib * tolerance).max(MIN_SLACK_MIB)
}

/// The first cell of the table rows holding the figures.
const IDLE_ROW: &str = "RSS idle (registered)";
const PEAK_ROW: &str = "Peak RSS over the run (VmHWM)";
const ANON_IDLE_ROW: &str = "Anonymous RSS idle (RssAnon)";
const ANON_PEAK_ROW: &str = "Anonymous RSS peak (largest RssAnon sampled)";

/// The run the figures are documented for: `bench-node --requests 100000
/// --concurrency 16` on `/healthz`.
pub const DOCUMENTED_RUN: Run<'static> = Run { requests: 100_000, concurrency: 16, path: "/healthz" };

/// The shape of a `bench-node` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run<'a> {
    /// Total `/healthz` requests.
    pub requests: u64,
    /// Concurrent keep-alive clients.
    pub concurrency: u64,
    /// The path requested.
    pub path: &'a str,
}

/// The documented figures, in MiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeFigures {
    /// RSS once registered, before any request.
    pub idle_mib: f64,
    /// VmHWM after the run.
    pub peak_mib: f64,
    /// RssAnon once registered.
    pub anon_idle_mib: f64,
    /// The largest RssAnon sampled during the run.
    pub anon_peak_mib: f64,
}

/// The documentation does not hold a figure in the expected form.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FigureError {
    /// No table row starts with the cell.
    #[error("{DOCS} has no table row \"| {0} |\"")]
    NoRow(&'static str),
    /// The row's csi-sidecar cell has no `**N MiB**`.
    #[error("{DOCS}: the csi-sidecar cell of \"{0}\" has no \"**N MiB**\" figure")]
    NoFigure(&'static str),
}

/// Reads both figures from the text of [`DOCS`].
pub fn parse(markdown: &str) -> Result<NodeFigures, FigureError> {
    Ok(NodeFigures {
        idle_mib: figure(markdown, IDLE_ROW)?,
        peak_mib: figure(markdown, PEAK_ROW)?,
        anon_idle_mib: figure(markdown, ANON_IDLE_ROW)?,
        anon_peak_mib: figure(markdown, ANON_PEAK_ROW)?,
    })
}

/// The first bold `N MiB` of the second cell of the row whose first cell is `row`.
fn figure(markdown: &str, row: &'static str) -> Result<f64, FigureError> {
    let line =
        markdown.lines().find(|l| l.split('|').nth(1).map(str::trim) == Some(row)).ok_or(FigureError::NoRow(row))?;
    let cell = line.split('|').nth(2).unwrap_or_default();
    let bold = cell.split("**").nth(1).ok_or(FigureError::NoFigure(row))?;
    bold.trim().strip_suffix("MiB").and_then(|n| n.trim().parse().ok()).ok_or(FigureError::NoFigure(row))
}

/// One figure over its limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Exceeded {
    /// Which figure: the row's first cell.
    pub figure: &'static str,
    /// Measured, in MiB.
    pub measured_mib: f64,
    /// Documented, in MiB.
    pub documented_mib: f64,
    /// Which kind of memory, and so its tolerance.
    pub kind: Kind,
}

/// The two kinds of figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The anonymous memory: the process's own state.
    State,
    /// The total RSS, which a stale text order also moves.
    Total,
}

impl Kind {
    /// The fraction above the documented figure allowed.
    pub fn tolerance(self) -> f64 {
        match self {
            Kind::State => STATE_TOLERANCE,
            Kind::Total => LAYOUT_TOLERANCE,
        }
    }
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: measured {:.2} MiB, above its limit of {:.2} MiB (the {:.2} MiB of {DOCS} + {:.0} %, at least {MIN_SLACK_MIB} MiB)",
            self.figure,
            self.measured_mib,
            limit(self.documented_mib, self.kind.tolerance()),
            self.documented_mib,
            self.kind.tolerance() * 100.0,
        )
    }
}

/// The figures of `measured` above their [`limit`]: `documented` plus its
/// tolerance, at least [`MIN_SLACK_MIB`] ([`STATE_TOLERANCE`] for the anonymous memory,
/// [`LAYOUT_TOLERANCE`] for the total). Only a run of the
/// [`DOCUMENTED_RUN`]'s shape is checked: other shapes have no documented
/// figures.
pub fn check(measured: NodeFigures, documented: NodeFigures) -> Vec<Exceeded> {
    [
        (IDLE_ROW, measured.idle_mib, documented.idle_mib, Kind::Total),
        (PEAK_ROW, measured.peak_mib, documented.peak_mib, Kind::Total),
        (ANON_IDLE_ROW, measured.anon_idle_mib, documented.anon_idle_mib, Kind::State),
        (ANON_PEAK_ROW, measured.anon_peak_mib, documented.anon_peak_mib, Kind::State),
    ]
    .into_iter()
    .filter(|(_, m, d, kind)| *m > limit(*d, kind.tolerance()))
    .map(|(figure, measured_mib, documented_mib, kind)| Exceeded { figure, measured_mib, documented_mib, kind })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
| Measure | csi-sidecar | Upstream (livenessprobe + node-driver-registrar) |
|---|---|---|
| RSS idle (registered) | **4.5 MiB** | about 40 MiB idle together |
| Peak RSS over the run (VmHWM) | **5.2 MiB**: 5.1 / 5.2 / 5.2 MiB at 10 / 50 / 100 % | |
| Anonymous RSS idle (RssAnon) | **1.2 MiB** | |
| Anonymous RSS peak (largest RssAnon sampled) | **1.6 MiB** | |
";

    fn figures(idle_mib: f64, peak_mib: f64, anon_idle_mib: f64, anon_peak_mib: f64) -> NodeFigures {
        NodeFigures { idle_mib, peak_mib, anon_idle_mib, anon_peak_mib }
    }

    #[test]
    fn the_figures_are_read_from_the_table() {
        assert_eq!(parse(TABLE), Ok(figures(4.5, 5.2, 1.2, 1.6)));
    }

    #[test]
    fn a_missing_row_or_figure_is_an_error_naming_it() {
        let totals = "| RSS idle (registered) | **4.5 MiB** | |\n| Peak RSS over the run (VmHWM) | **5 MiB** | |\n";
        let no_anon_peak = format!("{totals}| Anonymous RSS idle (RssAnon) | **1 MiB** | |\n");
        let cases: &[(&str, FigureError)] = &[
            ("", FigureError::NoRow(IDLE_ROW)),
            ("| RSS idle (registered) | **4.5 MiB** | |", FigureError::NoRow(PEAK_ROW)),
            ("| RSS idle (registered) | 4.5 MiB | |", FigureError::NoFigure(IDLE_ROW)),
            ("| RSS idle (registered) | **4.5 MB** | |", FigureError::NoFigure(IDLE_ROW)),
            ("| RSS idle (registered) | **about 4 MiB** | |", FigureError::NoFigure(IDLE_ROW)),
            (totals, FigureError::NoRow(ANON_IDLE_ROW)),
            (&no_anon_peak, FigureError::NoRow(ANON_PEAK_ROW)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).as_ref(), Err(want), "{text:?}");
        }
    }

    #[test]
    fn the_documented_repository_file_parses() {
        let text = std::fs::read_to_string(crate::workspace_root().join(DOCS)).expect("read the docs");
        let f = parse(&text).expect("the node figures");
        assert!(f.idle_mib > 0.0 && f.peak_mib >= f.idle_mib, "{f:?}");
        assert!(f.anon_idle_mib > 0.0 && f.anon_peak_mib >= f.anon_idle_mib, "{f:?}");
        assert!(f.anon_idle_mib < f.idle_mib && f.anon_peak_mib < f.peak_mib, "{f:?}");
    }

    #[test]
    fn the_total_may_drift_with_the_layout_and_the_state_only_by_its_slack() {
        let doc = figures(5.0, 6.0, 0.5, 3.0);
        let names = |measured| check(measured, doc).into_iter().map(|e| e.figure).collect::<Vec<_>>();
        let table: &[(NodeFigures, &[&str])] = &[
            (figures(4.0, 5.0, 0.4, 2.9), &[]),
            // A text order gone stale with an ordinary change: +28 % total,
            // the same state.
            (figures(6.5, 7.8, 0.5, 3.0), &[]),
            // At the limits: +50 % total; +0.25 MiB (more than 10 % of 0.5),
            // +10 % of 3.0 (more than 0.25).
            (figures(7.5, 9.0, 0.75, 3.3), &[]),
            (figures(7.51, 9.0, 0.5, 3.0), &[IDLE_ROW]),
            (figures(7.5, 9.01, 0.5, 3.0), &[PEAK_ROW]),
            // No text order at all: +112 %.
            (figures(10.6, 13.0, 0.5, 3.0), &[IDLE_ROW, PEAK_ROW]),
            // New per-process state, hidden in the total's allowance.
            (figures(5.2, 6.3, 0.76, 3.0), &[ANON_IDLE_ROW]),
            (figures(5.2, 6.3, 0.5, 3.31), &[ANON_PEAK_ROW]),
            (figures(8.0, 9.5, 1.5, 3.5), &[IDLE_ROW, PEAK_ROW, ANON_IDLE_ROW, ANON_PEAK_ROW]),
        ];
        for (measured, want) in table {
            assert_eq!(names(*measured), *want, "{measured:?}");
        }
        // The anonymous figures are the process's state, the others the total.
        let kinds = check(figures(8.0, 9.5, 1.5, 3.5), doc).into_iter().map(|e| (e.figure, e.kind)).collect::<Vec<_>>();
        assert_eq!(
            kinds,
            [
                (IDLE_ROW, Kind::Total),
                (PEAK_ROW, Kind::Total),
                (ANON_IDLE_ROW, Kind::State),
                (ANON_PEAK_ROW, Kind::State)
            ]
        );
    }

    #[test]
    fn the_message_names_the_figure_and_the_limit() {
        let e = Exceeded { figure: IDLE_ROW, measured_mib: 8.0, documented_mib: 5.0, kind: Kind::Total };
        assert_eq!(
            e.to_string(),
            "RSS idle (registered): measured 8.00 MiB, above its limit of 7.50 MiB (the 5.00 MiB of docs/benchmarks.md + 50 %, at least 0.25 MiB)"
        );
        let e = Exceeded { figure: ANON_IDLE_ROW, measured_mib: 0.8, documented_mib: 0.5, kind: Kind::State };
        assert_eq!(
            e.to_string(),
            "Anonymous RSS idle (RssAnon): measured 0.80 MiB, above its limit of 0.75 MiB (the 0.50 MiB of docs/benchmarks.md + 10 %, at least 0.25 MiB)"
        );
    }
}
