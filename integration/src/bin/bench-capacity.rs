//! Benchmark of storage capacity tracking (`provisioner --enable-capacity`)
//! against the real control plane: N Nodes with the driver's CSINode (made
//! through the API, no kubelets), each in its own zone, and C late-binding
//! StorageClasses: N × C CSIStorageCapacity objects.
//!
//! The driver is the in-process fault driver (it answers GetCapacity per
//! segment). One `provisioner` process runs as its own user (its requests
//! counted exactly by an APF FlowSchema, see `bench.rs`). Measured: the
//! time until every object exists and the requests that took; then, over
//! `--intervals` poll intervals, the API writes per interval in the steady
//! state (capacity unchanged) and when every segment's capacity changes
//! before each poll; the GetCapacity calls per interval; RSS (VmRSS at the
//! end of the steady state, VmHWM).
//!
//! ```text
//! cargo build --release --workspace
//! target/release/bench-capacity --nodes 50 --classes 3
//! ```

use std::time::{Duration, Instant};

use anyhow::Result;
use argh::FromArgs;
use csi_sidecar_integration::{
    bench::{create_namespace, mib, sidecar_kubeconfig, snapshot, wait_for},
    cluster::ControlPlane,
    fault_driver::{FaultDriver, Script, Transport},
    kube_support::{csi_node, node, storage_class},
    process::{Proc, status_kib},
};
use k8s_openapi::api::{
    core::v1::Node,
    storage::v1::{CSINode, CSIStorageCapacity, StorageClass},
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};

const DRIVER: &str = "bench-capacity.csi.example.com";
const NS: &str = "bench-capacity";
const KEY: &str = "topology.bench-capacity.csi.example.com/zone";
const GI: i64 = 1 << 30;

/// csi-sidecar capacity tracking benchmark.
#[derive(FromArgs)]
struct Args {
    /// nodes, each its own segment (default 50)
    #[argh(option, default = "50")]
    nodes: usize,
    /// late-binding StorageClasses of the driver (default 3)
    #[argh(option, default = "3")]
    classes: usize,
    /// the poll interval (--capacity-poll-interval), seconds (default 10)
    #[argh(option, default = "10")]
    poll: u64,
    /// poll intervals measured per phase (default 3)
    #[argh(option, default = "3")]
    intervals: u32,
    /// extra provisioner flags, comma-separated (default: the capacity
    /// client unlimited, so the writes of a change fit in an interval)
    #[argh(option, default = "String::from(\"--kube-api-capacity-qps=-1\")")]
    flags: String,
}

async fn count(api: &Api<CSIStorageCapacity>) -> Result<usize> {
    Ok(api.list(&ListParams::default()).await?.items.len())
}

/// (creates, patches, deletes) of CSIStorageCapacities between two snapshots.
fn writes(d: &csi_sidecar_integration::bench::Delta) -> (f64, f64, f64) {
    let of = |verb: &str| d.requests_where(|v, r, _| v == verb && r == "csistoragecapacities");
    (of("POST"), of("PATCH"), of("DELETE"))
}

async fn run(args: Args) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    eprintln!("starting the control plane ...");
    let cp = ControlPlane::try_start()?;
    let admin: Client = cp.client().await;
    let kubeconfig = sidecar_kubeconfig(&cp, &admin).await?;
    create_namespace(&admin, NS).await?;
    let csi = tmp.path().join("csi.sock");
    let script = Script {
        name: DRIVER.into(),
        controller: true,
        topology: true,
        capacity: true,
        capacity_total: Some(100 * GI),
        capacity_maximum: Some(10 * GI),
        ..Script::default()
    };
    let driver = FaultDriver::start(&csi, Transport::Grpc, script);
    eprintln!("{} nodes with CSINodes, {} classes ...", args.nodes, args.classes);
    for i in 0..args.nodes {
        let name = format!("bench-cap-{i}");
        Api::<Node>::all(admin.clone())
            .create(&PostParams::default(), &node(&name, &[(KEY, &format!("z{i}"))]))
            .await?;
        Api::<CSINode>::all(admin.clone())
            .create(&PostParams::default(), &csi_node(&name, DRIVER, &name, &[KEY]))
            .await?;
    }
    for c in 0..args.classes {
        let mut sc = storage_class(&format!("bench-cap-{c}"), DRIVER);
        sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
        Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;
    }
    let want = args.nodes * args.classes;
    let objects: Api<CSIStorageCapacity> = Api::namespaced(admin.clone(), NS);

    let mut sidecar_args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "provisioner".to_string(),
        "--enable-capacity".into(),
        "--capacity-ownerref-level=-1".into(),
        format!("--capacity-poll-interval={}s", args.poll),
    ];
    sidecar_args.extend(args.flags.split(',').filter(|f| !f.is_empty()).map(String::from));
    let before = snapshot(&admin, None).await?;
    let started = Instant::now();
    let mut p = Proc::spawn_env(
        "provisioner",
        &csi_sidecar_integration::sidecar_bin(),
        &sidecar_args,
        &[("NAMESPACE", Some(NS))],
        tmp.path(),
    );
    wait_for(&format!("{want} CSIStorageCapacity objects"), Duration::from_secs(600), async || {
        Ok(count(&objects).await? == want)
    })
    .await?;
    let created_secs = started.elapsed().as_secs_f64();
    let after_start = snapshot(&admin, None).await?;
    let d = after_start.delta(&before);
    let (c0, _, _) = writes(&d);
    let start_requests = d.sidecar;
    eprintln!("  all {want} objects after {created_secs:.1} s: {c0} creates, {start_requests} requests in all");

    // Steady state: nothing changes; each poll asks GetCapacity per object.
    let interval = Duration::from_secs(args.poll);
    tokio::time::sleep(interval).await; // let the start-up's last writes pass
    let (s0, g0) = (snapshot(&admin, None).await?, driver.get_capacities());
    tokio::time::sleep(interval * args.intervals).await;
    let (s1, g1) = (snapshot(&admin, None).await?, driver.get_capacities());
    let steady = s1.delta(&s0);
    let (sc, sp, sd) = writes(&steady);
    let n = f64::from(args.intervals);
    let steady_rss = mib(status_kib(p.pid(), "VmRSS:"));
    eprintln!(
        "  steady: {:.1} writes and {:.1} requests per interval, {:.1} GetCapacity per interval, RSS {steady_rss:.1} MiB",
        (sc + sp + sd) / n,
        steady.sidecar / n,
        (g1 - g0) as f64 / n
    );

    // Changing: every segment's capacity changes once per interval.
    let s2 = snapshot(&admin, None).await?;
    for k in 0..args.intervals {
        driver.update(|s| s.capacity_total = Some((99 - i64::from(k)) * GI));
        tokio::time::sleep(interval).await;
    }
    let s3 = snapshot(&admin, None).await?;
    let changing = s3.delta(&s2);
    let (cc, cp_, cd) = writes(&changing);
    let hwm = mib(status_kib(p.pid(), "VmHWM:"));
    let rss = mib(status_kib(p.pid(), "VmRSS:"));
    eprintln!("  changing: {:.1} writes per interval; RSS {rss:.1} MiB, peak {hwm:.1} MiB", (cc + cp_ + cd) / n);
    let alive = p.try_exit().is_none();
    p.terminate().await;
    println!(
        "Capacity tracking: {} nodes (one segment each) x {} late-binding classes = {want} CSIStorageCapacity \
         objects; fault driver; poll interval {} s; {} intervals per phase; flags {:?}{}.\n",
        args.nodes,
        args.classes,
        args.poll,
        args.intervals,
        args.flags,
        if alive { "" } else { " (the sidecar exited!)" }
    );
    println!("| phase | creates | patches | deletes | requests (all, per interval) |\n|---|---:|---:|---:|---:|");
    println!("| start-up ({created_secs:.1} s to all objects) | {c0} | - | - | {start_requests} |");
    println!(
        "| steady, capacity unchanged (per interval) | {:.1} | {:.1} | {:.1} | {:.1} |",
        sc / n,
        sp / n,
        sd / n,
        steady.sidecar / n
    );
    println!(
        "| every capacity changed before each poll (per interval) | {:.1} | {:.1} | {:.1} | {:.1} |",
        cc / n,
        cp_ / n,
        cd / n,
        changing.sidecar / n
    );
    println!(
        "\nGetCapacity calls per interval (steady): {:.1}. RSS at the end of the steady phase {steady_rss:.1} MiB, \
         at the end {rss:.1} MiB, peak (VmHWM) {hwm:.1} MiB.",
        (g1 - g0) as f64 / n
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    run(argh::from_env()).await
}
