//! Shared pieces of the benchmarks: QPS settings, the apiserver's own request
//! accounting (metrics snapshots and an APF FlowSchema that isolates the
//! sidecar's user), and the cluster identity setup.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim},
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};

use crate::cluster::ControlPlane;

/// The user the benchmarked sidecar runs as.
pub const SIDECAR_USER: &str = "csi-sidecar-bench";
/// The FlowSchema (and priority level) that counts exactly that user's requests.
pub const FLOW_SCHEMA: &str = "csi-sidecar-bench";

/// A client QPS setting of the sidecar.
#[derive(Clone, Debug, PartialEq)]
pub enum Qps {
    Default,
    Unlimited,
    Fixed(f64),
}

impl Qps {
    pub fn parse(s: &str) -> Result<Qps> {
        match s.trim() {
            "default" => Ok(Qps::Default),
            "unlimited" | "-1" => Ok(Qps::Unlimited),
            q => Ok(Qps::Fixed(q.parse().with_context(|| format!("--qps: {q:?}"))?)),
        }
    }
    pub fn label(&self) -> String {
        match self {
            Qps::Default => "default (5/10)".into(),
            Qps::Unlimited => "unlimited (-1)".into(),
            Qps::Fixed(q) => format!("{q}/{}", q * 2.0),
        }
    }
    pub fn short(&self) -> String {
        match self {
            Qps::Default => "default".into(),
            Qps::Unlimited => "unlimited".into(),
            Qps::Fixed(q) => format!("{q}"),
        }
    }
    pub fn flags(&self) -> Vec<String> {
        match self {
            Qps::Default => vec![],
            Qps::Unlimited => vec!["--kube-api-qps=-1".into()],
            Qps::Fixed(q) => vec![format!("--kube-api-qps={q}"), format!("--kube-api-burst={}", (q * 2.0).ceil())],
        }
    }
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// ---------------------------------------------------------------------------
// Prometheus text format
// ---------------------------------------------------------------------------

pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, k: &str) -> &str {
        self.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or("")
    }
}

/// Parses the samples of the metrics named in `keep` (exact names).
pub fn parse_metrics(text: &str, keep: &[&str]) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if !keep.contains(&name) {
            continue;
        }
        let mut labels = Vec::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            // key="value" pairs; values may contain escaped quotes and commas.
            let mut chars = body.char_indices().peekable();
            let mut key = String::new();
            let mut end = body.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '}' => {
                        end = i + 1;
                        break;
                    }
                    ',' | ' ' => {}
                    '=' => {
                        let mut val = String::new();
                        if chars.next().map(|(_, c)| c) == Some('"') {
                            while let Some((_, c)) = chars.next() {
                                match c {
                                    '\\' => {
                                        if let Some((_, e)) = chars.next() {
                                            val.push(if e == 'n' { '\n' } else { e });
                                        }
                                    }
                                    '"' => break,
                                    c => val.push(c),
                                }
                            }
                        }
                        labels.push((std::mem::take(&mut key), val));
                    }
                    c => key.push(c),
                }
            }
            rest = &body[end..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        out.push(Sample { name: name.to_string(), labels, value });
    }
    out
}

/// What the apiserver (and kube-controller-manager) counted at one moment.
#[derive(Default, Clone)]
pub struct Snap {
    /// apiserver_request_total by "VERB resource[/subresource] code".
    pub requests: BTreeMap<String, f64>,
    /// APF: requests of the sidecar's FlowSchema dispatched / rejected, wait sum and count.
    pub sidecar_dispatched: f64,
    pub sidecar_rejected: f64,
    pub sidecar_wait_sum: f64,
    pub sidecar_wait_count: f64,
    /// kube-controller-manager's client: requests, and seconds spent in its client-side rate limiter.
    pub kcm_requests: Option<f64>,
    pub kcm_throttled_secs: Option<f64>,
    /// kube-controller-manager's client requests by "METHOD code" (empty when n/a).
    pub kcm_by_code: BTreeMap<String, f64>,
}

pub struct Delta {
    pub requests: Vec<(String, f64)>,
    pub all_requests: f64,
    pub sidecar: f64,
    pub sidecar_rejected: f64,
    pub sidecar_mean_wait_ms: f64,
    pub kcm_requests: Option<f64>,
    pub kcm_throttled_secs: Option<f64>,
    /// kube-controller-manager's client requests by "METHOD code", when its metrics were read both times.
    pub kcm_by_code: Option<BTreeMap<String, f64>>,
}

/// The positive differences `after - before` per key.
fn map_delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

impl Delta {
    /// Requests of all clients whose "VERB resource code" key matches `pred`.
    pub fn requests_where(&self, pred: impl Fn(&str, &str, &str) -> bool) -> f64 {
        self.requests
            .iter()
            .filter(|(k, _)| {
                let mut parts = k.splitn(3, ' ');
                let (v, r, c) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                pred(v, r, c)
            })
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0 // an empty sum is -0.0
    }

    /// Write conflicts (409) and rejected writes (422) on `resource` (e.g.
    /// "persistentvolumes"): all clients, kube-controller-manager's share (if
    /// its metrics were readable), and the difference (the other clients').
    pub fn write_conflicts(&self, resource: &str) -> Conflicts {
        let all = self.requests_where(|v, r, c| {
            matches!(v, "PATCH" | "UPDATE" | "PUT")
                && r.split('/').next() == Some(resource)
                && matches!(c, "409" | "422")
        });
        let kcm = self.kcm_by_code.as_ref().map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    let (method, code) = k.split_once(' ').unwrap_or((k.as_str(), ""));
                    matches!(method, "PATCH" | "PUT") && matches!(code, "409" | "422")
                })
                .map(|(_, n)| n)
                .sum::<f64>()
                + 0.0
        });
        Conflicts { all, kcm, others: kcm.map(|k| (all - k).max(0.0)) }
    }
}

/// 409/422 responses to writes of one resource in a phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Conflicts {
    pub all: f64,
    /// kube-controller-manager's 409/422 to writes of any resource (its client metrics have no resource label).
    pub kcm: Option<f64>,
    /// `all - kcm`: the benchmarked sidecar's when no other client writes.
    pub others: Option<f64>,
}

impl Snap {
    pub fn delta(&self, before: &Snap) -> Delta {
        let mut requests: Vec<(String, f64)> = self
            .requests
            .iter()
            .map(|(k, v)| (k.clone(), v - before.requests.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        requests.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let wait_n = self.sidecar_wait_count - before.sidecar_wait_count;
        Delta {
            all_requests: requests.iter().map(|(_, d)| d).sum(),
            requests,
            sidecar: self.sidecar_dispatched - before.sidecar_dispatched,
            sidecar_rejected: self.sidecar_rejected - before.sidecar_rejected,
            sidecar_mean_wait_ms: if wait_n > 0.0 {
                (self.sidecar_wait_sum - before.sidecar_wait_sum) / wait_n * 1000.0
            } else {
                0.0
            },
            kcm_requests: self.kcm_requests.zip(before.kcm_requests).map(|(a, b)| a - b),
            kcm_throttled_secs: self.kcm_throttled_secs.zip(before.kcm_throttled_secs).map(|(a, b)| a - b),
            kcm_by_code: (!self.kcm_by_code.is_empty() && !before.kcm_by_code.is_empty())
                .then(|| map_delta(&self.kcm_by_code, &before.kcm_by_code)),
        }
    }
}

pub async fn get_text(client: &Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Snapshots once the sidecar has made no request for a second (at most 60 s):
/// requests it still had queued (events behind its rate limiter) count for the
/// phase that caused them.
pub async fn settled_snapshot(api: &Client, kcm: Option<&Client>) -> Result<Snap> {
    let start = Instant::now();
    let mut prev = snapshot(api, kcm).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let next = snapshot(api, kcm).await?;
        if next.sidecar_dispatched == prev.sidecar_dispatched || start.elapsed() > Duration::from_secs(60) {
            return Ok(next);
        }
        prev = next;
    }
}

pub async fn snapshot(api: &Client, kcm: Option<&Client>) -> Result<Snap> {
    let text = get_text(api, "/metrics").await.context("GET apiserver /metrics")?;
    let samples = parse_metrics(
        &text,
        &[
            "apiserver_request_total",
            "apiserver_flowcontrol_dispatched_requests_total",
            "apiserver_flowcontrol_rejected_requests_total",
            "apiserver_flowcontrol_request_wait_duration_seconds_sum",
            "apiserver_flowcontrol_request_wait_duration_seconds_count",
        ],
    );
    let mut snap = Snap::default();
    for s in &samples {
        let ours = s.label("flow_schema") == FLOW_SCHEMA;
        match s.name.as_str() {
            "apiserver_request_total" => {
                let res = match (s.label("resource"), s.label("subresource")) {
                    ("", _) => "(non-resource)".to_string(),
                    (r, "") => r.to_string(),
                    (r, sub) => format!("{r}/{sub}"),
                };
                *snap.requests.entry(format!("{} {res} {}", s.label("verb"), s.label("code"))).or_default() += s.value;
            }
            "apiserver_flowcontrol_dispatched_requests_total" if ours => snap.sidecar_dispatched += s.value,
            "apiserver_flowcontrol_rejected_requests_total" if ours => snap.sidecar_rejected += s.value,
            "apiserver_flowcontrol_request_wait_duration_seconds_sum" if ours => snap.sidecar_wait_sum += s.value,
            "apiserver_flowcontrol_request_wait_duration_seconds_count" if ours => snap.sidecar_wait_count += s.value,
            _ => {}
        }
    }
    if let Some(kcm) = kcm
        && let Ok(text) = get_text(kcm, "/metrics").await
    {
        let samples =
            parse_metrics(&text, &["rest_client_requests_total", "rest_client_rate_limiter_duration_seconds_sum"]);
        let sum = |n: &str| samples.iter().filter(|s| s.name == n).map(|s| s.value).sum::<f64>();
        snap.kcm_requests = Some(sum("rest_client_requests_total"));
        snap.kcm_throttled_secs = Some(sum("rest_client_rate_limiter_duration_seconds_sum"));
        for s in samples.iter().filter(|s| s.name == "rest_client_requests_total") {
            *snap.kcm_by_code.entry(format!("{} {}", s.label("method"), s.label("code"))).or_default() += s.value;
        }
    }
    Ok(snap)
}

/// Open WATCH requests per resource, from the apiserver's
/// `apiserver_longrunning_requests` gauge.
pub async fn open_watches(client: &Client) -> Result<BTreeMap<String, i64>> {
    let text = get_text(client, "/metrics").await.context("GET apiserver /metrics")?;
    let mut out = BTreeMap::new();
    for s in parse_metrics(&text, &["apiserver_longrunning_requests"]).iter().filter(|s| s.label("verb") == "WATCH") {
        *out.entry(s.label("resource").to_string()).or_insert(0) += s.value as i64;
    }
    Ok(out)
}

/// Starts the CSI mock driver (attach enabled) serving `driver` on `csi` and
/// waits for its socket.
pub async fn start_mock_driver(
    csi: &std::path::Path,
    driver: &str,
    node_id: &str,
    log_dir: &std::path::Path,
) -> Result<crate::process::Proc> {
    let args = vec![
        format!("--endpoint=unix://{}", csi.display()),
        format!("--name={driver}"),
        format!("--node-id={node_id}"),
    ];
    let mut proc =
        crate::process::Proc::spawn("csi-mock-driver", &crate::component_bin("csi-mock-driver"), &args, log_dir);
    let t = Instant::now();
    while !csi.exists() {
        if proc.try_exit().is_some() || t.elapsed() > Duration::from_secs(30) {
            bail!("the CSI mock driver did not come up; log:\n{}", proc.logs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(proc)
}

// ---------------------------------------------------------------------------
// Cluster setup
// ---------------------------------------------------------------------------

pub async fn kcm_client(cp: &ControlPlane) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(cp.kubeconfig())?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    cfg.cluster_url = cp.info().kcm_url.parse()?;
    Ok(Client::try_from(cfg)?)
}

/// RBAC for the sidecar's user, and an APF FlowSchema matching only that user
/// (on a priority level of its own, large enough never to queue it).
pub async fn setup_identity(client: &Client) -> Result<()> {
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-sidecar-bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SIDECAR_USER}],
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &crb).await?;
    let plc: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 100, "lendablePercent": 0,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 8, "queueLengthLimit": 200}}}},
    }))?;
    Api::<PriorityLevelConfiguration>::all(client.clone()).create(&PostParams::default(), &plc).await?;
    let fs: FlowSchema = serde_json::from_value(serde_json::json!({
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {
            "priorityLevelConfiguration": {"name": FLOW_SCHEMA},
            "matchingPrecedence": 50,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": SIDECAR_USER}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "clusterScope": true, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }))?;
    Api::<FlowSchema>::all(client.clone()).create(&PostParams::default(), &fs).await?;
    Ok(())
}

/// The sidecar's identity on `cp` ([`setup_identity`] as `admin`, then
/// [`check_accounting`]): the kubeconfig of [`SIDECAR_USER`].
pub async fn sidecar_kubeconfig(cp: &ControlPlane, admin: &Client) -> Result<std::path::PathBuf> {
    setup_identity(admin).await?;
    let identity = crate::cluster::Identity::user(SIDECAR_USER, &[]);
    let kubeconfig = cp.mint(&identity);
    check_accounting(admin, &cp.client_as(&identity).await).await?;
    Ok(kubeconfig)
}

/// Creates the namespace `name`.
pub async fn create_namespace(admin: &Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// Waits until requests of the sidecar's user are counted under its FlowSchema
/// (the APF configuration is picked up asynchronously).
pub async fn check_accounting(admin: &Client, as_sidecar: &Client) -> Result<()> {
    let start = Instant::now();
    loop {
        let before = snapshot(admin, None).await?;
        for _ in 0..5 {
            Api::<Namespace>::all(as_sidecar.clone()).list(&ListParams::default().limit(1)).await?;
        }
        let after = snapshot(admin, None).await?;
        let d = after.sidecar_dispatched - before.sidecar_dispatched;
        if d == 5.0 {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("APF accounting does not work: 5 requests of {SIDECAR_USER} counted as {d} under {FLOW_SCHEMA}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls `probe` every 200 ms until it says true; an error of the probe or
/// the timeout ends the benchmark.
pub async fn wait_for(what: &str, timeout: Duration, mut probe: impl AsyncFnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !probe().await? {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Bound claims of `pvcs` whose name starts with `prefix` ("" for all).
pub async fn bound_claims(pvcs: &Api<PersistentVolumeClaim>, prefix: &str) -> Result<usize> {
    let list = pvcs.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .count())
}

/// How many PersistentVolumes are bound to a claim whose name starts with
/// `prefix` (the provisioner's own part: kube-controller-manager's binder
/// then marks the claim Bound).
pub async fn claims_with_volume(pvs: &Api<PersistentVolume>, prefix: &str) -> Result<usize> {
    let list = pvs.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|v| v.spec.as_ref()?.claim_ref.as_ref()?.name.as_deref())
        .filter(|n| n.starts_with(prefix))
        .count())
}

/// A csi-sidecar process on the driver's socket `csi` with `kubeconfig`,
/// then `extra` (module names and flags); its log in `log`.
pub fn sidecar(
    name: &str,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    extra: &[String],
    log: &std::path::Path,
) -> crate::process::Proc {
    let mut args = vec![format!("--csi-address={}", csi.display()), format!("--kubeconfig={}", kubeconfig.display())];
    args.extend(extra.iter().cloned());
    crate::process::Proc::spawn(name, &crate::sidecar_bin(), &args, log)
}

/// [`sidecar`], then waits up to 2 minutes for `synced` in its log
/// (`what`: the wait's name in a timeout).
pub async fn synced_sidecar(
    name: &str,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    extra: &[String],
    log: &std::path::Path,
    (what, synced): (&str, &str),
) -> Result<crate::process::Proc> {
    let p = sidecar(name, csi, kubeconfig, extra, log);
    wait_for(what, Duration::from_secs(120), async || Ok(p.logs().contains(synced))).await?;
    Ok(p)
}

/// The median of the values that are not NaN (the mean of the middle two
/// for an even count); NaN when there are none.
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) { (v[m - 1] + v[m]) / 2.0 } else { v[m] }
}

/// What an idle sidecar holds: [`idle_rss`].
pub struct Idle {
    /// Seconds from the spawn until its log said `ready_line`.
    pub synced_secs: f64,
    /// VmRSS 5 s after that, MiB.
    pub rss: f64,
    /// VmHWM then, MiB.
    pub hwm: f64,
    /// The "Watch synced" lines' fields (kind, objects).
    pub watches: Vec<String>,
}

/// Spawns a csi-sidecar running `module` (see [`sidecar`]), waits until its
/// log says `ready_line` (its caches synced), lets the start-up settle for
/// 5 s and reads its memory; then stops it.
pub async fn idle_rss(
    module: &str,
    csi: &std::path::Path,
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
    ready_line: &str,
) -> Result<Idle> {
    let spawned = Instant::now();
    let mut p = sidecar(&format!("{module}-idle"), csi, kubeconfig, &[module.to_string()], log);
    wait_for(&format!("the idle {module}'s caches"), Duration::from_secs(300), async || {
        Ok(p.logs().contains(ready_line))
    })
    .await?;
    let synced_secs = spawned.elapsed().as_secs_f64();
    // Idle: what the caches hold once the start-up is over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kib = |field| crate::process::status_kib(p.pid(), field);
    let (rss, hwm) = (mib(kib("VmRSS:")), mib(kib("VmHWM:")));
    let watches = p
        .logs()
        .lines()
        .filter(|l| l.contains("Watch synced"))
        .map(|l| l.split("Watch synced").last().unwrap_or("").trim().to_string())
        .collect();
    p.terminate().await;
    Ok(Idle { synced_secs, rss, hwm, watches })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_conflicts_of_the_sidecar_are_all_clients_minus_the_controller_manager() {
        let before = Snap {
            requests: [("PATCH persistentvolumes 409".to_string(), 1.0)].into(),
            kcm_by_code: [("PATCH 409".to_string(), 1.0)].into(),
            ..Default::default()
        };
        let after = Snap {
            requests: [
                ("PATCH persistentvolumes 409".to_string(), 6.0),
                ("PUT persistentvolumes 422".to_string(), 2.0),
                ("PUT persistentvolumes/status 409".to_string(), 1.0),
                ("PATCH persistentvolumeclaims 409".to_string(), 4.0),
                ("PATCH persistentvolumes 200".to_string(), 9.0),
            ]
            .into(),
            kcm_by_code: [("PATCH 409".to_string(), 3.0), ("PATCH 200".to_string(), 5.0)].into(),
            ..Default::default()
        };
        let c = after.delta(&before).write_conflicts("persistentvolumes");
        assert_eq!(c.all, 8.0);
        assert_eq!(c.kcm, Some(2.0));
        assert_eq!(c.others, Some(6.0));
        assert_eq!(after.delta(&Snap::default()).write_conflicts("persistentvolumes").kcm, None);
    }

    #[test]
    fn parses_prometheus_text() {
        let text = "# HELP x\napiserver_request_total{code=\"201\",resource=\"persistentvolumes\",verb=\"POST\"} 7\n\
                    apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"a,b\\\"c\",priority_level=\"p\"} 3e0\n\
                    other 1\n";
        let s = parse_metrics(text, &["apiserver_request_total", "apiserver_flowcontrol_dispatched_requests_total"]);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label("verb"), "POST");
        assert_eq!(s[0].value, 7.0);
        assert_eq!(s[1].label("flow_schema"), "a,b\"c");
        assert_eq!(s[1].label("priority_level"), "p");
    }
}
