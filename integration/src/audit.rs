//! The apiserver's own record of one user's requests: kube-apiserver's
//! audit log at `Metadata` level for that user only, read back as (time,
//! program) pairs. APF's counters say how many requests a user sent, but not
//! which module of a combined process sent them; the audit log has each
//! request's `User-Agent` (`csi-provisioner/<version> ...` per module).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// The launcher arguments (`cluster serve ...`) and files that make the
/// apiserver write the audit log of `user`'s requests into `dir`.
pub struct AuditLog {
    /// The log file (JSON lines), written by the apiserver.
    pub path: PathBuf,
    /// `--apiserver-arg` pairs for [`crate::cluster::ControlPlane::spawn_launcher`].
    pub launcher_args: Vec<String>,
}

impl AuditLog {
    /// Writes the policy into `dir`: `user`'s requests at `Metadata`, when
    /// complete (a watch when it ends), nothing else.
    pub fn for_user(dir: &Path, user: &str) -> Result<AuditLog> {
        let policy = dir.join("audit-policy.yaml");
        let text = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\n\
             rules:\n- level: Metadata\n  users: [{user:?}]\n- level: None\n"
        );
        std::fs::write(&policy, text).with_context(|| format!("write {}", policy.display()))?;
        let path = dir.join("audit.log");
        let launcher_args = vec![
            "--apiserver-arg".into(),
            format!("--audit-policy-file={}", policy.display()),
            "--apiserver-arg".into(),
            format!("--audit-log-path={}", path.display()),
        ];
        Ok(AuditLog { path, launcher_args })
    }

    /// Every logged request.
    pub fn requests(&self) -> Result<Vec<Request>> {
        let text = std::fs::read_to_string(&self.path).with_context(|| format!("read {}", self.path.display()))?;
        Ok(text.lines().filter_map(parse_line).collect())
    }

    /// The log's current length: the start of a [`AuditLog::count_since`].
    pub fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// The requests completed since `mark`, by `classify(program)`.
    pub fn count_since(&self, mark: u64, classify: impl Fn(&str) -> String) -> Result<BTreeMap<String, f64>> {
        let bytes = std::fs::read(&self.path).with_context(|| format!("read {}", self.path.display()))?;
        let from = usize::try_from(mark).unwrap_or(usize::MAX).min(bytes.len());
        Ok(count_lines(&String::from_utf8_lossy(&bytes[from..]), classify))
    }
}

/// Counts the requests of the audit events (JSON lines) by
/// `classify(program)` ([`Request::program`]); other lines are skipped.
pub fn count_lines(text: &str, classify: impl Fn(&str) -> String) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in text.lines().filter_map(parse_line) {
        *out.entry(classify(&r.program)).or_insert(0.0) += 1.0;
    }
    out
}

/// One request the apiserver logged.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Seconds since the Unix epoch when the apiserver received it.
    pub at: f64,
    /// The program of its `User-Agent` (`csi-provisioner`, ...).
    pub program: String,
    /// An Event write (what a budget defers), not work a user waits for.
    pub event: bool,
    /// `<verb> <resource>[/<subresource>] <code>`, e.g.
    /// `patch persistentvolumeclaims/status 200` (what a request was, for
    /// breakdowns).
    pub kind: String,
}

/// One audit event line → the request, once complete (stage
/// `ResponseComplete`; a `Panic` line repeats a request).
fn parse_line(line: &str) -> Option<Request> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["stage"].as_str() != Some("ResponseComplete") {
        return None;
    }
    let at = parse_rfc3339(v["requestReceivedTimestamp"].as_str()?)?;
    let agent = v["userAgent"].as_str().unwrap_or("");
    let uri = v["requestURI"].as_str().unwrap_or("");
    let write = !matches!(v["verb"].as_str(), Some("get" | "list" | "watch"));
    let event = write && uri.split('?').next().unwrap_or("").split('/').any(|s| s == "events");
    let object = &v["objectRef"];
    let resource = match (object["resource"].as_str(), object["subresource"].as_str()) {
        (Some(r), Some(sub)) => format!("{r}/{sub}"),
        (Some(r), None) => r.to_string(),
        (None, _) => "(non-resource)".to_string(),
    };
    let code = v["responseStatus"]["code"].as_i64().unwrap_or(0);
    let mut kind = format!("{} {resource} {code}", v["verb"].as_str().unwrap_or("?"));
    if let Some(message) = v["responseStatus"]["message"].as_str().filter(|_| code >= 400) {
        kind.push_str(&format!(" ({message})"));
    }
    Some(Request { at, program: agent.split('/').next().unwrap_or("").to_string(), event, kind })
}

/// `2026-12-02T17:30:00.123456Z` → seconds since the Unix epoch (UTC only,
/// as the apiserver writes them).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (h, min) = (t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?);
    let sec = t.next()?.parse::<f64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// The largest excess of `times` (sorted or not) over a bucket of `qps`
/// and `burst` among all windows between two requests (negative: every
/// window within it), with `slack` seconds added to each window for the
/// clocks' jitter.
pub fn worst_excess(times: &[f64], qps: f64, burst: f64, slack: f64) -> f64 {
    let mut t: Vec<f64> = times.to_vec();
    t.sort_by(f64::total_cmp);
    let mut worst = f64::NEG_INFINITY;
    for i in 0..t.len() {
        for j in i..t.len() {
            let n = (j - i + 1) as f64;
            worst = worst.max(n - (burst + qps * (t[j] - t[i] + slack)));
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_read_to_the_microsecond() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:01.5Z"), Some(951_868_801.5));
        let a = parse_rfc3339("2026-12-31T23:59:59.999999Z").expect("a");
        let b = parse_rfc3339("2027-01-01T00:00:00.000001Z").expect("b");
        assert!((b - a - 0.000002).abs() < 1e-6, "{}", b - a);
        assert_eq!(parse_rfc3339("2026-12-02 17:00:00"), None);
    }

    #[test]
    fn an_audit_line_gives_the_time_and_the_program() {
        let line = r#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","requestURI":"/api/v1/namespaces/n/persistentvolumeclaims/c/status","objectRef":{"resource":"persistentvolumeclaims","subresource":"status"},"responseStatus":{"code":409},"userAgent":"csi-resizer/0.1.0 (linux/amd64) csi-sidecar","requestReceivedTimestamp":"1970-01-01T00:00:02.000000Z"}"#;
        let want = Request {
            at: 2.0,
            program: "csi-resizer".into(),
            event: false,
            kind: "patch persistentvolumeclaims/status 409".into(),
        };
        assert_eq!(parse_line(line), Some(want.clone()));
        let event = line
            .replace("persistentvolumeclaims/c/status", "events")
            .replace("patch", "create")
            .replace(r#""resource":"persistentvolumeclaims","subresource":"status""#, r#""resource":"events""#);
        let kind = "create events 409".to_string();
        assert_eq!(parse_line(&event), Some(Request { event: true, kind, ..want }));
        assert_eq!(parse_line("not json"), None);
    }

    #[test]
    fn the_window_check_catches_a_burst_above_the_bucket() {
        assert!(worst_excess(&[0.0; 10], 5.0, 10.0, 0.0) <= 0.0, "the burst");
        assert!(worst_excess(&[0.0; 11], 5.0, 10.0, 0.0) > 0.0);
        let steady: Vec<f64> = (0..50).map(|i| f64::from(i) * 0.2).collect();
        assert!(worst_excess(&steady, 5.0, 10.0, 0.0) <= 0.0);
        let fast: Vec<f64> = (0..50).map(|i| f64::from(i) * 0.1).collect();
        assert!(worst_excess(&fast, 5.0, 10.0, 0.0) > 0.0);
    }

    #[test]
    fn counts_completed_requests_by_user_agent() {
        let text = r#"{"stage":"ResponseComplete","requestReceivedTimestamp":"1970-01-01T00:00:01Z","verb":"create","userAgent":"csi-provisioner/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseComplete","requestReceivedTimestamp":"1970-01-01T00:00:01Z","verb":"patch","userAgent":"csi-resizer/0.1 (linux/amd64) csi-sidecar"}
{"stage":"Panic","requestReceivedTimestamp":"1970-01-01T00:00:01Z","verb":"patch","userAgent":"csi-resizer/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseComplete","requestReceivedTimestamp":"1970-01-01T00:00:01Z","verb":"update","userAgent":"csi-provisioner/0.1 (linux/amd64) csi-sidecar"}
{"stage":"ResponseCom"#;
        let by = count_lines(text, str::to_string);
        assert_eq!(by, [("csi-provisioner".to_string(), 2.0), ("csi-resizer".to_string(), 1.0)].into());
    }
}
