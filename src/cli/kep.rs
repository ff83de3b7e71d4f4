//! The command line of upstream's planned all-in-one binary (KEP-4958,
//! `csi-sidecars`): `--controllers=attacher,provisioner,...` selects the
//! modules, a controller's own flag is given with its name as a prefix
//! (`--attacher-timeout=30s`, `--provisioner-worker-threads=5`), and a
//! flag without a prefix is common: a shared flag once for the process, or
//! a module flag for every selected controller that has it (`--timeout=30s`),
//! which the prefixed form overrides for its controller.
//!
//! The form is translated into csi-sidecar's segments (`MODULE [flags]`)
//! and parsed by the same code as every other command line, so a value is
//! checked exactly as there and an error names the flag and the module.

use super::{Command, FlagTable, PROGRAM, Segment, VERSION, build, module_accepts_shared, shared_table, usage_error};
use crate::{
    flags::goflags::{self, FlagKind, GivenFlag},
    modules::{self, ModuleDesc},
};

/// The binary name KEP-4958 gives the all-in-one sidecar.
pub const KEP_PROGRAM: &str = "csi-sidecars";

/// The flag that selects the controllers.
pub const CONTROLLERS_FLAG: &str = "controllers";

/// Whether `args` (after argv[0]) use the KEP-4958 form: the binary is
/// called `csi-sidecars`, or `--controllers` comes before any module name.
pub fn wants(program: &str, args: &[String]) -> bool {
    program == KEP_PROGRAM
        || args.iter().take_while(|a| modules::lookup(a).is_none()).any(|a| {
            let name = a.trim_start_matches('-').split('=').next().unwrap_or_default();
            a.starts_with('-') && name == CONTROLLERS_FLAG
        })
}

/// The module a KEP-4958 controller name selects.
pub fn controller_module(name: &str) -> Option<&'static str> {
    modules::kep_controllers().find(|(c, _)| *c == name).map(|(_, m)| m)
}

const FEATURE_GATES_FLAG: &str = "feature-gates";

/// The feature gates a module's `--feature-gates` accepts.
fn known_gates(desc: &ModuleDesc) -> Vec<&'static str> {
    crate::flags::gates::names(desc.feature_gates).collect()
}

/// A flag name split into (module, flag) when it carries a controller
/// prefix (the longest matching one) and the rest is a flag of that module.
fn prefixed(name: &str) -> Option<(&'static str, &str)> {
    let mut hits: Vec<(&str, &str)> = modules::kep_controllers()
        .filter_map(|(c, m)| name.strip_prefix(c).and_then(|r| r.strip_prefix('-')).map(|rest| (m, rest)))
        .collect();
    hits.sort_by_key(|(_, rest)| rest.len());
    hits.into_iter().find(|(m, rest)| module_flag_kind(m, rest).is_some())
}

fn desc(module: &str) -> Option<&'static ModuleDesc> {
    modules::rows().into_iter().find(|d| d.name == module)
}

/// The kind of `flag` in `module`'s segment: its own flags, then the shared
/// flags it accepts.
fn module_flag_kind(module: &str, flag: &str) -> Option<FlagKind> {
    let desc = desc(module)?;
    FlagTable::from_info((desc.info)(), |_| true)
        .kind(flag)
        .or_else(|| shared_table(|n| module_accepts_shared(desc, n)).kind(flag))
}

/// The kind of a module's own flag `flag` in any module.
fn any_module_own_kind(flag: &str) -> Option<FlagKind> {
    modules::rows().into_iter().find_map(|d| FlagTable::from_info((d.info)(), |_| true).kind(flag))
}

fn own_kind(module: &str, flag: &str) -> Option<FlagKind> {
    FlagTable::from_info((desc(module)?.info)(), |_| true).kind(flag)
}

fn is_help(name: &str) -> bool {
    matches!(name, "help" | "h")
}

/// The kind of any flag the KEP-4958 form accepts.
fn kind_of(name: &str) -> Option<FlagKind> {
    if name == CONTROLLERS_FLAG {
        return Some(FlagKind::Value);
    }
    if is_help(name) {
        return Some(FlagKind::Bool);
    }
    if let Some((module, flag)) = prefixed(name) {
        return module_flag_kind(module, flag);
    }
    shared_table(|_| true).kind(name).or_else(|| any_module_own_kind(name))
}

/// `--controllers` as modules, in the given order, each once.
fn selected(list: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(module) = controller_module(name) else {
            let known: Vec<&str> = modules::kep_controllers().map(|(c, _)| c).collect();
            return Err(format!("--{CONTROLLERS_FLAG}: unknown controller {name:?}; known: {}", known.join(", ")));
        };
        if !out.contains(&module) {
            out.push(module);
        }
    }
    if out.is_empty() {
        return Err(format!("--{CONTROLLERS_FLAG}: no controller selected"));
    }
    Ok(out)
}

/// One flag as a segment argument, in a form the tokenizer reads back.
fn arg(flag: &str, value: &str) -> String {
    format!("--{flag}={value}")
}

/// Parses the KEP-4958 form (`args` after argv[0]).
pub fn parse(program: String, args: &[String]) -> Command {
    let t = match goflags::tokenize(args, kind_of) {
        Ok(t) => t,
        Err(e) => return usage_error(None, e),
    };
    if t.rest < args.len() {
        return usage_error(
            None,
            format!(
                "unexpected argument {:?}: with --{CONTROLLERS_FLAG}, modules are selected by that flag",
                args[t.rest]
            ),
        );
    }
    let flags = goflags::last_wins(t.flags);
    if flags.iter().any(|f| is_help(&f.name) && f.value == "true") || flags.is_empty() {
        return Command::Exit { code: if flags.is_empty() { 2 } else { 0 }, text: help() };
    }
    let Some(list) = flags.iter().find(|f| f.name == CONTROLLERS_FLAG).map(|f| f.value.clone()) else {
        if flags.iter().any(|f| f.name == "version" && f.value == "true") {
            return Command::Exit { code: 0, text: format!("{program} {VERSION}\n") };
        }
        return usage_error(
            None,
            format!("--{CONTROLLERS_FLAG} is required (e.g. --{CONTROLLERS_FLAG}=attacher,provisioner)"),
        );
    };
    let modules = match selected(&list) {
        Ok(m) => m,
        Err(e) => return usage_error(None, e),
    };
    let shared = shared_table(|_| true);
    let mut top: Vec<GivenFlag> = Vec::new();
    let mut segments: Vec<Segment> = Vec::new();
    for m in &modules {
        let Some(d) = desc(m) else { return usage_error(None, format!("controller {m} is not built")) };
        segments.push(Segment { desc: d, args: Vec::new() });
    }
    // Common module flags first, so a prefixed one given anywhere wins
    // (a segment's last value wins).
    for f in flags.iter().filter(|f| f.name != CONTROLLERS_FLAG && prefixed(&f.name).is_none()) {
        if shared.kind(&f.name).is_some() {
            top.push(f.clone());
            continue;
        }
        if f.name == FEATURE_GATES_FLAG {
            // One gate list for all: each controller gets the gates it knows.
            for part in f.value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let gate = part.split_once('=').map_or(part, |(k, _)| k).trim();
                let mut known = false;
                for s in segments.iter_mut().filter(|s| known_gates(s.desc).contains(&gate)) {
                    known = true;
                    match s.args.iter_mut().find(|a| a.starts_with("--feature-gates=")) {
                        Some(a) => a.push_str(&format!(",{part}")),
                        None => s.args.push(arg(FEATURE_GATES_FLAG, part)),
                    }
                }
                if !known {
                    return usage_error(
                        None,
                        format!(
                            "--{FEATURE_GATES_FLAG}: unrecognized feature gate {gate:?} for the selected controllers ({})",
                            modules.join(", ")
                        ),
                    );
                }
            }
            continue;
        }
        let takers: Vec<&mut Segment> =
            segments.iter_mut().filter(|s| own_kind(s.desc.name, &f.name).is_some()).collect();
        if takers.is_empty() {
            return usage_error(
                None,
                format!("flag --{} belongs to none of the selected controllers ({})", f.name, modules.join(", ")),
            );
        }
        for s in takers {
            s.args.push(arg(&f.name, &f.value));
        }
    }
    for f in &flags {
        let Some((module, flag)) = prefixed(&f.name) else { continue };
        match segments.iter_mut().find(|s| s.desc.name == module) {
            Some(s) => s.args.push(arg(flag, &f.value)),
            None => {
                return usage_error(
                    None,
                    format!("flag --{} is for {module}, which --{CONTROLLERS_FLAG} does not select", f.name),
                );
            }
        }
    }
    build(program, top, segments)
}

/// `csi-sidecars --help`.
pub fn help() -> String {
    let mut out = format!(
        "{KEP_PROGRAM} (csi-sidecar {VERSION}): the KEP-4958 all-in-one command line.\n\n\
         Usage:\n  {KEP_PROGRAM} --{CONTROLLERS_FLAG}=NAME[,NAME...] [common flags] [--NAME-FLAG=VALUE ...]\n\n\
         Controllers (KEP-4958 name → {PROGRAM} module):\n"
    );
    for (c, m) in modules::kep_controllers() {
        out.push_str(&format!("  {c:<22} {m}\n"));
    }
    out.push_str(
        "\nA flag without a prefix is common: a shared flag once for the process, or a module flag\n\
         for every selected controller that has it (--timeout=30s). --NAME-FLAG sets FLAG for one\n\
         controller and overrides the common value (--attacher-timeout=15s). Each module's flags:\n",
    );
    out.push_str(&format!("'{PROGRAM} --help MODULE'.\n"));
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        cli::parse,
        modules::{
            ModuleConfig, attacher::config::AttacherFlags, health::config::HealthMonitorFlags,
            prober::config::ProberFlags, provisioner::config::ProvisionerFlags, registrar::config::RegistrarFlags,
            resizer::config::ResizerFlags, snapshotter::config::SnapshotterFlags,
        },
    };

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn modules_of(s: &str) -> (crate::cli::SharedFlags, Vec<ModuleConfig>) {
        match parse(&argv(s)) {
            Command::Run(inv) => (inv.shared, inv.modules),
            Command::Exit { code, text } => panic!("{s}: exit {code}: {text}"),
        }
    }

    fn exit(s: &str) -> (u8, String) {
        match parse(&argv(s)) {
            Command::Exit { code, text } => (code, text),
            Command::Run(inv) => panic!("{s}: expected exit, got {inv:?}"),
        }
    }

    /// The controller manifest of KEP-4958's "Command Line" section.
    const KEP_CONTROLLER: &str = "csi-sidecars --csi-address=unix:/csi/csi.sock \
        --controllers=attacher,provisioner,resizer,snapshotter --feature-gates=Topology=true \
        --leader-election --leader-election-namespace=kube-system --timeout=30s \
        --attacher-timeout=30s --attacher-worker-threads=100 --provisioner-timeout=30s";

    #[test]
    fn the_keps_controller_manifest_maps_onto_the_modules() {
        let (shared, modules) = modules_of(KEP_CONTROLLER);
        let names: Vec<&str> = modules.iter().map(ModuleConfig::name).collect();
        assert_eq!(names, ["attacher", "provisioner", "resizer", "snapshotter"]);
        assert_eq!(shared.csi_address(), "unix:/csi/csi.sock");
        assert!(shared.leader_election);
        assert_eq!(shared.leader_election_namespace.as_deref(), Some("kube-system"));
        for m in &modules {
            if let Some(a) = m.flags::<AttacherFlags>() {
                assert_eq!(a.timeout, Duration::from_secs(30));
                assert_eq!(a.worker_threads, 100);
                assert_eq!(a.feature_gates, "", "Topology is the provisioner's gate");
            } else if let Some(p) = m.flags::<ProvisionerFlags>() {
                assert_eq!(p.timeout, Duration::from_secs(30));
                assert_eq!(p.worker_threads, 100, "the provisioner's own default");
                assert_eq!(p.feature_gates, "Topology=true");
            } else if let Some(r) = m.flags::<ResizerFlags>() {
                assert_eq!(r.timeout, Duration::from_secs(30), "the common --timeout");
            } else if let Some(s) = m.flags::<SnapshotterFlags>() {
                assert_eq!(s.timeout, Duration::from_secs(30), "the common --timeout");
            } else {
                panic!("unexpected {m:?}");
            }
            assert!(m.validate().is_ok(), "{m:?}");
        }
    }

    #[test]
    fn a_prefixed_flag_overrides_the_common_one_for_its_controller_only() {
        for order in [
            "csi-sidecars --controllers=attacher,resizer --timeout=20s --attacher-timeout=5s",
            "csi-sidecars --attacher-timeout=5s --controllers=attacher,resizer --timeout=20s",
        ] {
            let (_, modules) = modules_of(order);
            for m in &modules {
                if let Some(a) = m.flags::<AttacherFlags>() {
                    assert_eq!(a.timeout, Duration::from_secs(5), "{order}");
                } else if let Some(r) = m.flags::<ResizerFlags>() {
                    assert_eq!(r.timeout, Duration::from_secs(20), "{order}");
                } else {
                    panic!("unexpected {m:?}");
                }
            }
        }
        // Defaults stay each module's own when nothing common is given.
        let (_, modules) = modules_of("csi-sidecars --controllers=attacher,provisioner --provisioner-worker-threads=7");
        for m in &modules {
            if let Some(a) = m.flags::<AttacherFlags>() {
                assert_eq!((a.timeout, a.worker_threads), (Duration::from_secs(15), 10));
            } else if let Some(p) = m.flags::<ProvisionerFlags>() {
                assert_eq!((p.timeout, p.worker_threads), (Duration::from_secs(10), 7));
            } else {
                panic!("unexpected {m:?}");
            }
        }
    }

    #[test]
    fn a_prefixed_budget_is_that_controllers_own_and_the_rest_keep_the_common_one() {
        let budgets = |line: &str| match crate::cli::parse(&argv(line)) {
            Command::Run(inv) => inv.budgets.iter().map(|b| (b.module, b.qps, b.burst)).collect::<Vec<_>>(),
            Command::Exit { text, .. } => panic!("{line}: {text}"),
        };
        assert_eq!(
            budgets(
                "csi-sidecars --controllers=attacher,provisioner,livenessprobe --kube-api-qps=8 \
                 --attacher-kube-api-qps=20 --provisioner-kube-api-burst=40"
            ),
            [("attacher", 20.0, 10), ("provisioner", 8.0, 40)],
            "the prober has no API budget"
        );
        assert_eq!(
            budgets("csi-sidecars --controllers=resizer,snapshotter"),
            [("resizer", 5.0, 10), ("snapshotter", 5.0, 10)],
            "upstream's defaults, each"
        );
    }

    #[test]
    fn the_node_form_and_every_controller_name_select_their_module() {
        let (_, modules) = modules_of(
            "csi-sidecars --csi-address=unix:/csi/csi.sock --controllers=node-driver-registrar,livenessprobe \
             --kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock --livenessprobe-probe-timeout=2s",
        );
        assert_eq!(modules.iter().map(ModuleConfig::name).collect::<Vec<_>>(), ["registrar", "prober"]);
        for m in &modules {
            if let Some(r) = m.flags::<RegistrarFlags>() {
                assert_eq!(r.kubelet_registration_path.as_deref(), Some("/var/lib/kubelet/plugins/x/csi.sock"));
            } else if let Some(p) = m.flags::<ProberFlags>() {
                assert_eq!(p.probe_timeout, Duration::from_secs(2));
            } else {
                panic!("unexpected {m:?}");
            }
        }
        for (controller, module) in modules::kep_controllers() {
            let extra = if module == "registrar" { " --kubelet-registration-path=/k/csi.sock" } else { "" };
            let (_, m) = modules_of(&format!("csi-sidecar --controllers={controller}{extra}"));
            assert_eq!(m.iter().map(ModuleConfig::name).collect::<Vec<_>>(), [module], "{controller}");
        }
    }

    /// The health monitor (upstream's external-health-monitor-controller) in
    /// the KEP form beside a controller: its own prefixed flags (a value, a
    /// switch), the common ones it shares, and its usage errors.
    #[test]
    fn the_health_monitor_takes_its_prefixed_and_common_flags() {
        let (_, modules) = modules_of(
            "csi-sidecars --controllers=attacher,health-monitor --timeout=30s --worker-threads=3 \
             --health-monitor-monitor-interval=30s --health-monitor-enable-node-watcher \
             --health-monitor-worker-threads=7 --health-monitor-list-volumes-interval=2m",
        );
        assert_eq!(modules.iter().map(ModuleConfig::name).collect::<Vec<_>>(), ["attacher", "health-monitor"]);
        for m in &modules {
            if let Some(h) = m.flags::<HealthMonitorFlags>() {
                assert_eq!(h.monitor_interval, Duration::from_secs(30));
                assert_eq!(h.list_volumes_interval, Duration::from_secs(120));
                assert!(h.enable_node_watcher);
                assert_eq!((h.timeout, h.worker_threads), (Duration::from_secs(30), 7), "common, then its own");
            } else if let Some(a) = m.flags::<AttacherFlags>() {
                assert_eq!((a.timeout, a.worker_threads), (Duration::from_secs(30), 3));
            } else {
                panic!("unexpected {m:?}");
            }
            assert!(m.validate().is_ok(), "{m:?}");
        }
        for (line, want) in [
            ("csi-sidecars --controllers=health-monitor --health-monitor-timeout=soon", "soon"),
            ("csi-sidecars --controllers=attacher --health-monitor-monitor-interval=1m", "is for health-monitor"),
            ("csi-sidecars --controllers=health-monitor --feature-gates=Topology=true", "unrecognized feature gate"),
        ] {
            let (code, text) = exit(line);
            assert_eq!(code, 2, "{line}: {text}");
            assert!(text.contains(want), "{line}: {text}");
        }
    }

    #[test]
    fn bad_kep_command_lines_exit_2_naming_the_flag() {
        let cases: &[(&str, &str)] = &[
            ("csi-sidecars --controllers=attacher,frobnicator", "unknown controller \"frobnicator\""),
            ("csi-sidecars --controllers=", "no controller selected"),
            ("csi-sidecars --leader-election", "--controllers is required"),
            ("csi-sidecars --controllers=attacher --volume-name-prefix=x", "--volume-name-prefix belongs to none"),
            (
                "csi-sidecars --controllers=attacher --provisioner-timeout=3s",
                "--provisioner-timeout is for provisioner",
            ),
            ("csi-sidecars --controllers=attacher --attacher-nope=1", "nope"),
            ("csi-sidecars --controllers=attacher --attacher-timeout=soon", "attacher"),
            (
                "csi-sidecars --controllers=attacher --feature-gates=Topology=true",
                "unrecognized feature gate \"Topology\"",
            ),
            ("csi-sidecars --controllers=attacher provisioner", "unexpected argument \"provisioner\""),
            ("csi-sidecars --controllers=attacher --csi-address=/a --attacher-csi-address=/b", "conflicting values"),
            (
                "csi-sidecars --controllers=attacher --kube-api-qps=5 --provisioner-kube-api-qps=7",
                "--provisioner-kube-api-qps is for provisioner",
            ),
            ("csi-sidecars --controllers=attacher --attacher-kube-api-burst=lots", "attacher"),
        ];
        for (line, want) in cases {
            let (code, text) = exit(line);
            assert_eq!(code, 2, "{line}: {text}");
            assert!(text.contains(want), "{line}: {text}");
        }
    }

    #[test]
    fn the_multicall_forms_are_untouched_and_help_lists_the_mapping() {
        let (_, m) = modules_of("csi-sidecar --csi-address=/c.sock attacher --timeout=3s");
        assert_eq!(m.iter().map(ModuleConfig::name).collect::<Vec<_>>(), ["attacher"]);
        assert!(!wants("csi-sidecar", &argv("attacher --timeout=3s")));
        assert!(wants("csi-sidecar", &argv("--v=2 --controllers=attacher")));
        assert!(wants("csi-sidecars", &argv("--controllers attacher")));
        let (code, text) = exit("csi-sidecars --help");
        assert_eq!(code, 0);
        assert!(text.contains("node-driver-registrar") && text.contains("registrar"), "{text}");
        assert_eq!(exit("csi-sidecars --version"), (0, format!("csi-sidecars {VERSION}\n")));
    }
}
