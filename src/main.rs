//! Dispatch only: parse the command line, set up logging, run the host.

use std::process::ExitCode;

use csi_sidecar::{
    cli::{self, Command},
    host, logging,
};

fn main() -> ExitCode {
    // Every socket and file this process creates is owner-only (the
    // registration socket is 0700, like upstream's). Set before any thread.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));

    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
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
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{}: cannot start the async runtime: {e}", inv.program);
            return ExitCode::from(1);
        }
    };
    runtime.block_on(host::run(inv))
}
