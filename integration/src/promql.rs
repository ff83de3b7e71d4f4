//! The metric and label names a PromQL expression uses, and whether a
//! scrape of `/metrics` has them: what `integration/tests/no_cluster/monitoring.rs`
//! checks the chart's dashboard and alerts with.
//!
//! The extractor is a tokenizer, not a parser (promtool parses the
//! expressions): it knows strings, range brackets, matchers, the grouping
//! clauses and which words are keywords, functions or aggregations; every
//! other word is a metric name. Grafana's `$variables` are skipped.

use std::collections::{BTreeMap, BTreeSet};

/// The names an expression uses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    /// Each metric name with the label names of its matchers.
    pub metrics: BTreeMap<String, BTreeSet<String>>,
    /// The labels of `by`, `without`, `on`, `ignoring`, `group_left` and
    /// `group_right` clauses.
    pub grouping: BTreeSet<String>,
}

/// Labels a scrape adds (Prometheus, the Prometheus Operator's
/// PodMonitor/ServiceMonitor targets) or a histogram's bucket bound: not
/// csi-sidecar's to export.
pub const SCRAPE_LABELS: &[&str] = &["job", "instance", "pod", "namespace", "container", "endpoint", "service", "le"];

const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"];
const AGGREGATIONS: &[&str] = &[
    "sum",
    "avg",
    "count",
    "min",
    "max",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
];

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

impl Lexer<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
        if self.peek() == Some(b'#') {
            while self.peek().is_some_and(|c| c != b'\n') {
                self.i += 1;
            }
            self.skip_space();
        }
    }

    fn ident(&mut self) -> String {
        let start = self.i;
        while self.peek().is_some_and(ident_char) {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// A quoted string at the cursor (", ' with escapes, ` raw); its text.
    fn string(&mut self) -> Result<String, String> {
        let quote = self.s[self.i];
        let start = self.i;
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err(format!("unterminated string at byte {start}")),
                Some(c) if c == quote => {
                    self.i += 1;
                    return Ok(String::from_utf8_lossy(&out).into_owned());
                }
                Some(b'\\') if quote != b'`' => {
                    out.extend(self.s.get(self.i + 1).copied());
                    self.i += 2;
                }
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// Skips from the cursor (an opening `open`) past its `close`.
    fn skip_past(&mut self, close: u8) -> Result<(), String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            self.i += 1;
            if c == close {
                return Ok(());
            }
        }
        Err(format!("no '{}' closes byte {start}", close as char))
    }

    /// A `{...}` matcher list at the cursor: its label names (the metric
    /// of a `__name__` matcher goes to `metric`).
    fn matchers(&mut self, metric: &mut Option<String>) -> Result<BTreeSet<String>, String> {
        let start = self.i;
        self.i += 1;
        let mut labels = BTreeSet::new();
        loop {
            self.skip_space();
            match self.peek() {
                None => return Err(format!("no '}}' closes byte {start}")),
                Some(b'}') => {
                    self.i += 1;
                    return Ok(labels);
                }
                Some(b',') => self.i += 1,
                Some(b'"' | b'\'' | b'`') => {
                    // A quoted metric name (Prometheus 3's UTF-8 form): {"name", l="v"}.
                    *metric = Some(self.string()?);
                }
                Some(c) if ident_start(c) => {
                    let label = self.ident();
                    self.skip_space();
                    while self.peek().is_some_and(|c| matches!(c, b'=' | b'!' | b'~')) {
                        self.i += 1;
                    }
                    self.skip_space();
                    if !matches!(self.peek(), Some(b'"' | b'\'' | b'`')) {
                        return Err(format!("matcher {label} without a quoted value at byte {}", self.i));
                    }
                    let value = self.string()?;
                    if label == "__name__" {
                        *metric = Some(value);
                    } else {
                        labels.insert(label);
                    }
                }
                Some(b'$') => self.variable(),
                Some(c) => return Err(format!("unexpected '{}' in matchers at byte {}", c as char, self.i)),
            }
        }
    }

    /// A label list `( a, b )` at the cursor.
    fn label_list(&mut self) -> Result<Vec<String>, String> {
        let start = self.i;
        self.i += 1;
        let mut out = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None => return Err(format!("no ')' closes byte {start}")),
                Some(b')') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b',') => self.i += 1,
                Some(c) if ident_start(c) => out.push(self.ident()),
                Some(c) => return Err(format!("unexpected '{}' in a label list at byte {}", c as char, self.i)),
            }
        }
    }

    /// A Grafana variable: `$name`, `${name}`, `${name:format}`.
    fn variable(&mut self) {
        self.i += 1;
        if self.peek() == Some(b'{') {
            while self.peek().is_some_and(|c| c != b'}') {
                self.i += 1;
            }
            self.i += 1;
        } else {
            self.ident();
        }
    }

    fn next_is(&mut self, c: u8) -> bool {
        self.skip_space();
        self.peek() == Some(c)
    }
}

/// The metric and label names `expr` uses.
pub fn names(expr: &str) -> Result<Names, String> {
    let mut lx = Lexer { s: expr.as_bytes(), i: 0 };
    let mut out = Names::default();
    loop {
        lx.skip_space();
        let Some(c) = lx.peek() else { return Ok(out) };
        match c {
            b'"' | b'\'' | b'`' => {
                lx.string()?;
            }
            b'[' => lx.skip_past(b']')?,
            b'$' => lx.variable(),
            b'{' => {
                let mut metric = None;
                let labels = lx.matchers(&mut metric)?;
                let metric = metric.ok_or_else(|| format!("a selector without a metric name in {expr:?}"))?;
                out.metrics.entry(metric).or_default().extend(labels);
            }
            c if c.is_ascii_digit() || c == b'.' => {
                while lx.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'_') {
                    lx.i += 1;
                }
            }
            c if ident_start(c) => {
                let word = lx.ident();
                let lower = word.to_ascii_lowercase();
                if GROUPING.contains(&lower.as_str()) {
                    if lx.next_is(b'(') {
                        out.grouping.extend(lx.label_list()?);
                    }
                } else if KEYWORDS.contains(&lower.as_str()) || AGGREGATIONS.contains(&lower.as_str()) {
                } else if lx.next_is(b'(') {
                    // A function; its arguments are read as they come.
                } else if lx.next_is(b'{') {
                    let mut named = None;
                    let labels = lx.matchers(&mut named)?;
                    out.metrics.entry(word).or_default().extend(labels);
                } else {
                    out.metrics.entry(word).or_default();
                }
            }
            _ => lx.i += 1,
        }
    }
}

/// A Grafana query variable's `label_values(<selector>, <label>)`: the
/// selector and the label; `None` for any other query.
pub fn label_values(query: &str) -> Option<(&str, &str)> {
    let inner = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}

/// What a `/metrics` scrape exports: each sample name with the label names
/// its samples carry, and the families a `# TYPE` line declares.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exported {
    /// Sample name (`x_bucket`, `x_total`, ...) → label names.
    pub samples: BTreeMap<String, BTreeSet<String>>,
    /// Family → type (`counter`, `gauge`, `histogram`, ...).
    pub types: BTreeMap<String, String>,
}

impl Exported {
    /// Parses Prometheus' text format; lines it cannot read are errors.
    pub fn parse(text: &str) -> Result<Exported, String> {
        let mut out = Exported::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                if let (Some(family), Some(kind)) = (words.next(), words.next()) {
                    out.types.insert(family.into(), kind.into());
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let mut lx = Lexer { s: line.as_bytes(), i: 0 };
            if !lx.peek().is_some_and(ident_start) {
                return Err(format!("not a sample line: {line:?}"));
            }
            let name = lx.ident();
            let labels = if lx.peek() == Some(b'{') {
                let mut quoted = None;
                lx.matchers(&mut quoted).map_err(|e| format!("{e} in {line:?}"))?
            } else {
                BTreeSet::new()
            };
            out.samples.entry(name).or_default().extend(labels);
        }
        Ok(out)
    }

    /// The family a sample name belongs to, if a `# TYPE` line declares it
    /// (`x_bucket`, `x_sum`, `x_count` of a histogram or summary `x`).
    fn declared_family<'a>(&self, sample: &'a str) -> Option<&'a str> {
        if self.types.contains_key(sample) {
            return Some(sample);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let family = sample.strip_suffix(suffix)?;
            let kind = self.types.get(family)?;
            matches!(kind.as_str(), "histogram" | "summary").then_some(family)
        })
    }

    /// What `used` needs that this scrape lacks, one line each; scrape
    /// labels ([`SCRAPE_LABELS`]) are not csi-sidecar's and not checked.
    pub fn missing(&self, used: &Names) -> Vec<String> {
        let own = |l: &String| !SCRAPE_LABELS.contains(&l.as_str());
        let mut out = Vec::new();
        let mut present = Vec::new();
        for (metric, labels) in &used.metrics {
            let Some(have) = self.samples.get(metric) else {
                out.push(match self.declared_family(metric) {
                    Some(f) => format!("metric {metric} (family {f} is declared but has no series)"),
                    None => format!("metric {metric}"),
                });
                continue;
            };
            present.push(have);
            for l in labels.iter().filter(|l| own(l)).filter(|l| !have.contains(*l)) {
                out.push(format!("label {l} of metric {metric}"));
            }
        }
        // A grouping label must be on a metric of the expression; with
        // none of them present there is nothing to check it against.
        if !present.is_empty() {
            for l in used.grouping.iter().filter(|l| own(l)) {
                if !present.iter().any(|have| have.contains(l)) {
                    out.push(format!("label {l} (grouping) on none of its metrics"));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn metrics(items: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        items.iter().map(|(m, l)| (m.to_string(), set(l))).collect()
    }

    /// An expression, its metrics with their matcher labels, its grouping labels.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])], &'a [&'a str]);

    #[test]
    fn names_of_expressions() {
        let cases: &[Case] = &[
            ("rate(x_total{a=\"1\",b!~'2'}[5m])", &[("x_total", &["a", "b"])], &[]),
            (
                "histogram_quantile(0.99, sum by (le, method_name) (rate(h_bucket{job=~\".*\",pod=~\"$pod\"}[$__rate_interval])))",
                &[("h_bucket", &["job", "pod"])],
                &["le", "method_name"],
            ),
            ("a > 5 and on (n) b == 0", &[("a", &[]), ("b", &[])], &["n"]),
            ("sum without (x) (y) / ignoring(z) group_left(w) q", &[("y", &[]), ("q", &[])], &["x", "z", "w"]),
            ("SUM BY (Name) (rate(m[1m]))", &[("m", &[])], &["Name"]),
            ("max(m) by (name) == 0", &[("m", &[])], &["name"]),
            ("{__name__=\"foo\", l=\"v\"}", &[("foo", &["l"])], &[]),
            ("{\"foo.bar\", l=\"v\"}", &[("foo.bar", &["l"])], &[]),
            ("x{l=\"sum(y) by (z) {w}\"}", &[("x", &["l"])], &[]),
            ("100 * x offset 5m > 1e3 or vector(Inf)", &[("x", &[])], &[]),
            ("# a comment naming nothing\nx{a=\"b\"} # and another\n", &[("x", &["a"])], &[]),
            ("rate(x[5m:1m] @ start())", &[("x", &[])], &[]),
            ("x{l=\"a \\\" quote\"} > bool 0", &[("x", &["l"])], &[]),
            ("topk(3, x{${sel:raw}})", &[("x", &[])], &[]),
        ];
        for (expr, want_metrics, want_grouping) in cases {
            let got = names(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert_eq!(got.metrics, metrics(want_metrics), "{expr}");
            assert_eq!(got.grouping, set(want_grouping), "{expr}");
        }
    }

    #[test]
    fn broken_expressions_are_errors() {
        for expr in ["x{l=\"v\"", "x{l=\"v}", "rate(x[5m)", "sum by (a", "{l=\"v\"}", "x{l=v}"] {
            assert!(names(expr).is_err(), "{expr} should not read");
        }
    }

    #[test]
    fn grafana_label_values() {
        assert_eq!(label_values("label_values(m{job=\"a,b\"}, pod)"), Some(("m{job=\"a,b\"}", "pod")));
        assert_eq!(label_values(" label_values(m, pod) "), Some(("m", "pod")));
        assert_eq!(label_values("query_result(m)"), None);
    }

    const SCRAPE: &str = "# HELP h A histogram.\n# TYPE h histogram\n\
        h_bucket{m=\"/csi.v1.Controller/CreateVolume\",le=\"0.1\"} 1\n\
        h_sum{m=\"x\"} 0.1\nh_count{m=\"x\"} 1\n\
        # TYPE empty_total counter\n\n\
        g{name=\"a,\\\"b}\",other=\"\"} 0\nplain 3\n";

    #[test]
    fn exposition_samples_labels_and_types() {
        let e = Exported::parse(SCRAPE).expect("parse");
        assert_eq!(e.samples["h_bucket"], set(&["m", "le"]));
        assert_eq!(e.samples["g"], set(&["name", "other"]));
        assert_eq!(e.samples["plain"], set(&[]));
        assert_eq!(e.types["h"], "histogram");
        assert!(!e.samples.contains_key("empty_total"));
        assert!(Exported::parse("g{name=\"a} 1\n").is_err());
    }

    #[test]
    fn missing_names() {
        let e = Exported::parse(SCRAPE).expect("parse");
        let cases: &[(&str, &[&str])] = &[
            ("sum by (le, m) (rate(h_bucket{job=\"j\",pod=~\".+\"}[5m]))", &[]),
            ("rate(h_count{m!=\"\"}[5m]) / rate(h_sum[5m])", &[]),
            ("g{name=\"a\"} and plain", &[]),
            ("max by (name, pod) (g)", &[]),
            ("h_total", &["metric h_total"]),
            ("rate(empty_total[5m])", &["metric empty_total (family empty_total is declared but has no series)"]),
            ("g{nmae=\"a\"}", &["label nmae of metric g"]),
            ("sum by (module) (g)", &["label module (grouping) on none of its metrics"]),
            ("sum by (module) (absent_metric)", &["metric absent_metric"]),
            ("sum by (m) (plain) + h_sum", &[]),
        ];
        for (expr, want) in cases {
            let got = e.missing(&names(expr).expect("names"));
            assert_eq!(got, want.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{expr}");
        }
    }
}
