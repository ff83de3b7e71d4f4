//! The first benchmark: per scenario (PVC count × client QPS setting), a
//! fresh provisioner provisions and deletes N claims; its results and their table.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Result;
use csi_sidecar_integration::{
    bench::{Delta, Qps, median, mib, settled_snapshot, snapshot},
    kube_support::{pvc, storage_class, unique_name},
    process::status_kib,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};

use super::{
    ANN_STORAGE_PROVISIONER, DRIVER, create_retrying, meta,
    sidecar::Env,
    watches::{Spread, latencies, pct, watch_claims, watch_pvs},
};

/// The measurements of one run of a scenario (N PVCs at one QPS setting).
#[derive(Default, Clone)]
pub struct ScenarioResult {
    n: usize,
    qps: String,
    create_s: f64,
    create_errors: usize,
    pub pv_s: Option<f64>,
    annotated_s: Option<f64>,
    ann_lat_p50: f64,
    ann_lat_p95: f64,
    /// The provisioner's own latency: claim annotated → its PV.
    ann_to_pv: Spread,
    /// Events of the provisioner's component, counts summed: Provisioning, ProvisioningSucceeded.
    events_provisioning: i32,
    events_succeeded: i32,
    pub bound_s: Option<f64>,
    pv_lat_p50: f64,
    pv_lat_p95: f64,
    bound_lat_p50: f64,
    bound_lat_p95: f64,
    pub req_per_vol: f64,
    rejected: f64,
    apf_wait_ms: f64,
    pub del_s: Option<f64>,
    del_req_per_vol: f64,
    /// 409/422 answers to PV writes during deletion: all clients, and without kube-controller-manager's.
    del_conflicts_all: f64,
    del_conflicts_sidecar: Option<f64>,
    synced_ms: f64,
    rss_idle: f64,
    rss_bound: f64,
    rss_end: f64,
    pub hwm: f64,
    log_problem_lines: usize,
    pub notes: Vec<String>,
}

fn breakdown(title: &str, d: &Delta, per: usize) -> String {
    let mut s = format!(
        "  {title}: sidecar {} requests ({:.2}/volume; APF rejected {}, mean APF wait {:.1} ms); all clients {}; \
         kube-controller-manager {} requests, {} s in its client-side rate limiter\n",
        d.sidecar,
        d.sidecar / per.max(1) as f64,
        d.sidecar_rejected,
        d.sidecar_mean_wait_ms,
        d.all_requests,
        d.kcm_requests.map_or("n/a".into(), |v| format!("{v}")),
        d.kcm_throttled_secs.map_or("n/a".into(), |v| format!("{v:.1}")),
    );
    s.push_str("    apiserver_request_total delta, all clients (verb resource code: count):\n");
    for (k, v) in d.requests.iter().take(25) {
        let _ = writeln!(s, "      {k}: {v}");
    }
    s
}

pub async fn scenario(env: &Env, n: usize, qps: &Qps, run: usize, details: &mut String) -> Result<ScenarioResult> {
    let admin = &env.admin;
    let tag = format!("{n}-{}-r{run}", qps.short());
    let ns_name = unique_name(&format!("bench-{tag}"));
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    let sc_name = ns_name.clone();
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class(&sc_name, DRIVER)).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let pv_api: Api<PersistentVolume> = Api::all(admin.clone());

    let sidecar = env.start_sidecar(&format!("sidecar-{tag}"), qps).await?;
    let pid = sidecar.pid();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut r = ScenarioResult {
        n,
        qps: qps.label(),
        synced_ms: sidecar.synced_after.as_secs_f64() * 1000.0,
        rss_idle: mib(status_kib(pid, "VmRSS:")),
        ..Default::default()
    };
    let (pvc_w, annotated_seen, bound_seen) = watch_claims(&pvcs).await?;
    let (pv_w, pv_seen) = watch_pvs(&pv_api, &sc_name).await?;
    let timeout = Duration::from_secs(env.args.timeout_secs);

    // --- provisioning ---
    let before = snapshot(admin, env.kcm.as_ref()).await?;
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let errors = Arc::new(Mutex::new(0usize));
    let t0 = Instant::now();
    let creator = {
        let (pvcs, created_at, errors, sc, c) =
            (pvcs.clone(), created_at.clone(), errors.clone(), sc_name.clone(), env.args.creators.max(1));
        tokio::spawn(async move {
            stream::iter(0..n)
                .map(|i| {
                    let (pvcs, created_at, errors, sc) = (&pvcs, &created_at, &errors, &sc);
                    async move {
                        let name = format!("pvc-{i:05}");
                        let t = Instant::now();
                        create_retrying(pvcs, &pvc(&name, Some(sc), "1Mi"), errors).await?;
                        created_at.lock().unwrap_or_else(|e| e.into_inner()).insert(name, t);
                        Ok::<_, anyhow::Error>(())
                    }
                })
                .buffer_unordered(c)
                .try_collect::<Vec<_>>()
                .await?;
            Ok::<_, anyhow::Error>(t0.elapsed())
        })
    };
    let mut creator = Some(creator);
    let mut last_print = Instant::now();
    loop {
        if let Some(c) = &creator
            && c.is_finished()
            && let Some(c) = creator.take()
        {
            let d = c.await??;
            r.create_s = d.as_secs_f64();
        }
        if r.annotated_s.is_none() && annotated_seen.len() >= n {
            r.annotated_s = Some(t0.elapsed().as_secs_f64());
        }
        if r.pv_s.is_none() && pv_seen.len() >= n {
            r.pv_s = Some(t0.elapsed().as_secs_f64());
        }
        if bound_seen.len() >= n && creator.is_none() {
            r.bound_s = Some(t0.elapsed().as_secs_f64());
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "  [{tag}] {:>5.0} s: created {}, with PV {}, bound {}, sidecar RSS {:.1} MiB",
                t0.elapsed().as_secs_f64(),
                created_at.lock().map(|m| m.len()).unwrap_or(0),
                pv_seen.len(),
                bound_seen.len(),
                mib(status_kib(pid, "VmRSS:"))
            );
        }
        if t0.elapsed() > timeout {
            let created = created_at.lock().map(|m| m.len()).unwrap_or(0);
            let stuck: Vec<String> = pvc_w
                .store
                .state()
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
                .take(10)
                .map(|c| {
                    let name = c.metadata.name.clone().unwrap_or_default();
                    format!("{name} (PV {})", if pv_seen.contains(&name) { "exists" } else { "missing" })
                })
                .collect();
            r.notes.push(format!(
                "provisioning TIMED OUT after {timeout:?}: created {created}, with PV {}, bound {}; not bound e.g. {}",
                pv_seen.len(),
                bound_seen.len(),
                stuck.join(", ")
            ));
            if let Some(c) = creator.take() {
                c.abort();
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.create_errors = *errors.lock().unwrap_or_else(|e| e.into_inner());
    {
        let created = created_at.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (pv, bound, ann) = (pv_seen.snapshot(), bound_seen.snapshot(), annotated_seen.snapshot());
        let lat = |seen: &HashMap<String, Instant>| {
            let v = latencies(&created, seen);
            (pct(&v, 0.5), pct(&v, 0.95))
        };
        (r.pv_lat_p50, r.pv_lat_p95) = lat(&pv);
        (r.bound_lat_p50, r.bound_lat_p95) = lat(&bound);
        (r.ann_lat_p50, r.ann_lat_p95) = lat(&ann);
        r.ann_to_pv = Spread::of(&latencies(&ann, &pv));
        // The last arrival, not the poll that noticed it.
        let last =
            |m: &HashMap<String, Instant>| m.values().max().map(|t| t.saturating_duration_since(t0).as_secs_f64());
        r.pv_s = r.pv_s.and(last(&pv));
        r.bound_s = r.bound_s.and(last(&bound));
        r.annotated_s = r.annotated_s.and(last(&ann));
    }
    let after = settled_snapshot(admin, env.kcm.as_ref()).await?;
    let prov = after.delta(&before);
    r.req_per_vol = prov.sidecar / n as f64;
    r.rejected = prov.sidecar_rejected;
    r.apf_wait_ms = prov.sidecar_mean_wait_ms;
    r.rss_bound = mib(status_kib(pid, "VmRSS:"));
    let _ = writeln!(details, "### {n} PVCs, QPS {} (run {run})\n\n```", qps.label());
    let _ = writeln!(
        details,
        "  kube-controller-manager annotated every PVC with {ANN_STORAGE_PROVISIONER} after {} s \
         (create→annotation p50 {:.2} s, p95 {:.2} s); every PVC had a PV after {} s; all Bound after {} s",
        r.annotated_s.map_or("-".into(), |v| format!("{v:.1}")),
        r.ann_lat_p50,
        r.ann_lat_p95,
        r.pv_s.map_or("-".into(), |v| format!("{v:.1}")),
        r.bound_s.map_or("-".into(), |v| format!("{v:.1}")),
    );
    details.push_str(&breakdown("provisioning", &prov, n));
    let events_api = Api::<Event>::namespaced(admin.clone(), &ns_name);
    let (ev, waited) =
        wait_for_events(&events_api, &env.args.event_component, n, Duration::from_secs(env.args.event_wait_secs))
            .await?;
    (r.events_provisioning, r.events_succeeded) = (ev.provisioning, ev.succeeded);
    let _ = writeln!(
        details,
        "  events of {:?} (counts summed), read {:.1} s after the sidecar went quiet: Provisioning {}/{n}, \
         ProvisioningSucceeded {}/{n}",
        env.args.event_component,
        waited.as_secs_f64(),
        ev.provisioning,
        ev.succeeded
    );
    if ev.provisioning < n as i32 || ev.succeeded < n as i32 {
        r.notes.push(format!(
            "{n}/{}: events missing after {} s: Provisioning {}/{n}, ProvisioningSucceeded {}/{n}",
            qps.short(),
            env.args.event_wait_secs,
            ev.provisioning,
            ev.succeeded
        ));
    }

    // --- deletion ---
    let before = snapshot(admin, env.kcm.as_ref()).await?;
    let t1 = Instant::now();
    pvcs.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    let mut last_print = Instant::now();
    loop {
        let pvs_left = pv_w
            .store
            .state()
            .iter()
            .filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(sc_name.as_str()))
            .count();
        let pvcs_left = pvc_w.store.state().len();
        if pvs_left == 0 && pvcs_left == 0 {
            r.del_s = Some(t1.elapsed().as_secs_f64());
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "  [{tag}] deleting {:>5.0} s: PVCs left {pvcs_left}, PVs left {pvs_left}",
                t1.elapsed().as_secs_f64()
            );
        }
        if t1.elapsed() > timeout {
            let phases: BTreeMap<String, usize> = pv_w
                .store
                .state()
                .iter()
                .filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(sc_name.as_str()))
                .fold(BTreeMap::new(), |mut m, pv| {
                    let phase = pv.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    let fin = pv.metadata.finalizers.clone().unwrap_or_default().join("+");
                    *m.entry(format!("{phase} finalizers={fin}")).or_default() += 1;
                    m
                });
            r.notes.push(format!(
                "deletion TIMED OUT after {timeout:?}: PVCs left {pvcs_left}, PVs left {pvs_left} by phase {phases:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = settled_snapshot(admin, env.kcm.as_ref()).await?;
    let del = after.delta(&before);
    r.del_req_per_vol = del.sidecar / n as f64;
    let conflicts = del.write_conflicts("persistentvolumes");
    (r.del_conflicts_all, r.del_conflicts_sidecar) = (conflicts.all, conflicts.others);
    details.push_str(&breakdown("deletion", &del, n));
    let _ = writeln!(
        details,
        "  deletion: 409/422 answers to PV writes: all clients {}, kube-controller-manager (any resource) {}, \
         so the sidecar's ≈ {} ({} per deleted volume); each is a request counted in its req/deleted volume",
        conflicts.all,
        conflicts.kcm.map_or("n/a".into(), |v| v.to_string()),
        conflicts.others.map_or("n/a".into(), |v| v.to_string()),
        conflicts.others.map_or("n/a".into(), |v| format!("{:.2}", v / n as f64)),
    );
    r.rss_end = mib(status_kib(pid, "VmRSS:"));
    r.hwm = mib(status_kib(pid, "VmHWM:"));

    // --- what went wrong, if anything ---
    let (problems, samples) = sidecar.log_problems();
    r.log_problem_lines = problems;
    if problems > 0 {
        let _ = writeln!(details, "  sidecar log: {problems} WARN/ERROR/throttling lines, by message:");
        for (m, c) in samples.iter().take(8) {
            let _ = writeln!(details, "    {c} x {m}");
        }
    }
    let events = events_api.list(&ListParams::default()).await?;
    let EventCounts { by_reason, warn_sample, .. } = count_events(&events.items, &env.args.event_component);
    let _ = writeln!(details, "  events in the namespace (type reason (component): count): {by_reason:?}");
    for (k, m) in &warn_sample {
        let _ = writeln!(details, "    e.g. {k}: {m}");
        r.notes.push(format!("warning events {k}"));
    }
    let stop = sidecar.stop().await;
    let _ = writeln!(
        details,
        "  sidecar: caches synced {:.0} ms after spawn; {stop}; PVC create errors (retried): {}",
        r.synced_ms, r.create_errors
    );
    details.push_str("```\n\n");
    drop(pvc_w);
    drop(pv_w);
    let _ = Api::<StorageClass>::all(admin.clone()).delete(&sc_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(admin.clone()).delete(&ns_name, &DeleteParams::default()).await;
    Ok(r)
}

/// Events in a namespace, counts summed.
#[derive(Default)]
struct EventCounts {
    /// The provisioner component's `Provisioning` and `ProvisioningSucceeded`.
    provisioning: i32,
    succeeded: i32,
    /// Every event by "type reason (component)".
    by_reason: BTreeMap<String, i32>,
    /// A message of each Warning kind.
    warn_sample: BTreeMap<String, String>,
}

fn event_component(e: &Event) -> &str {
    e.source
        .as_ref()
        .and_then(|s| s.component.as_deref())
        .filter(|c| !c.is_empty())
        .or(e.reporting_component.as_deref())
        .unwrap_or_default()
}

fn count_events(events: &[Event], component: &str) -> EventCounts {
    let mut c = EventCounts::default();
    for e in events {
        let count = e.count.unwrap_or(1).max(1);
        let reason = e.reason.as_deref().unwrap_or_default();
        let from = event_component(e);
        let ours = if component.ends_with('_') { from.starts_with(component) } else { from == component };
        if ours {
            match reason {
                "Provisioning" => c.provisioning += count,
                "ProvisioningSucceeded" => c.succeeded += count,
                _ => {}
            }
        }
        let key = format!("{} {reason} ({from})", e.type_.as_deref().unwrap_or_default());
        *c.by_reason.entry(key.clone()).or_default() += count;
        if e.type_.as_deref() == Some("Warning") {
            c.warn_sample.entry(key).or_insert_with(|| e.message.clone().unwrap_or_default());
        }
    }
    c
}

/// Reads the events until each claim's two are counted or `max` has passed;
/// returns the last reading and how long it waited.
async fn wait_for_events(
    api: &Api<Event>,
    component: &str,
    n: usize,
    max: Duration,
) -> Result<(EventCounts, Duration)> {
    let t = Instant::now();
    loop {
        let c = count_events(&api.list(&ListParams::default()).await?.items, component);
        if (c.provisioning >= n as i32 && c.succeeded >= n as i32) || t.elapsed() >= max {
            return Ok((c, t.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn opt_median(v: &[Option<f64>]) -> Option<f64> {
    if v.iter().any(Option::is_none) { None } else { Some(median(&v.iter().flatten().copied().collect::<Vec<_>>())) }
}

pub fn table(results: &[Vec<ScenarioResult>]) -> String {
    let mut s = String::new();
    s.push_str(
        "| PVCs | sidecar QPS/burst | creates done (s) | all have a PV (s) | PV/s | all Bound (s) | Bound/s | \
         create→PV p50/p95 (s) | annotation→PV p50/p95/max (s) | create→Bound p50/p95 (s) | sidecar API req/volume | \
         events Provisioning / Succeeded (of N) | delete: all PVs gone (s) | deleted/s | sidecar req/deleted volume | \
         409/422 on PV writes while deleting (sidecar ≈) | RSS idle (MiB) | RSS all Bound (MiB) | RSS end (MiB) | \
         peak RSS VmHWM (MiB) | WARN/ERROR log lines |\n",
    );
    s.push_str(
        "|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for runs in results {
        let Some(first) = runs.first() else { continue };
        let m = |f: fn(&ScenarioResult) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let om = |f: fn(&ScenarioResult) -> Option<f64>| opt_median(&runs.iter().map(f).collect::<Vec<_>>());
        let n = first.n as f64;
        let secs = |v: Option<f64>| v.map_or("timeout".into(), |v| format!("{v:.1}"));
        let rate = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.1}", n / v));
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {} | {} | {} | {:.1} / {:.1} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.2} | \
             {} | {} | {} | {:.2} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            first.n,
            first.qps,
            m(|r| r.create_s),
            secs(om(|r| r.pv_s)),
            rate(om(|r| r.pv_s)),
            secs(om(|r| r.bound_s)),
            rate(om(|r| r.bound_s)),
            m(|r| r.pv_lat_p50),
            m(|r| r.pv_lat_p95),
            m(|r| r.ann_to_pv.p50),
            m(|r| r.ann_to_pv.p95),
            m(|r| r.ann_to_pv.max),
            m(|r| r.bound_lat_p50),
            m(|r| r.bound_lat_p95),
            m(|r| r.req_per_vol),
            runs.iter()
                .map(|r| format!("{} / {}", r.events_provisioning, r.events_succeeded))
                .collect::<Vec<_>>()
                .join(", "),
            secs(om(|r| r.del_s)),
            rate(om(|r| r.del_s)),
            m(|r| r.del_req_per_vol),
            runs.iter()
                .map(|r| format!(
                    "{} ({})",
                    r.del_conflicts_all,
                    r.del_conflicts_sidecar.map_or("n/a".into(), |v| v.to_string())
                ))
                .collect::<Vec<_>>()
                .join(", "),
            m(|r| r.rss_idle),
            m(|r| r.rss_bound),
            m(|r| r.rss_end),
            m(|r| r.hwm),
            runs.iter().map(|r| r.log_problem_lines.to_string()).collect::<Vec<_>>().join("/"),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, component: Option<&str>, reporting: Option<&str>, count: Option<i32>) -> Event {
        Event {
            reason: Some(reason.into()),
            type_: Some("Normal".into()),
            source: component
                .map(|c| k8s_openapi::api::core::v1::EventSource { component: Some(c.into()), ..Default::default() }),
            reporting_component: reporting.map(String::from),
            count,
            ..Default::default()
        }
    }

    #[test]
    fn events_of_the_provisioner_are_counted_with_their_aggregated_counts() {
        let events = [
            event("Provisioning", Some("external-provisioner"), None, Some(3)),
            event("Provisioning", None, Some("external-provisioner"), None),
            event("ProvisioningSucceeded", Some("external-provisioner"), None, Some(2)),
            event("ProvisioningSucceeded", Some("persistentvolume-controller"), None, Some(5)),
            event("ExternalProvisioning", Some("persistentvolume-controller"), None, Some(7)),
        ];
        let c = count_events(&events, "external-provisioner");
        assert_eq!((c.provisioning, c.succeeded), (4, 2));
        assert_eq!(c.by_reason.get("Normal ExternalProvisioning (persistentvolume-controller)"), Some(&7));
        // A component ending in "_" is the prefix of the provisioner's identity.
        let events = [
            event("Provisioning", Some("bench.csi.example.com_vm_42623e95"), None, Some(2)),
            event("ProvisioningSucceeded", Some("bench.csi.example.com_vm_42623e95"), None, None),
            event("Provisioning", Some("other.example.com_vm_1"), None, None),
            event("Provisioning", Some("bench.csi.example.com"), None, None),
        ];
        let c = count_events(&events, "bench.csi.example.com_");
        assert_eq!((c.provisioning, c.succeeded), (2, 1));
    }
}
