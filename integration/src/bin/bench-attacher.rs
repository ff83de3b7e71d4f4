//! Benchmark of the attacher (and of provisioner + attacher in one process or
//! two): N volumes attached to and detached from M nodes, against the real
//! control plane and the CSI mock driver with attach enabled.
//!
//! Two sources of volumes:
//! * default: the bench creates the volumes in the driver (CreateVolume on its
//!   socket) and static PVs for them; only the `attacher` module runs;
//! * `--provision`: the sidecar's provisioner creates them from PVCs, then the
//!   attacher attaches them: `--layout combined` runs both modules in ONE
//!   process, `--layout separate` as two processes (upstream's shape).
//!
//! The bench plays the attach-detach controller: it creates one
//! VolumeAttachment per volume (node `i mod M`) and later deletes them. Every
//! CSINode maps the driver to the mock driver's one node ID. The sidecar runs
//! as its own user, counted exactly by an APF FlowSchema (see `bench.rs`).
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-attacher --volumes 500 --nodes 20 --qps default,unlimited
//! target/release/bench-attacher --provision --volumes 1000 --qps unlimited --layout combined,separate
//! ```

use std::{
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use argh::FromArgs;
use csi_sidecar::csi::proto::csi::v1::{
    CreateVolumeRequest, VolumeCapability, controller_client::ControllerClient, volume_capability,
};
use csi_sidecar_integration::{
    bench::{Qps, Snap, mib, open_watches, sidecar_kubeconfig, snapshot, start_mock_driver},
    cluster::ControlPlane,
    kube_support::{attached_count, csi_node, csi_pv, pvc, storage_class, unique_name, volume_attachment},
    process::{Proc, status_kib},
    sidecar_bin, uds_channel,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
};

const DRIVER: &str = "bench-attach.csi.example.com";
const NODE_ID: &str = "bench-node";

/// csi-sidecar attacher benchmark.
#[derive(FromArgs)]
struct Args {
    /// volumes (default 500)
    #[argh(option, default = "500")]
    volumes: usize,
    /// nodes the volumes are spread over (default 20)
    #[argh(option, default = "20")]
    nodes: usize,
    /// comma-separated QPS settings: default, unlimited or a number (default "default,unlimited")
    #[argh(option, default = "String::from(\"default,unlimited\")")]
    qps: String,
    /// let the sidecar's provisioner create the volumes from PVCs
    #[argh(switch)]
    provision: bool,
    /// with --provision: "combined" (one process) and/or "separate" (two) (default "combined")
    #[argh(option, default = "String::from(\"combined\")")]
    layout: String,
    /// concurrent object creators (default 16)
    #[argh(option, default = "16")]
    creators: usize,
    /// timeout of each phase in seconds (default 1800)
    #[argh(option, default = "1800")]
    timeout_secs: u64,
}

struct Env {
    admin: Client,
    kubeconfig: PathBuf,
    csi: PathBuf,
    logs: PathBuf,
    args: Args,
}

/// One scenario's numbers.
#[derive(Default)]
struct Outcome {
    label: String,
    processes: usize,
    watches: i64,
    lists: f64,
    idle_rss: f64,
    peak_rss: f64,
    provision: Option<Phase>,
    attach: Phase,
    detach: Phase,
}

#[derive(Default, Clone, Copy)]
struct Phase {
    secs: f64,
    per_sec: f64,
    requests_per_volume: f64,
}

impl Phase {
    /// `n` volumes in `secs`; the sidecar's requests between two snapshots.
    fn of(secs: f64, n: usize, before: &Snap, after: &Snap) -> Phase {
        Phase {
            secs,
            per_sec: n as f64 / secs,
            requests_per_volume: (after.sidecar_dispatched - before.sidecar_dispatched) / n as f64,
        }
    }
}

/// Open WATCH requests, all resources together.
async fn watches(admin: &Client) -> Result<i64> {
    Ok(open_watches(admin).await?.values().sum())
}

fn lists(after: &Snap, before: &Snap) -> f64 {
    after
        .requests
        .iter()
        .filter(|(k, _)| k.starts_with("LIST "))
        .map(|(k, v)| v - before.requests.get(k).copied().unwrap_or(0.0))
        .sum()
}

async fn for_all<T, F, Fut>(items: Vec<T>, creators: usize, f: F) -> Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    stream::iter(items).map(f).buffer_unordered(creators.max(1)).try_collect::<Vec<_>>().await.map(|_| ())
}

async fn wait_count<F, Fut>(what: &str, n: usize, timeout: Duration, count: F) -> Result<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let t = Instant::now();
    let mut last = usize::MAX;
    loop {
        let c = count().await;
        if c == n {
            return Ok(t.elapsed().as_secs_f64());
        }
        if c != last && c % 100 == 0 {
            eprintln!("  [{what}] {c}/{n}");
        }
        last = c;
        if t.elapsed() > timeout {
            bail!("{what}: {c}/{n} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Volumes created in the driver directly, with static PVs.
async fn static_volumes(env: &Env, prefix: &str, n: usize) -> Result<Vec<String>> {
    let mut client = ControllerClient::new(uds_channel(&env.csi).await?);
    let pvs: Api<PersistentVolume> = Api::all(env.admin.clone());
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i:04}");
        let req = CreateVolumeRequest {
            name: name.clone(),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(volume_capability::AccessType::Mount(Default::default())),
            }],
            ..Default::default()
        };
        let id = client.create_volume(req).await?.into_inner().volume.context("no volume")?.volume_id;
        names.push((name, id));
    }
    let out = names.iter().map(|(n, _)| n.clone()).collect();
    for_all(names, env.args.creators, |(name, id)| {
        let pvs = pvs.clone();
        async move {
            pvs.create(&PostParams::default(), &csi_pv(&name, DRIVER, &id, "1Mi")).await?;
            Ok(())
        }
    })
    .await?;
    Ok(out)
}

/// Volumes provisioned by the sidecar from PVCs; returns the PV names.
async fn provisioned_volumes(env: &Env, ns: &str, n: usize, timeout: Duration) -> Result<(Vec<String>, f64)> {
    let sc = format!("{ns}-sc");
    Api::<StorageClass>::all(env.admin.clone()).create(&PostParams::default(), &storage_class(&sc, DRIVER)).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.admin.clone(), ns);
    let t = Instant::now();
    for_all((0..n).collect(), env.args.creators, |i| {
        let (pvcs, c) = (pvcs.clone(), pvc(&format!("c-{i:04}"), Some(&sc), "1Mi"));
        async move {
            pvcs.create(&PostParams::default(), &c).await?;
            Ok(())
        }
    })
    .await?;
    let bound = || async {
        pvcs.list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|c| c.spec.as_ref().and_then(|s| s.volume_name.as_ref()).is_some()).count())
            .unwrap_or(0)
    };
    wait_count("bound", n, timeout, bound).await?;
    let secs = t.elapsed().as_secs_f64();
    let names =
        pvcs.list(&ListParams::default()).await?.items.into_iter().filter_map(|c| c.spec?.volume_name).collect();
    Ok((names, secs))
}

fn start(env: &Env, name: &str, modules: &[&str], qps: &Qps) -> Proc {
    let mut args =
        vec![format!("--csi-address={}", env.csi.display()), format!("--kubeconfig={}", env.kubeconfig.display())];
    args.extend(qps.flags());
    args.extend(modules.iter().map(|m| m.to_string()));
    Proc::spawn(name, &sidecar_bin(), &args, &env.logs)
}

async fn scenario(env: &Env, qps: &Qps, layout: &str) -> Result<Outcome> {
    let n = env.args.volumes;
    let timeout = Duration::from_secs(env.args.timeout_secs);
    let ns = unique_name("bench-att");
    Api::<Namespace>::all(env.admin.clone())
        .create(
            &PostParams::default(),
            &Namespace { metadata: ObjectMeta { name: Some(ns.clone()), ..Default::default() }, ..Default::default() },
        )
        .await?;
    let layouts: Vec<Vec<&str>> = match (env.args.provision, layout) {
        (false, _) => vec![vec!["attacher"]],
        (true, "combined") => vec![vec!["provisioner", "attacher"]],
        (true, "separate") => vec![vec!["provisioner"], vec!["attacher"]],
        (_, l) => bail!("unknown layout {l:?}"),
    };
    let before_start = snapshot(&env.admin, None).await?;
    let watches_before = watches(&env.admin).await?;
    let procs: Vec<Proc> = layouts.iter().enumerate().map(|(i, m)| start(env, &format!("{ns}-{i}"), m, qps)).collect();
    let modules: usize = layouts.iter().map(Vec::len).sum();
    wait_count("caches synced", modules, timeout, || async {
        procs.iter().map(|p| p.logs().matches("Caches synced").count()).sum()
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_start = snapshot(&env.admin, None).await?;
    let rss = |field: &str| procs.iter().map(|p| mib(status_kib(p.pid(), field))).sum::<f64>();
    let mut out = Outcome {
        label: format!(
            "{} {} {}",
            if env.args.provision { "provision+attach" } else { "attach" },
            if env.args.provision { layout } else { "" },
            qps.label()
        ),
        processes: procs.len(),
        watches: watches(&env.admin).await? - watches_before,
        lists: lists(&after_start, &before_start),
        idle_rss: rss("VmRSS:"),
        ..Default::default()
    };

    let volumes = if env.args.provision {
        let s0 = snapshot(&env.admin, None).await?;
        let (names, secs) = provisioned_volumes(env, &ns, n, timeout).await?;
        let s1 = snapshot(&env.admin, None).await?;
        out.provision = Some(Phase::of(secs, n, &s0, &s1));
        names
    } else {
        static_volumes(env, &ns, n).await?
    };

    let vas: Api<VolumeAttachment> = Api::all(env.admin.clone());
    let prefix = format!("{ns}-va");
    let count_left = || async {
        vas.list(&ListParams::default())
            .await
            .map(|l| {
                l.items.iter().filter(|v| v.metadata.name.as_deref().is_some_and(|x| x.starts_with(&prefix))).count()
            })
            .unwrap_or(usize::MAX)
    };
    let s0 = snapshot(&env.admin, None).await?;
    let t = Instant::now();
    let items: Vec<(usize, String)> = volumes.iter().cloned().enumerate().collect();
    for_all(items.clone(), env.args.creators, |(i, pv)| {
        let (vas, va) = (
            vas.clone(),
            volume_attachment(&format!("{prefix}-{i:04}"), DRIVER, &format!("bench-node-{}", i % env.args.nodes), &pv),
        );
        async move {
            vas.create(&PostParams::default(), &va).await?;
            Ok(())
        }
    })
    .await?;
    wait_count("attached", n, timeout, || attached_count(&vas, &prefix)).await?;
    let secs = t.elapsed().as_secs_f64();
    let s1 = snapshot(&env.admin, None).await?;
    out.attach = Phase::of(secs, n, &s0, &s1);

    let t = Instant::now();
    for_all(items, env.args.creators, |(i, _)| {
        let vas = vas.clone();
        let name = format!("{prefix}-{i:04}");
        async move {
            vas.delete(&name, &DeleteParams::default()).await?;
            Ok(())
        }
    })
    .await?;
    wait_count("detached", 0, timeout, count_left).await?;
    let secs = t.elapsed().as_secs_f64();
    let s2 = snapshot(&env.admin, None).await?;
    out.detach = Phase::of(secs, n, &s1, &s2);
    out.peak_rss = rss("VmHWM:");
    for mut p in procs {
        p.terminate().await;
    }
    Ok(out)
}

fn report(results: &[Outcome], args: &Args) -> String {
    let mut s = format!(
        "## csi-sidecar attacher benchmark\n\n{} volumes over {} nodes; real kube-apiserver + etcd + kube-controller-manager on \
         127.0.0.1, CSI mock driver (attach enabled). Requests per volume are the sidecar user's requests counted by \
         the apiserver (APF FlowSchema matching only that user), divided by the number of volumes. RSS is the sum over \
         the sidecar processes; peak = VmHWM at the end of the run.\n\n",
        args.volumes, args.nodes
    );
    s.push_str(
        "| scenario | processes | WATCH connections | LIST requests at start | idle RSS (MiB) | provision (s) / PV/s / req per volume | \
         attach (s) | attaches/s | req per attach | detach (s) | detaches/s | req per detach | peak RSS (MiB) |\n\
         |---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let prov = r
            .provision
            .map_or("-".to_string(), |p| format!("{:.1} / {:.1} / {:.2}", p.secs, p.per_sec, p.requests_per_volume));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.1} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {:.1} |",
            r.label,
            r.processes,
            r.watches,
            r.lists,
            r.idle_rss,
            prov,
            r.attach.secs,
            r.attach.per_sec,
            r.attach.requests_per_volume,
            r.detach.secs,
            r.detach.per_sec,
            r.detach.requests_per_volume,
            r.peak_rss
        );
    }
    s
}

async fn run(args: Args) -> Result<()> {
    let qps: Vec<Qps> = args.qps.split(',').filter(|s| !s.trim().is_empty()).map(Qps::parse).collect::<Result<_>>()?;
    let layouts: Vec<String> = args.layout.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let tmp = tempfile::tempdir()?;
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin = cp.client().await;
    let kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;
    let csi = tmp.path().join("csi.sock");
    let mut driver = start_mock_driver(&csi, DRIVER, NODE_ID, tmp.path()).await?;
    let csinodes: Api<CSINode> = Api::all(admin.clone());
    for i in 0..args.nodes {
        csinodes.create(&PostParams::default(), &csi_node(&format!("bench-node-{i}"), DRIVER, NODE_ID, &[])).await?;
    }
    let env = Env { admin, kubeconfig, csi, logs: tmp.path().to_path_buf(), args };
    let mut results = Vec::new();
    for q in &qps {
        for layout in &layouts {
            eprintln!("scenario: {} volumes, QPS {}, layout {layout} ...", env.args.volumes, q.label());
            let r = scenario(&env, q, layout).await?;
            eprintln!(
                "  -> attach {:.1} s, detach {:.1} s, peak RSS {:.1} MiB",
                r.attach.secs, r.detach.secs, r.peak_rss
            );
            results.push(r);
            if !env.args.provision {
                break;
            }
        }
    }
    if driver.try_exit().is_some() {
        eprintln!("warning: the CSI mock driver exited during the run");
    }
    print!("{}", report(&results, &env.args));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    run(argh::from_env()).await
}
