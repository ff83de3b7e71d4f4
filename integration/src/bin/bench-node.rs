//! Benchmark of the node-side modules: `registrar` + `prober` in one
//! csi-sidecar process against the real CSI driver, registered with the
//! kubelet's own plugin manager (the kubelet-plugin-harness).
//!
//! Reports /healthz throughput and latency percentiles at N concurrent
//! keep-alive clients, the sidecar's RSS over the run (peak and drift), and
//! the binary's size. The binary is written back and evicted from the page
//! cache first, so the text pages the process maps are the ones it reads,
//! not whatever a copy or a link left cached. The documented run (the
//! defaults) fails, naming the figure, when it measures above the figures of
//! docs/benchmarks.md (see `csi_sidecar_integration::node_figures`). Run
//! with a release build:
//!
//! ```text
//! cargo build --release --workspace && \
//!   target/release/bench-node --requests 100000 --concurrency 16
//! ```

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use argh::FromArgs;
use csi_sidecar_integration::{
    component_bin, free_port, http,
    node_figures::{self, DOCS, DOCUMENTED_RUN, NodeFigures},
    process::Proc,
    sidecar_bin, wait_until, workspace_root,
};

/// registrar + prober /healthz benchmark.
#[derive(FromArgs)]
struct Args {
    /// total /healthz requests (default 100000)
    #[argh(option, default = "100_000")]
    requests: u64,
    /// concurrent keep-alive clients (default 16)
    #[argh(option, default = "16")]
    concurrency: u64,
    /// path prefix of /healthz to hit: "/healthz" (all modules) or "/healthz/prober"
    #[argh(option, default = "String::from(\"/healthz\")")]
    path: String,
}

use csi_sidecar_integration::process::status_kib;

/// Writes the file back and drops its pages from the page cache. A file
/// written a moment ago (a copy, a link) is cached whole and dirty, and dirty
/// pages cannot be dropped: the kernel's fault-around then maps 64 KiB
/// windows of it around every page the process touches (the same binary
/// measured 7.0 MiB idle from a fresh copy, 6.2 from the linker's output
/// written back minutes before).
fn evict_from_page_cache(path: &std::path::Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(path)?;
    file.sync_all()?;
    nix::fcntl::posix_fadvise(&file, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = argh::from_env();
    let dir = tempfile::tempdir()?;
    let csi = dir.path().join("csi.sock");
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry)?;
    let addr = format!("127.0.0.1:{}", free_port());
    let driver_args = vec![format!("--endpoint=unix://{}", csi.display()), "--name=bench.csi.example.com".to_string()];
    let _driver = Proc::spawn("csi-mock-driver", &component_bin("csi-mock-driver"), &driver_args, dir.path());
    let kubelet = Proc::spawn(
        "kubelet-plugin-harness",
        &component_bin("kubelet-plugin-harness"),
        &[format!("--dir={}", registry.display())],
        dir.path(),
    );
    let bin: PathBuf = sidecar_bin();
    evict_from_page_cache(&bin)?;
    let sidecar_args = vec![
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={addr}"),
        "registrar".into(),
        "--kubelet-registration-path=/var/lib/kubelet/plugins/bench/csi.sock".into(),
        format!("--plugin-registration-path={}", registry.display()),
        "prober".into(),
    ];
    let mut sidecar = Proc::spawn("csi-sidecar", &bin, &sidecar_args, dir.path());
    let pid = sidecar.pid();
    wait_until("sidecar healthy", Duration::from_secs(30), async || {
        let r = http::get(&addr, "/healthz").await;
        (matches!(&r, Ok(r) if r.status == 200), r)
    })
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    // Registered by the kubelet: the registration paths ran before "idle".
    wait_until("the kubelet registered the driver", Duration::from_secs(60), async || {
        let logs = kubelet.logs();
        (logs.contains("\"event\":\"register\""), logs)
    })
    .await;
    let idle_rss = status_kib(pid, "VmRSS:");
    let idle_anon = status_kib(pid, "RssAnon:");

    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let per_client = args.requests / args.concurrency;
    let start = Instant::now();
    let sampler = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let n = done.load(Ordering::Relaxed);
                samples.push((n, status_kib(pid, "VmRSS:"), status_kib(pid, "RssAnon:")));
                if n >= per_client * args.concurrency {
                    return samples;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (addr, path, done, failures) = (addr.clone(), args.path.clone(), done.clone(), failures.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = http::KeepAlive::connect(&addr).await.expect("connect");
            let mut lat = Vec::with_capacity(per_client as usize);
            for _ in 0..per_client {
                let t = Instant::now();
                match conn.get(&path).await {
                    Ok(r) if r.status == 200 => {}
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                lat.push(t.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for c in clients {
        latencies.extend(c.await?);
    }
    let elapsed = start.elapsed();
    let samples = sampler.await?;
    latencies.sort();
    let total = latencies.len() as f64;
    let peak = status_kib(pid, "VmHWM:");
    let at = |frac: f64| samples.iter().find(|(n, _, _)| *n as f64 >= total * frac).map(|(_, r, _)| *r).unwrap_or(0);
    let anon_peak = samples.iter().map(|(_, _, anon)| *anon).chain([idle_anon]).max().unwrap_or(0);
    let size = std::fs::metadata(&bin)?.len();
    println!(
        "csi-sidecar registrar+prober, {} requests to {}, {} keep-alive clients",
        total, args.path, args.concurrency
    );
    println!("  failures:        {}", failures.load(Ordering::Relaxed));
    println!("  throughput:      {:.0} req/s ({:.2} s)", total / elapsed.as_secs_f64(), elapsed.as_secs_f64());
    println!(
        "  latency:         p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!("  RSS idle:        {:.1} MiB", idle_rss as f64 / 1024.0);
    println!(
        "  RSS at 10%/50%/100% of the run: {:.1} / {:.1} / {:.1} MiB",
        at(0.1) as f64 / 1024.0,
        at(0.5) as f64 / 1024.0,
        at(1.0) as f64 / 1024.0
    );
    println!("  RSS peak (VmHWM): {:.1} MiB", peak as f64 / 1024.0);
    println!(
        "  RssAnon:         {:.2} MiB idle, {:.2} MiB the largest sampled",
        idle_anon as f64 / 1024.0,
        anon_peak as f64 / 1024.0
    );
    println!("  binary size:     {:.1} MB ({})", size as f64 / 1e6, bin.display());
    // A clean stop (SIGTERM): the shutdown path runs too, and a profiler
    // wrapping the sidecar (integration/scripts/node-text-order.sh) writes its data.
    println!("  stop:            {} after SIGTERM", sidecar.terminate().await);
    if failures.load(Ordering::Relaxed) > 0 {
        anyhow::bail!("some requests failed");
    }
    let run = node_figures::Run { requests: args.requests, concurrency: args.concurrency, path: &args.path };
    if run != DOCUMENTED_RUN {
        println!("  figures:         not checked ({DOCS} documents the default run)");
        return Ok(());
    }
    let docs = std::fs::read_to_string(workspace_root().join(DOCS))?;
    let documented = node_figures::parse(&docs)?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let measured = NodeFigures {
        idle_mib: mib(idle_rss),
        peak_mib: mib(peak),
        anon_idle_mib: mib(idle_anon),
        anon_peak_mib: mib(anon_peak),
    };
    let exceeded = node_figures::check(measured, documented);
    if exceeded.is_empty() {
        println!(
            "  figures:         within {DOCS}: {:.1} / {:.1} MiB idle / peak (+{:.0} %), RssAnon {:.2} / {:.2} MiB (+{:.0} %, at least {} MiB)",
            documented.idle_mib,
            documented.peak_mib,
            node_figures::LAYOUT_TOLERANCE * 100.0,
            documented.anon_idle_mib,
            documented.anon_peak_mib,
            node_figures::STATE_TOLERANCE * 100.0,
            node_figures::MIN_SLACK_MIB,
        );
        return Ok(());
    }
    for e in &exceeded {
        eprintln!("bench-node: {e}");
    }
    let cause = if exceeded.iter().any(|e| e.kind == node_figures::Kind::State) {
        "The process's own memory (heap, stacks) grew"
    } else {
        "Only the text pages grew: src/node-text.order no longer matches the code (a dependency change \
         renames every function); rerun integration/scripts/node-text-order.sh, rebuild, rerun bench-node"
    };
    anyhow::bail!(
        "the node process grew beyond {DOCS}: {}. {cause}. If the growth is meant, update the figures in {DOCS}",
        exceeded.iter().map(|e| e.figure).collect::<Vec<_>>().join(", ")
    )
}
