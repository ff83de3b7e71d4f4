//! A real Kubernetes control plane on loopback for csi-sidecar tests and demos
//! (etcd, kube-apiserver, kube-controller-manager). See integration/README.md.
//!
//! ```text
//! cluster serve                     # Ctrl-C (or EOF on stdin) stops it
//! cluster mint --run-dir DIR --service-account NS/NAME [--out FILE]
//! ```

use std::{path::PathBuf, time::Duration};

use argh::FromArgs;
use csi_sidecar_integration::cluster::{ClusterInfo, INFO_FILE, Identity, ServeOptions, mint_kubeconfig, serve};

/// Real Kubernetes control plane on 127.0.0.1 for csi-sidecar tests.
#[derive(FromArgs)]
struct Args {
    #[argh(subcommand)]
    cmd: Cmd,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum Cmd {
    Serve(Serve),
    Mint(Mint),
}

/// Start etcd, kube-apiserver and kube-controller-manager; print one JSON line
/// when ready; stop them (KCM, apiserver, etcd) on stdin EOF, SIGTERM, SIGINT or
/// SIGHUP.
#[derive(FromArgs)]
#[argh(subcommand, name = "serve")]
struct Serve {
    /// run directory to use (default: a new one under $CSI_SIDECAR_CLUSTER_DIR or
    /// <workspace>/target/cluster-runs)
    #[argh(option)]
    run_dir: Option<PathBuf>,
    /// keep the run directory after a clean stop (also: CSI_SIDECAR_KEEP_CLUSTER=1)
    #[argh(switch)]
    keep: bool,
    /// also write the JSON line to this file once ready
    #[argh(option)]
    info_file: Option<PathBuf>,
    /// do not stop on stdin EOF (for `cluster serve --ignore-stdin ... &`; stop with SIGTERM)
    #[argh(switch)]
    ignore_stdin: bool,
    /// print only errors on stderr (cluster.log in the run dir has everything)
    #[argh(switch)]
    quiet: bool,
    /// seconds each component gets between SIGTERM and SIGKILL (default 10)
    #[argh(option, default = "10")]
    grace_secs: u64,
    /// an extra kube-apiserver flag (e.g. --apiserver-arg --feature-gates=WatchList=false); repeatable
    #[argh(option)]
    apiserver_arg: Vec<String>,
    /// also install the snapshot CRDs and run the snapshot-controller (built by build-components.sh snapshot-controller)
    #[argh(switch)]
    snapshots: bool,
    /// also run kube-scheduler and N hollow kubelets (built by build-components.sh kube-scheduler hollow-node); default 0
    #[argh(option, default = "0")]
    nodes: u32,
    /// also run a real node: containerd (Debian's) and the kubelet (build-components.sh kubelet), importing the
    /// image archives of DIR (integration/scripts/node-images.sh --out DIR); needs root
    #[argh(option)]
    real_node: Option<PathBuf>,
}

/// Issue a client certificate signed by the cluster's client CA and write a
/// kubeconfig for it; prints the kubeconfig's path.
#[derive(FromArgs)]
#[argh(subcommand, name = "mint")]
struct Mint {
    /// the cluster's run directory (holds cluster.json and pki/)
    #[argh(option)]
    run_dir: PathBuf,
    /// user name (CN)
    #[argh(option)]
    user: Option<String>,
    /// group (O), repeatable; only with --user
    #[argh(option)]
    group: Vec<String>,
    /// a ServiceAccount as NAMESPACE/NAME (user system:serviceaccount:NAMESPACE:NAME)
    #[argh(option)]
    service_account: Option<String>,
    /// where to write the kubeconfig (default: <run-dir>/users/<identity>.kubeconfig)
    #[argh(option)]
    out: Option<PathBuf>,
}

fn mint(m: Mint) -> anyhow::Result<()> {
    let info = ClusterInfo::read(&m.run_dir.join(INFO_FILE))?;
    let identity = match (m.user, m.service_account) {
        (Some(user), None) => Identity::User { name: user, groups: m.group },
        (None, Some(sa)) if m.group.is_empty() => Identity::parse_service_account(&sa)?,
        (None, Some(_)) => anyhow::bail!("--group applies to --user only"),
        _ => anyhow::bail!("give exactly one of --user and --service-account"),
    };
    let path = match m.out {
        Some(out) => {
            mint_kubeconfig(&info, &identity, &out)?;
            out
        }
        None => info.mint(&identity)?,
    };
    println!("{}", path.display());
    Ok(())
}

fn main() {
    let args: Args = argh::from_env();
    let code = match args.cmd {
        Cmd::Serve(s) => {
            let opts = ServeOptions {
                run_dir: s.run_dir,
                keep: s.keep,
                info_file: s.info_file,
                watch_stdin: !s.ignore_stdin,
                quiet: s.quiet,
                grace: Duration::from_secs(s.grace_secs),
                apiserver_args: s.apiserver_arg,
                snapshots: s.snapshots,
                nodes: s.nodes,
                real_node_images: s.real_node,
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            match rt.block_on(serve(opts)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("cluster: {e:#}");
                    1
                }
            }
        }
        Cmd::Mint(m) => match mint(m) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cluster mint: {e:#}");
                1
            }
        },
    };
    std::process::exit(code);
}
