//! Dispatch only: parse the command line, set up logging, run the host.

use std::process::ExitCode;

use csi_sidecar::{
    cli::{self, Command},
    host, logging,
    modules::ModuleConfig,
};

/// How many threads the async runtime gets.
#[derive(Debug, PartialEq, Eq)]
enum RuntimeShape {
    /// Everything on the main thread: the node modules serve a few sockets
    /// and probe one driver, so worker threads would only add stacks, malloc
    /// arenas and wake-ups.
    CurrentThread,
    /// Worker threads for the controller modules (informers, work queues).
    MultiThread { workers: usize },
}

/// The runtime an invocation needs, given the machine's parallelism.
fn runtime_shape(modules: &[ModuleConfig], parallelism: Option<usize>) -> RuntimeShape {
    if modules.iter().any(ModuleConfig::needs_kube) {
        RuntimeShape::MultiThread { workers: parallelism.map_or(2, |n| n.clamp(1, 4)) }
    } else {
        RuntimeShape::CurrentThread
    }
}

fn build_runtime(shape: RuntimeShape) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match shape {
        RuntimeShape::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        RuntimeShape::MultiThread { workers } => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(workers);
            b
        }
    };
    builder.enable_all().build()
}

fn main() -> ExitCode {
    // Every socket and file this process creates is owner-only (the
    // registration socket is 0700, like upstream's). Set before any thread.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));

    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    // `csi-sidecar explain ...`: a client of the API and the debug endpoint,
    // not a sidecar.
    if argv.get(1).map(String::as_str) == Some("explain") {
        return ExitCode::from(csi_sidecar::explain::main(&argv[2..]));
    }
    // A module's own tool (`csi-sidecar snapshot-metadata allocated ...`).
    if let Some(row) = argv.get(1).and_then(|name| csi_sidecar::modules::rows().into_iter().find(|r| r.name == name))
        && let Some(tool) = row.tool
        && let Some(code) = tool(&argv[2..])
    {
        return ExitCode::from(code);
    }
    let inv = match cli::parse(&argv) {
        Command::Exit { code: 0, text } => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Command::Exit { code, text } => {
            eprint!("{text}");
            return ExitCode::from(code);
        }
        Command::Run(inv) => *inv,
    };
    if let Some(code) = inv.modules.iter().find_map(|m| m.early_exit()) {
        return ExitCode::from(code);
    }
    if let Err(e) = logging::init(inv.shared.verbosity(), inv.shared.logging_format.as_deref()) {
        eprintln!("{}: {e}", inv.program);
        return ExitCode::from(1);
    }
    for w in &inv.warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(program = %inv.program, version = cli::VERSION, modules = ?inv.modules.iter().map(|m| m.name()).collect::<Vec<_>>(), "Starting");
    let shape = runtime_shape(&inv.modules, std::thread::available_parallelism().ok().map(|n| n.get()));
    let runtime = match build_runtime(shape) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{}: cannot start the async runtime: {e}", inv.program);
            return ExitCode::from(1);
        }
    };
    runtime.block_on(host::run(inv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(args: &str) -> Vec<ModuleConfig> {
        let argv: Vec<String> = args.split_whitespace().map(String::from).collect();
        match cli::parse(&argv) {
            Command::Run(inv) => inv.modules,
            Command::Exit { code, text } => panic!("{args}: exit {code}: {text}"),
        }
    }

    #[test]
    fn node_modules_run_on_the_main_thread() {
        let node = modules("csi-sidecar registrar --kubelet-registration-path=/k/csi.sock prober");
        assert_eq!(runtime_shape(&node, Some(8)), RuntimeShape::CurrentThread);
        assert_eq!(runtime_shape(&modules("livenessprobe"), Some(8)), RuntimeShape::CurrentThread);
    }

    #[test]
    fn a_controller_module_gets_worker_threads_up_to_four() {
        let controller = modules("csi-sidecar provisioner prober");
        assert_eq!(runtime_shape(&controller, Some(8)), RuntimeShape::MultiThread { workers: 4 });
        assert_eq!(runtime_shape(&controller, Some(1)), RuntimeShape::MultiThread { workers: 1 });
        assert_eq!(runtime_shape(&controller, None), RuntimeShape::MultiThread { workers: 2 });
    }
}
