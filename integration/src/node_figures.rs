//! The node process's documented memory figures (docs/benchmarks.md, "Node
//! process") and the check `bench-node` makes against them: a measured RSS
//! more than [`TOLERANCE`] above its documented figure fails the run, so a
//! drift (a stale `src/node-text.order`, new per-process state) shows in the
//! change that causes it. The documentation is the only place the figures
//! are kept: updating them there moves the limit.

use std::fmt;

/// The documentation file holding the figures, relative to the workspace root.
pub const DOCS: &str = "docs/benchmarks.md";

/// How far above its documented figure a measurement may be.
pub const TOLERANCE: f64 = 0.10;

/// The first cell of the table rows holding the figures.
const IDLE_ROW: &str = "RSS idle (registered)";
const PEAK_ROW: &str = "Peak RSS over the run (VmHWM)";

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
    Ok(NodeFigures { idle_mib: figure(markdown, IDLE_ROW)?, peak_mib: figure(markdown, PEAK_ROW)? })
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
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: measured {:.1} MiB, more than {:.0} % above the {:.1} MiB of {DOCS} (limit {:.2} MiB)",
            self.figure,
            self.measured_mib,
            TOLERANCE * 100.0,
            self.documented_mib,
            limit(self.documented_mib)
        )
    }
}

fn limit(documented_mib: f64) -> f64 {
    documented_mib * (1.0 + TOLERANCE)
}

/// The figures of `measured` that exceed `documented` by more than
/// [`TOLERANCE`]. Only a run of the [`DOCUMENTED_RUN`]'s shape is checked:
/// other shapes have no documented figures.
pub fn check(measured: NodeFigures, documented: NodeFigures) -> Vec<Exceeded> {
    [(IDLE_ROW, measured.idle_mib, documented.idle_mib), (PEAK_ROW, measured.peak_mib, documented.peak_mib)]
        .into_iter()
        .filter(|(_, m, d)| *m > limit(*d))
        .map(|(figure, measured_mib, documented_mib)| Exceeded { figure, measured_mib, documented_mib })
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
";

    #[test]
    fn the_figures_are_read_from_the_table() {
        assert_eq!(parse(TABLE), Ok(NodeFigures { idle_mib: 4.5, peak_mib: 5.2 }));
    }

    #[test]
    fn a_missing_row_or_figure_is_an_error_naming_it() {
        let cases: &[(&str, FigureError)] = &[
            ("", FigureError::NoRow(IDLE_ROW)),
            ("| RSS idle (registered) | **4.5 MiB** | |", FigureError::NoRow(PEAK_ROW)),
            ("| RSS idle (registered) | 4.5 MiB | |", FigureError::NoFigure(IDLE_ROW)),
            ("| RSS idle (registered) | **4.5 MB** | |", FigureError::NoFigure(IDLE_ROW)),
            ("| RSS idle (registered) | **about 4 MiB** | |", FigureError::NoFigure(IDLE_ROW)),
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
    }

    #[test]
    fn only_figures_more_than_ten_percent_above_fail() {
        let doc = NodeFigures { idle_mib: 5.0, peak_mib: 6.0 };
        let m = |idle_mib, peak_mib| NodeFigures { idle_mib, peak_mib };
        let names = |measured| check(measured, doc).into_iter().map(|e| e.figure).collect::<Vec<_>>();
        let table: &[(NodeFigures, &[&str])] = &[
            (m(4.0, 5.0), &[]),
            (m(5.5, 6.6), &[]),
            (m(5.51, 6.6), &[IDLE_ROW]),
            (m(5.5, 6.61), &[PEAK_ROW]),
            (m(7.5, 8.1), &[IDLE_ROW, PEAK_ROW]),
        ];
        for (measured, want) in table {
            assert_eq!(names(*measured), *want, "{measured:?}");
        }
    }

    #[test]
    fn the_message_names_the_figure_and_the_limit() {
        let e = Exceeded { figure: IDLE_ROW, measured_mib: 7.5, documented_mib: 5.0 };
        assert_eq!(
            e.to_string(),
            "RSS idle (registered): measured 7.5 MiB, more than 10 % above the 5.0 MiB of docs/benchmarks.md (limit 5.50 MiB)"
        );
    }
}
