//! The third benchmark: the time from a SIGKILL of the leader to the PV of
//! a claim created right after it.

use std::{
    fmt::Write as _,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use csi_sidecar_integration::{
    bench::{Qps, median},
    kube_support::{pvc, storage_class, unique_name},
    process::Proc,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use nix::sys::signal::Signal;

use super::{
    DRIVER, create_retrying, meta,
    sidecar::{Env, watch_synced_kinds},
    watches::watch_pvs,
};

/// One SIGKILL of the leader.
struct Round {
    /// SIGKILL → the standby logged that it acquired the Lease (None: not logged).
    takeover: Option<Duration>,
    /// SIGKILL → the PV of the claim created right after it.
    pv: Option<Duration>,
}

pub struct FailoverResult {
    pvs_in_cluster: usize,
    rounds: Vec<Round>,
    notes: Vec<String>,
}

/// The replicas of one failover run, named in start order.
struct Replica {
    name: String,
    proc: Proc,
}

fn acquired(log: &str) -> bool {
    log.contains("successfully acquired lease")
}

/// The holder of some Lease in `ns` (the only Leases there are the provisioner's).
async fn lease_holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
        .find(|h| !h.is_empty()))
}

/// Which live replica leads: the one whose log names the Lease's holder, else
/// the only one that logged acquiring a Lease.
fn leader_index(replicas: &mut [Replica], holder: &str) -> Option<usize> {
    let live: Vec<(usize, String)> = replicas
        .iter_mut()
        .enumerate()
        .filter_map(|(i, r)| r.proc.try_exit().is_none().then(|| (i, r.proc.logs())))
        .collect();
    let pick = |f: &dyn Fn(&str) -> bool| {
        let hits: Vec<usize> = live.iter().filter(|(_, l)| f(l)).map(|(i, _)| *i).collect();
        (hits.len() == 1).then(|| hits[0])
    };
    pick(&|l: &str| l.contains(holder)).or_else(|| pick(&|l: &str| acquired(l)))
}

/// Waits (bounded) until a csi-sidecar standby has its PV and PVC watches
/// synced; a provisioner that never logs "Watch synced" gets 10 s.
async fn wait_standby_warm(r: &mut Replica) -> Result<()> {
    let t = Instant::now();
    loop {
        let kinds = watch_synced_kinds(&r.proc.logs());
        let has = |k: &str| kinds.iter().any(|x| x == k);
        if (has("PersistentVolume") && has("PersistentVolumeClaim"))
            || (kinds.is_empty() && t.elapsed() > Duration::from_secs(10))
        {
            return Ok(());
        }
        if let Some(s) = r.proc.try_exit() {
            bail!("standby {} exited ({s}); log:\n{}", r.name, r.proc.logs());
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("standby {}: watches not synced within 300 s", r.name);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until one live replica leads and is ready; its index.
async fn wait_leader_ready(replicas: &mut [Replica], leases: &Api<Lease>, ready: &str) -> Result<usize> {
    let t = Instant::now();
    loop {
        if let Some(holder) = lease_holder(leases).await?
            && let Some(i) = leader_index(replicas, &holder)
            && replicas[i].proc.logs().contains(ready)
        {
            return Ok(i);
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("no replica led and was ready within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two replicas with 4 s leases; each round SIGKILLs the leader, creates a
/// claim right after and times the kill → its PV; a fresh standby replaces
/// the killed one.
pub async fn failover(env: &Env) -> Result<FailoverResult> {
    let admin = &env.admin;
    let ns_name = unique_name("bench-failover");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class(&ns_name, DRIVER)).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns_name);
    let (_pv_w, pv_seen) = watch_pvs(&Api::all(admin.clone()), &ns_name).await?;
    let pvs_in_cluster = _pv_w.store.state().len();
    let le: Vec<String> = [
        "--leader-election".to_string(),
        format!("--leader-election-namespace={ns_name}"),
        "--leader-election-lease-duration=4s".into(),
        "--leader-election-renew-deadline=3s".into(),
        "--leader-election-retry-period=1s".into(),
    ]
    .into();
    let spawn = |i: usize| {
        let name = format!("failover-{i}");
        let (proc, _) = env.spawn_provisioner(&name, &Qps::Default, &le);
        Replica { name, proc }
    };
    let mut replicas = vec![spawn(0), spawn(1)];
    let mut rounds = Vec::new();
    let mut notes = Vec::new();
    for round in 0..env.args.failover_rounds.max(1) {
        let leader = wait_leader_ready(&mut replicas, &leases, &env.command.ready_log).await?;
        let standby = (0..replicas.len())
            .rev()
            .find(|&i| i != leader && replicas[i].proc.try_exit().is_none())
            .ok_or_else(|| anyhow!("no standby"))?;
        wait_standby_warm(&mut replicas[standby]).await?;
        let claim = format!("failover-{round}");
        replicas[leader].proc.signal(Signal::SIGKILL);
        let killed = Instant::now();
        create_retrying(&pvcs, &pvc(&claim, Some(&ns_name), "1Mi"), &Mutex::new(0)).await?;
        let mut takeover = None;
        let pv = loop {
            if takeover.is_none() && acquired(&replicas[standby].proc.logs()) {
                takeover = Some(killed.elapsed());
            }
            if let Some(at) = pv_seen.get(&claim) {
                break Some(at.saturating_duration_since(killed));
            }
            if killed.elapsed() > Duration::from_secs(120) {
                notes.push(format!("round {}: no PV for {claim} within 120 s of the SIGKILL", round + 1));
                break None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        eprintln!("  [failover] round {}: takeover {takeover:?}, SIGKILL → PV {pv:?}", round + 1);
        rounds.push(Round { takeover, pv });
        let _ = replicas[leader].proc.wait_exit(Duration::from_secs(10)).await;
        replicas.push(spawn(replicas.len()));
    }
    for r in &mut replicas {
        if r.proc.try_exit().is_none() {
            r.proc.signal(Signal::SIGTERM);
            if r.proc.wait_exit(Duration::from_secs(10)).await.is_none() {
                r.proc.kill();
            }
        }
    }
    let _ = pvcs.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    let _ = Api::<StorageClass>::all(admin.clone()).delete(&ns_name, &DeleteParams::default()).await;
    Ok(FailoverResult { pvs_in_cluster, rounds, notes })
}

pub fn failover_table(f: &FailoverResult) -> String {
    let secs = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()));
    let mut s = format!(
        "Failover ({} PVs in the cluster; 2 replicas, --leader-election-lease-duration=4s, renew deadline 3s, \
         retry 1s; SIGKILL of the leader, then one claim created):\n\n\
         | round | SIGKILL → standby acquired the Lease (s) | SIGKILL → PV of the new claim (s) |\n|---:|---:|---:|\n",
        f.pvs_in_cluster
    );
    for (i, r) in f.rounds.iter().enumerate() {
        let _ = writeln!(s, "| {} | {} | {} |", i + 1, secs(r.takeover), secs(r.pv));
    }
    let med = |v: Vec<Option<Duration>>| {
        if v.iter().any(Option::is_none) {
            "-".to_string()
        } else {
            format!("{:.2}", median(&v.iter().flatten().map(Duration::as_secs_f64).collect::<Vec<_>>()))
        }
    };
    let _ = writeln!(
        s,
        "| median | {} | {} |\n",
        med(f.rounds.iter().map(|r| r.takeover).collect()),
        med(f.rounds.iter().map(|r| r.pv).collect())
    );
    for n in &f.notes {
        let _ = writeln!(s, "* {n}");
    }
    s
}
