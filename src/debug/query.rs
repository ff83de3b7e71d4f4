//! `/debug/objects`: the query, its filters and pages, and the JSON it
//! answers (pure; the HTTP handler in `http.rs` only gathers the ledgers).
//! The same types are what `csi-sidecar explain` reads back.

use std::{
    fmt,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use super::{Entry, EntryKey, LeaderView, Ledger, WaitingFor};

/// Objects per page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 500;
/// The largest page.
pub const MAX_LIMIT: usize = 5000;

/// The query string of `/debug/objects`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Only this module's objects.
    pub module: Option<String>,
    /// Only this kind (`PersistentVolumeClaim`, or `pvc`, `va`, `vsc`, ...).
    pub kind: Option<String>,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this name.
    pub name: Option<String>,
    /// At most this many objects (default [`DEFAULT_LIMIT`], at most [`MAX_LIMIT`]).
    pub limit: Option<usize>,
    /// Where the previous page ended (its `continue` token).
    pub after: Option<Cursor>,
}

/// Where a page ended: its last entry, in the endpoint's order (module,
/// kind, key, queue, compared as a tuple). Its text, the `continue` token,
/// is the four joined by `|`, each with `%` and `|` percent-encoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cursor {
    /// The module.
    pub module: String,
    /// The API kind.
    pub kind: String,
    /// The queue's key (`namespace/name` or `name`).
    pub key: String,
    /// The queue.
    pub queue: String,
}

impl Cursor {
    /// The four parts, in the order entries are compared.
    fn as_tuple(&self) -> (&str, &str, &str, &str) {
        (&self.module, &self.kind, &self.key, &self.queue)
    }

    /// The cursor a `continue` token names (`None`: not a token).
    pub fn decode(token: &str) -> Option<Cursor> {
        let mut parts = token.split('|').map(unescape);
        let cursor =
            Cursor { module: parts.next()??, kind: parts.next()??, key: parts.next()??, queue: parts.next()?? };
        parts.next().is_none().then_some(cursor)
    }
}

/// `%25` and `%7C` decoded; any other `%` is not a token's.
fn unescape(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "25" => '%',
            "7C" | "7c" => '|',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let escape = |s: &str| s.replace('%', "%25").replace('|', "%7C");
        let (module, kind, key, queue) = self.as_tuple();
        write!(f, "{}|{}|{}|{}", escape(module), escape(kind), escape(key), escape(queue))
    }
}

impl TryFrom<String> for Cursor {
    type Error = QueryError;
    fn try_from(token: String) -> Result<Self, QueryError> {
        Cursor::decode(&token).ok_or(QueryError::Continue(token))
    }
}

impl From<Cursor> for String {
    fn from(c: Cursor) -> String {
        c.to_string()
    }
}

/// One module's summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleView {
    /// The module.
    pub module: String,
    /// Its leadership (`None`: it runs without leader election).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leader: Option<LeaderView>,
    /// How many objects it holds that are not done.
    pub not_done: usize,
    /// Where it is in its start-up.
    #[serde(default)]
    pub phase: super::Phase,
}

/// The CSI call in flight for an object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallView {
    /// gRPC method, as in `csi_sidecar_operations_seconds{method_name}`.
    pub method: String,
    /// When it started (RFC 3339).
    pub since: String,
    /// Seconds it has run.
    pub seconds: f64,
}

/// One not-done object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectView {
    /// The module holding it.
    pub module: String,
    /// Its API kind.
    pub kind: String,
    /// Its namespace, for namespaced kinds.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The queue syncing it.
    pub queue: String,
    /// What it waits for.
    pub waiting_for: WaitingFor,
    /// Consecutive failed attempts.
    pub attempts: u32,
    /// The last error (a Warning event's text).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_error: Option<String>,
    /// When it is tried again (RFC 3339), if it will be by itself.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_retry: Option<String>,
    /// Seconds until then.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_retry_in_seconds: Option<f64>,
    /// The CSI call in flight.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub csi_call: Option<CallView>,
    /// Since when it is not done (RFC 3339).
    pub since: String,
    /// Seconds since then.
    pub waiting_seconds: f64,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Page {
    /// The CSI driver this process serves, once discovered.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub driver: Option<String>,
    /// Every module of the process.
    pub modules: Vec<ModuleView>,
    /// The objects of this page, ordered by module, kind, namespace, name
    /// and queue (an object two queues of a module hold is listed twice).
    pub objects: Vec<ObjectView>,
    /// How many objects match the filters (over all pages).
    pub matching: usize,
    /// The token of the next page, when there is one.
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none", default)]
    pub after: Option<Cursor>,
}

/// The API kind an alias names (`pvc` → `PersistentVolumeClaim`), or the
/// text as it is.
pub fn kind_of(alias: &str) -> String {
    let known = [
        ("PersistentVolumeClaim", &["pvc", "pvcs", "persistentvolumeclaim", "persistentvolumeclaims"][..]),
        ("PersistentVolume", &["pv", "pvs", "persistentvolume", "persistentvolumes"]),
        ("VolumeAttachment", &["va", "volumeattachment", "volumeattachments"]),
        ("VolumeSnapshot", &["vs", "volumesnapshot", "volumesnapshots"]),
        ("VolumeSnapshotContent", &["vsc", "volumesnapshotcontent", "volumesnapshotcontents"]),
        ("VolumeGroupSnapshotContent", &["vgsc", "volumegroupsnapshotcontent", "volumegroupsnapshotcontents"]),
    ];
    let lower = alias.to_ascii_lowercase();
    known
        .iter()
        .find(|(_, aliases)| aliases.contains(&lower.as_str()))
        .map_or_else(|| alias.to_string(), |(kind, _)| (*kind).to_string())
}

/// `namespace/name` → (Some(namespace), name); `name` → (None, name).
pub fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// RFC 3339 text of a wall-clock time (UTC, whole seconds).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    let secs = |d: Duration| (d.as_millis() as f64) / 1000.0;
    match to.duration_since(from) {
        Ok(d) => secs(d),
        Err(e) => -secs(e.duration()),
    }
}

/// Clock readings of one answer.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Wall clock.
    pub wall: SystemTime,
    /// Monotonic clock.
    pub mono: Instant,
}

/// Whether `module`'s entry `key` passes the filters.
fn matches(q: &Query, module: &str, key: &EntryKey) -> bool {
    let (ns, name) = split_key(&key.1);
    q.module.as_deref().is_none_or(|m| m == module)
        && q.kind.as_deref().is_none_or(|k| kind_of(k) == key.0)
        && q.namespace.as_deref().is_none_or(|n| ns == Some(n))
        && q.name.as_deref().is_none_or(|n| n == name)
}

/// One page of the ledgers' entries passing `q` (pure apart from reading
/// the ledgers under their locks). Modules are ordered by name, entries by
/// kind and key within a module.
pub fn page(q: &Query, ledgers: &[Ledger], now: Now) -> Page {
    page_of(q, None, ledgers, now)
}

/// [`page`], naming the driver.
pub fn page_of(q: &Query, driver: Option<String>, ledgers: &[Ledger], now: Now) -> Page {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let mut sorted: Vec<&Ledger> = ledgers.iter().collect();
    sorted.sort_by_key(|l| l.module());
    let mut modules = Vec::with_capacity(sorted.len());
    let mut objects = Vec::new();
    let (mut matching, mut remaining) = (0, 0);
    let mut last = None;
    for ledger in sorted {
        let module = ledger.module();
        modules.push(ModuleView {
            module: module.to_string(),
            leader: ledger.leader(),
            not_done: ledger.len(),
            phase: ledger.phase(),
        });
        ledger.for_each(|key, entry| {
            if !matches(q, module, key) {
                return;
            }
            matching += 1;
            if q.after.as_ref().is_some_and(|c| (module, key.0, key.1.as_str(), entry.queue) <= c.as_tuple()) {
                // Served on an earlier page.
                return;
            }
            remaining += 1;
            if objects.len() < limit {
                objects.push(view(module, key, entry, now));
                last = Some((module, key.0, key.1.clone(), entry.queue));
            }
        });
    }
    let more = objects.len() < remaining;
    let after = last.filter(|_| more).map(|(module, kind, key, queue)| Cursor {
        module: module.to_string(),
        kind: kind.to_string(),
        key,
        queue: queue.to_string(),
    });
    Page { driver, modules, objects, matching, after }
}

fn view(module: &str, key: &EntryKey, e: &Entry, now: Now) -> ObjectView {
    let (namespace, name) = split_key(&key.1);
    ObjectView {
        module: module.to_string(),
        kind: key.0.to_string(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
        queue: e.queue.to_string(),
        waiting_for: e.waiting_for,
        attempts: e.attempts,
        last_error: e.last_error.clone(),
        next_retry: e.next_retry.map(rfc3339),
        next_retry_in_seconds: e.next_retry.map(|t| seconds_between(now.wall, t).max(0.0)),
        csi_call: e.csi_call.map(|(method, since)| CallView {
            method: method.to_string(),
            since: rfc3339(since),
            seconds: seconds_between(since, now.wall).max(0.0),
        }),
        since: rfc3339(e.since),
        waiting_seconds: e.waited(now.mono).as_secs_f64(),
    }
}

/// A bad query string: names the parameter.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A parameter the endpoint does not know.
    #[error("unknown parameter {0:?}: use module, kind, namespace, name, limit or continue")]
    Unknown(String),
    /// `limit` is not a positive number.
    #[error("limit {0:?}: want a number from 1 to {MAX_LIMIT}")]
    Limit(String),
    /// `continue` is not a token a page gave.
    #[error("continue {0:?}: not a token a page gave (module|kind|key|queue)")]
    Continue(String),
    /// Bad percent-encoding.
    #[error("parameter {0:?} is not valid percent-encoded UTF-8")]
    Encoding(String),
}

/// `%XX` and `+` decoded.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

impl Query {
    /// Parses `module=..&kind=..&namespace=..&name=..&limit=..&continue=..`
    /// (empty values are no filter).
    pub fn parse(raw: &str) -> Result<Query, QueryError> {
        let mut q = Query::default();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k).ok_or_else(|| QueryError::Encoding(k.to_string()))?;
            let value = percent_decode(v).ok_or_else(|| QueryError::Encoding(key.clone()))?;
            let slot = match key.as_str() {
                "module" => &mut q.module,
                "kind" => &mut q.kind,
                "namespace" => &mut q.namespace,
                "name" => &mut q.name,
                "continue" => {
                    q.after = match value.as_str() {
                        "" => None,
                        token => Some(Cursor::decode(token).ok_or(QueryError::Continue(value))?),
                    };
                    continue;
                }
                "limit" => {
                    let n: usize = value.parse().map_err(|_| QueryError::Limit(value.clone()))?;
                    if n == 0 || n > MAX_LIMIT {
                        return Err(QueryError::Limit(value));
                    }
                    q.limit = Some(n);
                    continue;
                }
                _ => return Err(QueryError::Unknown(key)),
            };
            *slot = Some(value).filter(|v| !v.is_empty());
        }
        Ok(q)
    }

    /// The query string of this query (for clients; inverse of [`parse`](Self::parse)).
    pub fn to_query_string(&self) -> String {
        let enc = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        let limit = self.limit.map(|n| n.to_string());
        let after = self.after.as_ref().map(Cursor::to_string);
        [
            ("module", self.module.as_deref()),
            ("kind", self.kind.as_deref()),
            ("namespace", self.namespace.as_deref()),
            ("name", self.name.as_deref()),
            ("limit", limit.as_deref()),
            ("continue", after.as_deref()),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", enc(v))))
        .collect::<Vec<_>>()
        .join("&")
    }
}
