//! Command line: argv → [`Invocation`].
//!
//! `csi-sidecar [shared flags] MODULE [flags] [MODULE [flags] ...]`, or an
//! upstream binary name as argv[0] (`livenessprobe --csi-address=...`). A
//! module name token starts a new segment. Go-style flags are normalised by
//! [`goflags`] and then parsed by argh into typed configurations. The flag
//! syntax and the shared flags live in [`crate::flags`], below both this
//! module and the modules it dispatches to.

use std::collections::BTreeMap;

use argh::{ArgsInfo, FromArgs};

pub use crate::flags::SharedFlags;
use crate::{
    compat,
    flags::{
        goflags::{self, FlagError, FlagKind, GivenFlag},
        shared,
    },
    k8s::ModuleBudget,
    modules::{self, ModuleConfig, ModuleDesc},
};

/// The name of the multicall binary itself.
pub const PROGRAM: &str = crate::compat::PROGRAM;

/// The version printed by `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Run these modules.
    Run(Box<Invocation>),
    /// Print and exit (help, list, version, usage errors).
    Exit {
        /// Process exit status.
        code: u8,
        /// Text for stdout (code 0) or stderr.
        text: String,
    },
}

/// A parsed command line, ready to run.
#[derive(Debug, PartialEq)]
pub struct Invocation {
    /// argv[0] basename, used in `--version` output and logs.
    pub program: String,
    /// Shared settings, merged from every segment.
    pub shared: SharedFlags,
    /// The modules, in command-line order.
    pub modules: Vec<ModuleConfig>,
    /// Warnings to log once logging is up (deprecated flags and the like).
    pub warnings: Vec<String>,
    /// Each Kubernetes module's own API budget, pooled by the host.
    pub budgets: Vec<ModuleBudget>,
}

/// A flag name → kind table built from argh's description of a struct.
struct FlagTable(BTreeMap<&'static str, (FlagKind, &'static str)>);

impl FlagTable {
    fn from_info(info: argh::CommandInfoWithArgs, keep: impl Fn(&str) -> bool) -> Self {
        let mut map = BTreeMap::new();
        for f in info.flags {
            let name = f.long.trim_start_matches('-');
            if name == "help" || !keep(name) {
                continue;
            }
            let kind = match f.kind {
                argh::FlagInfoKind::Switch => FlagKind::Bool,
                argh::FlagInfoKind::Option { arg_name } if arg_name == goflags::BOOL_ARG => FlagKind::BoolValue,
                argh::FlagInfoKind::Option { .. } => FlagKind::Value,
            };
            map.insert(name, (kind, f.description));
        }
        FlagTable(map)
    }

    fn kind(&self, name: &str) -> Option<FlagKind> {
        self.0.get(name).map(|(k, _)| *k)
    }

    fn render(&self, out: &mut String) {
        for (name, (kind, desc)) in &self.0 {
            let arg = if *kind == FlagKind::Value { "=VALUE" } else { "" };
            out.push_str(&format!("  --{name}{arg}\n        {desc}\n"));
        }
    }
}

fn shared_table(accepts: impl Fn(&str) -> bool) -> FlagTable {
    FlagTable::from_info(SharedFlags::get_args_info(), accepts)
}

/// The shared flags a module accepts: its upstream list plus the logging flags.
fn module_accepts_shared(desc: &ModuleDesc, name: &str) -> bool {
    desc.shared.iter().any(|group| group.contains(&name)) || shared::LOGGING.contains(&name)
}

fn is_help(name: &str) -> bool {
    matches!(name, "help" | "h")
}

fn usage_error(module: Option<&str>, err: impl std::fmt::Display) -> Command {
    let (scope, hint) = match module {
        Some(m) => (format!("{PROGRAM}: {m}: "), format!("Run '{PROGRAM} {m} --help' for usage.")),
        None => (format!("{PROGRAM}: "), format!("Run '{PROGRAM} --help' for usage.")),
    };
    Command::Exit { code: 2, text: format!("{scope}{err}\n{hint}\n") }
}

/// One module's part of the command line.
struct Segment {
    desc: &'static ModuleDesc,
    args: Vec<String>,
}

/// A shared flag value and where it was given.
struct SharedGiven {
    flag: GivenFlag,
    origin: &'static str,
}

/// Parses a full argv (including argv[0]).
pub fn parse(argv: &[String]) -> Command {
    let program =
        argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_else(|| PROGRAM.to_string());
    let args = argv.get(1..).unwrap_or_default();

    if let Some(desc) = modules::lookup(&program) {
        // Busybox style: argv[0] names the module, all arguments are its own.
        return build(program, Vec::new(), vec![Segment { desc, args: args.to_vec() }]);
    }

    // Upstream's planned all-in-one form (KEP-4958): `--controllers=...`.
    if kep::wants(&program, args) {
        return kep::parse(program, args);
    }

    // Top level: shared flags, --list/--help/--version, then module segments.
    match args.first().map(String::as_str) {
        None => return Command::Exit { code: 2, text: top_help() },
        Some("--list" | "-list" | "list") => return Command::Exit { code: 0, text: list() },
        Some("--help" | "-help" | "-h" | "help") => {
            return match args.get(1).and_then(|m| modules::lookup(m)) {
                Some(desc) => Command::Exit { code: 0, text: module_help(desc.name, desc) },
                None => Command::Exit { code: 0, text: top_help() },
            };
        }
        _ => {}
    }
    let all_shared = shared_table(|_| true);
    let top = match goflags::tokenize(args, |n| all_shared.kind(n).or(is_help(n).then_some(FlagKind::Bool))) {
        Ok(t) => t,
        Err(e) => return usage_error(None, e),
    };
    if top.flags.iter().any(|f| is_help(&f.name)) {
        return Command::Exit { code: 0, text: top_help() };
    }
    let mut rest = &args[top.rest..];
    if rest.is_empty() && top.flags.iter().any(|f| f.name == "version") {
        return Command::Exit { code: 0, text: format!("{program} {VERSION}\n") };
    }
    let mut segments = Vec::new();
    while let Some(name) = rest.first() {
        let Some(desc) = modules::lookup(name) else {
            return usage_error(None, format!("unknown module {name:?}; '{PROGRAM} --list' shows the modules"));
        };
        let own = FlagTable::from_info((desc.info)(), |_| true);
        let shared = shared_table(|n| module_accepts_shared(desc, n));
        let tail = &rest[1..];
        let t = match goflags::tokenize(tail, |n| {
            own.kind(n).or(shared.kind(n)).or(is_help(n).then_some(FlagKind::Bool))
        }) {
            Ok(t) => t,
            Err(e) => return usage_error(Some(desc.name), e),
        };
        segments.push(Segment { desc, args: tail[..t.rest].to_vec() });
        rest = &tail[t.rest..];
    }
    if segments.is_empty() {
        return usage_error(
            None,
            "no module given; '{PROGRAM} --list' shows the modules".replace("{PROGRAM}", PROGRAM),
        );
    }
    build(program, top.flags, segments)
}

fn build(program: String, top_flags: Vec<GivenFlag>, segments: Vec<Segment>) -> Command {
    let mut shared_given: Vec<SharedGiven> =
        top_flags.into_iter().map(|flag| SharedGiven { flag, origin: "top level" }).collect();
    let mut configs = Vec::new();
    let mut warnings = Vec::new();
    let mut budgets: Vec<(&'static str, Vec<GivenFlag>)> = Vec::new();
    let single = segments.len() == 1;

    for seg in &segments {
        let desc = seg.desc;
        if configs.iter().any(|c: &ModuleConfig| c.name() == desc.name) {
            return usage_error(None, format!("module {} given twice", desc.name));
        }
        let own = FlagTable::from_info((desc.info)(), |_| true);
        let shared = shared_table(|n| module_accepts_shared(desc, n));
        let kind_of = |n: &str| own.kind(n).or(shared.kind(n)).or(is_help(n).then_some(FlagKind::Bool));
        let t = match goflags::tokenize(&seg.args, kind_of) {
            Ok(t) => t,
            Err(e) => return usage_error(Some(desc.name), e),
        };
        if t.rest < seg.args.len() {
            return usage_error(Some(desc.name), FlagError::Unexpected(seg.args[t.rest].clone()));
        }
        let flags = goflags::last_wins(t.flags);
        if flags.iter().any(|f| is_help(&f.name) && f.value == "true") {
            let title = if single { program.clone() } else { desc.name.to_string() };
            return Command::Exit { code: 0, text: module_help(&title, desc) };
        }
        if single && flags.iter().any(|f| f.name == "version" && f.value == "true") {
            return Command::Exit { code: 0, text: format!("{program} {VERSION}\n") };
        }
        let (own_flags, shared_flags): (Vec<_>, Vec<_>) = flags.into_iter().partition(|f| own.kind(&f.name).is_some());
        let own_args = goflags::to_argh_args(&own_flags, |n| own.kind(n));
        let own_refs: Vec<&str> = own_args.iter().map(String::as_str).collect();
        match desc.configure(&own_refs) {
            Ok(cfg) => configs.push(cfg),
            Err(e) => return usage_error(Some(desc.name), e.output.trim_end()),
        }
        // Validate this segment's shared values on their own, so an error names the module.
        if let Err(e) = parse_shared(&shared_flags) {
            return usage_error(Some(desc.name), e);
        }
        for f in own_flags.iter().chain(&shared_flags) {
            if let Some((_, note)) = compat::DEPRECATED_FLAGS.iter().find(|(n, _)| *n == f.name) {
                warnings.push(format!("{}: flag --{} is deprecated: {note}", desc.name, f.name));
            }
        }
        // The API budget is the module's own: its values need not agree.
        let (own_budget, shared_flags): (Vec<_>, Vec<_>) =
            shared_flags.into_iter().partition(|f| BUDGET_FLAGS.contains(&f.name.as_str()));
        if module_accepts_shared(desc, BUDGET_FLAGS[0]) {
            budgets.push((desc.name, own_budget));
        }
        shared_given.extend(shared_flags.into_iter().map(|flag| SharedGiven { flag, origin: desc.name }));
    }

    // Every place that sets a shared flag must agree.
    let mut merged: Vec<GivenFlag> = Vec::new();
    for g in &shared_given {
        match merged.iter().position(|m| m.name == g.flag.name) {
            None => merged.push(g.flag.clone()),
            Some(i) if merged[i].value == g.flag.value => {}
            Some(i) => {
                let first = shared_given.iter().find(|o| o.flag.name == g.flag.name).map(|o| o.origin).unwrap_or("?");
                return usage_error(
                    None,
                    format!(
                        "conflicting values for shared flag --{}: {:?} ({first}) and {:?} ({})",
                        g.flag.name, merged[i].value, g.flag.value, g.origin
                    ),
                );
            }
        }
    }
    let shared = match parse_shared(&merged) {
        Ok(s) => s,
        Err(e) => return usage_error(None, e),
    };
    let budgets = budgets.into_iter().map(|(module, own)| module_budget(module, &shared, &own)).collect();
    Command::Run(Box::new(Invocation { program, shared, modules: configs, warnings, budgets }))
}

/// The flags of a module's own API budget: in a module's segment (or as a
/// KEP-4958 `--<controller>-kube-api-qps`) they set that module's budget
/// only; before the first module, every module's.
const BUDGET_FLAGS: [&str; 2] = ["kube-api-qps", "kube-api-burst"];

/// A module's budget (pure): its own values, else the process-wide ones.
fn module_budget(module: &'static str, shared: &SharedFlags, own: &[GivenFlag]) -> ModuleBudget {
    // The segment's values were validated with the segment (parse_shared).
    let own = parse_shared(own).unwrap_or_default();
    ModuleBudget {
        module,
        qps: own.kube_api_qps.unwrap_or(shared.kube_api_qps()),
        burst: own.kube_api_burst.unwrap_or(shared.kube_api_burst()),
    }
}

fn parse_shared(flags: &[GivenFlag]) -> Result<SharedFlags, String> {
    let table = shared_table(|_| true);
    let args = goflags::to_argh_args(flags, |n| table.kind(n));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    SharedFlags::from_args(&[PROGRAM], &refs).map_err(|e| e.output.trim_end().to_string())
}

/// `--list`: every module and its upstream names.
pub fn list() -> String {
    let mut out = String::new();
    for m in modules::rows() {
        out.push_str(&format!(
            "{:<12} replaces {:<22} names: {:<45} {}\n",
            m.name,
            m.replaces,
            std::iter::once(m.name).chain(m.binary_names.iter().copied()).collect::<Vec<_>>().join(", "),
            m.summary
        ));
    }
    out
}

fn top_help() -> String {
    let mut out = format!(
        "{PROGRAM} {VERSION}: one process for the Kubernetes CSI sidecars.\n\n\
         Usage:\n  {PROGRAM} [shared flags] MODULE [flags] [MODULE [flags] ...]\n  \
         <upstream binary name> [flags]      (busybox style, e.g. livenessprobe --csi-address=...)\n  \
         {PROGRAM} --list | --help [MODULE] | --version\n  \
         {PROGRAM} explain pvc|volumeattachment|volumesnapshot NAME [--endpoint ADDRESS]   (why it is not done; --help)\n\nModules:\n"
    );
    out.push_str(&list());
    out.push_str("\nShared flags (before the first module or inside any module, values must agree):\n");
    shared_table(|_| true).render(&mut out);
    out.push_str(BUDGET_HELP);
    out
}

/// How the modules of one process share the API budget (`--help`).
pub const BUDGET_HELP: &str = "\nAPI budget: every module has its own --kube-api-qps/--kube-api-burst, as the upstream sidecar\n\
     it replaces had in its own process. Given before the first module they apply to every module;\n\
     inside a module's segment (or as KEP-4958's --<controller>-kube-api-qps) to that module only.\n\
     The modules' buckets are pooled: a module borrows what modules without critical work leave,\n\
     every module with critical work gets at least its own rate, a module's Event writes wait\n\
     while its own other requests wait, and the process never sends more than the sum of the\n\
     modules' budgets.\n";

fn module_help(title: &str, desc: &ModuleDesc) -> String {
    let mut out =
        format!("Usage: {title} [flags]\n\n{}: {} (replaces {})\n\nFlags:\n", desc.name, desc.summary, desc.replaces);
    FlagTable::from_info((desc.info)(), |_| true).render(&mut out);
    out.push_str("\nShared flags:\n");
    shared_table(|n| module_accepts_shared(desc, n)).render(&mut out);
    out
}

/// The README's flag reference: each module's own flags, then every
/// shared flag with the modules that accept it, as Markdown. A test keeps
/// README.md equal to this.
pub fn flag_reference_markdown() -> String {
    let cell = |t: &str| t.replace('|', "\\|");
    let flag = |name: &str, kind: &FlagKind| format!("`--{name}{}`", if *kind == FlagKind::Value { "=…" } else { "" });
    let mut out = String::new();
    for desc in modules::MODULES {
        out.push_str(&format!(
            "#### {} (`{}`, replaces {})\n\n| Flag | Meaning |\n|---|---|\n",
            desc.name,
            desc.binary_names.join("`, `"),
            desc.replaces
        ));
        for (name, (kind, text)) in &FlagTable::from_info((desc.info)(), |_| true).0 {
            out.push_str(&format!("| {} | {} |\n", flag(name, kind), cell(text)));
        }
        out.push('\n');
    }
    out.push_str("#### Shared flags\n\n| Flag | Meaning | Accepted by |\n|---|---|---|\n");
    for (name, (kind, text)) in &shared_table(|_| true).0 {
        let users: Vec<&str> =
            modules::MODULES.iter().filter(|d| module_accepts_shared(d, name)).map(|d| d.name).collect();
        if !users.is_empty() {
            out.push_str(&format!("| {} | {} | {} |\n", flag(name, kind), cell(text), users.join(", ")));
        }
    }
    out
}

pub mod kep;

#[cfg(test)]
mod tests;
