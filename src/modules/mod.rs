//! The modules, one per upstream sidecar, and the static table that names
//! them. argv[0] and the subcommand both resolve through [`MODULES`].

pub mod attacher;
pub mod contract;
pub mod health;
pub mod kit;
pub mod leading;
pub mod prober;
pub mod provisioner;
pub mod registrar;
pub mod resizer;
pub mod snapshot_metadata;
pub mod snapshotter;
#[cfg(test)]
mod testing;
pub mod views;

use std::{any::Any, fmt, time::Duration};

use argh::ArgsInfo;
pub use contract::{ChartRow, DynEq, Module, ModuleContext, ModuleError, ParseFlags, Pods, Rule, parse_flags};
use futures::future::BoxFuture;

use crate::flags::gates::KnownGates;

/// A parsed module configuration, ready to run: its table row and its flags.
pub struct ModuleConfig {
    desc: &'static ModuleDesc,
    module: Box<dyn Module>,
}

/// One row of the module table.
#[derive(Clone, Copy)]
pub struct ModuleDesc {
    /// Subcommand name.
    pub name: &'static str,
    /// Upstream binary names (argv[0] basenames) that select this module.
    pub binary_names: &'static [&'static str],
    /// The upstream sidecar this module replaces.
    pub replaces: &'static str,
    /// One line for `--list`.
    pub summary: &'static str,
    /// argh's description of the module's own flags.
    pub info: fn() -> argh::CommandInfoWithArgs,
    /// Parses normalised arguments into the module's flags
    /// ([`parse_flags`] of the module's flags struct).
    pub parse: ParseFlags,
    /// The shared flags (besides logging) upstream accepts for this sidecar.
    /// Groups of shared flag names (see `flags::shared::CONTROLLER`).
    pub shared: &'static [&'static [&'static str]],
    /// The gates the module's `--feature-gates` knows (KEP-4958's common
    /// `--feature-gates` gives each module its own).
    pub feature_gates: KnownGates,
    /// KEP-4958 controller names that select it besides `name` (each is
    /// also a flag prefix, `--<name>-<flag>`).
    pub kep_names: &'static [&'static str],
    /// What it needs from the host.
    pub needs: Needs,
    /// The API kinds whose progress its ledger answers for (`explain` asks
    /// it about them; no other row lists them).
    pub kinds: &'static [&'static str],
    /// The rules of its ClusterRole (`manifests/rbac/<name>.yaml` and the
    /// chart are checked against them); none for a node module.
    pub cluster_rules: &'static [Rule],
    /// Its place in the Helm chart (values block, pods, container).
    pub chart: ChartRow,
    /// A command-line tool of the module's (`csi-sidecar <name> <args>`):
    /// `None` when the arguments are the module's own, else the exit status.
    pub tool: Option<Tool>,
}

/// A module's command-line tool: `None` when the arguments are the
/// module's own, else the exit status.
pub type Tool = fn(&[String]) -> Option<u8>;

/// What a module needs from the host; the host asks the rows, never a
/// module's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    /// The Kubernetes client, the shared informer cache and a ledger.
    pub kube: bool,
    /// `$KUBECONFIG` counts as the kubeconfig (upstream's program reads it).
    pub kubeconfig_env: bool,
    /// The health port upstream's program serves by default (livenessprobe's
    /// `:9808`) when no HTTP endpoint is given.
    pub default_health_port: bool,
    /// The kubelet's plugin registration directory (the node pod mounts
    /// it; the module serves its registration socket there).
    pub registration_dir: bool,
    /// A TCP listener the module serves on (its address from its flags,
    /// [`Module::listen_address`]), bound by the host before any module
    /// starts and kept across the module's restarts.
    pub listener: bool,
}

/// A controller: Kubernetes, its own Lease and ledger.
const CONTROLLER: Needs =
    Needs { kube: true, kubeconfig_env: false, default_health_port: false, registration_dir: false, listener: false };
/// A node module: the driver's socket and the HTTP server only.
const NODE: Needs =
    Needs { kube: false, kubeconfig_env: false, default_health_port: false, registration_dir: false, listener: false };

/// A module of the controller pod alone.
const CONTROLLER_POD: Pods = Pods { controller: true, node: false };
/// A module of the node pod alone.
const NODE_POD: Pods = Pods { controller: false, node: true };

/// Every module.
pub static MODULES: &[ModuleDesc] = &[
    ModuleDesc {
        name: "provisioner",
        binary_names: &["csi-provisioner"],
        replaces: "external-provisioner",
        summary: "dynamic provisioning and deletion of volumes",
        info: provisioner::config::ProvisionerFlags::get_args_info,
        parse: parse_flags::<provisioner::config::ProvisionerFlags>,
        shared: provisioner::config::SHARED_FLAGS,
        feature_gates: provisioner::config::FEATURE_GATES,
        kep_names: &[],
        needs: Needs { kubeconfig_env: true, ..CONTROLLER },
        kinds: &["PersistentVolumeClaim", "PersistentVolume"],
        cluster_rules: provisioner::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "provisioner",
            pods: CONTROLLER_POD,
            container: "csi-provisioner",
            port_name: "provisioner",
            port: 8080,
            value_rules: &[],
        },
        tool: None,
    },
    ModuleDesc {
        name: "attacher",
        binary_names: &["csi-attacher"],
        replaces: "external-attacher",
        summary: "ControllerPublish/Unpublish for VolumeAttachments",
        info: attacher::config::AttacherFlags::get_args_info,
        parse: parse_flags::<attacher::config::AttacherFlags>,
        shared: attacher::config::SHARED_FLAGS,
        feature_gates: attacher::config::FEATURE_GATES,
        kep_names: &[],
        needs: CONTROLLER,
        kinds: &["VolumeAttachment"],
        cluster_rules: attacher::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "attacher",
            pods: CONTROLLER_POD,
            container: "csi-attacher",
            port_name: "attacher",
            port: 8081,
            value_rules: &[],
        },
        tool: None,
    },
    ModuleDesc {
        name: "resizer",
        binary_names: &["csi-resizer"],
        replaces: "external-resizer",
        summary: "volume expansion and VolumeAttributesClass changes",
        info: resizer::config::ResizerFlags::get_args_info,
        parse: parse_flags::<resizer::config::ResizerFlags>,
        shared: resizer::config::SHARED_FLAGS,
        feature_gates: resizer::config::FEATURE_GATES,
        kep_names: &[],
        needs: CONTROLLER,
        kinds: &[],
        cluster_rules: resizer::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "resizer",
            pods: CONTROLLER_POD,
            container: "csi-resizer",
            port_name: "resizer",
            port: 8082,
            value_rules: &[],
        },
        tool: None,
    },
    ModuleDesc {
        name: "snapshotter",
        binary_names: &["csi-snapshotter"],
        replaces: "csi-snapshotter",
        summary: "CreateSnapshot/DeleteSnapshot/ListSnapshots for VolumeSnapshotContents",
        info: snapshotter::config::SnapshotterFlags::get_args_info,
        parse: parse_flags::<snapshotter::config::SnapshotterFlags>,
        shared: snapshotter::config::SHARED_FLAGS,
        feature_gates: snapshotter::config::FEATURE_GATES,
        kep_names: &[],
        needs: CONTROLLER,
        kinds: &["VolumeSnapshot", "VolumeSnapshotContent", "VolumeGroupSnapshotContent"],
        cluster_rules: snapshotter::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "snapshotter",
            pods: CONTROLLER_POD,
            container: "csi-snapshotter",
            port_name: "snapshotter",
            port: 8083,
            value_rules: &[],
        },
        tool: None,
    },
    ModuleDesc {
        name: "health-monitor",
        binary_names: &["csi-external-health-monitor-controller"],
        replaces: "external-health-monitor",
        summary: "volume health: claim events, or status.healthStatus with CSI 1.13 drivers",
        info: health::config::HealthMonitorFlags::get_args_info,
        parse: parse_flags::<health::config::HealthMonitorFlags>,
        shared: health::config::SHARED_FLAGS,
        feature_gates: &[],
        kep_names: &[],
        needs: CONTROLLER,
        kinds: &[],
        cluster_rules: health::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "healthMonitor",
            pods: CONTROLLER_POD,
            container: "csi-external-health-monitor-controller",
            port_name: "health-monitor",
            port: 8084,
            value_rules: health::config::VALUE_RULES,
        },
        tool: None,
    },
    ModuleDesc {
        name: "snapshot-metadata",
        binary_names: &["csi-snapshot-metadata"],
        replaces: "external-snapshot-metadata",
        summary: "serves the SnapshotMetadata API (changed block tracking) from the driver",
        info: snapshot_metadata::config::SnapshotMetadataFlags::get_args_info,
        parse: parse_flags::<snapshot_metadata::config::SnapshotMetadataFlags>,
        shared: snapshot_metadata::config::SHARED_FLAGS,
        feature_gates: &[],
        kep_names: &[],
        needs: Needs { listener: true, ..CONTROLLER },
        kinds: &[],
        cluster_rules: snapshot_metadata::config::CLUSTER_RULES,
        chart: ChartRow {
            values_key: "snapshotMetadata",
            pods: CONTROLLER_POD,
            container: "csi-snapshot-metadata",
            port_name: "snapshot-meta",
            port: 8085,
            value_rules: &[],
        },
        tool: Some(snapshot_metadata::lister::tool),
    },
    ModuleDesc {
        name: "registrar",
        binary_names: &["csi-node-driver-registrar", "node-driver-registrar"],
        replaces: "node-driver-registrar",
        summary: "registers the driver with the kubelet's plugin manager",
        info: registrar::config::RegistrarFlags::get_args_info,
        parse: parse_flags::<registrar::config::RegistrarFlags>,
        shared: registrar::config::SHARED_FLAGS,
        feature_gates: &[],
        kep_names: &["node-driver-registrar"],
        needs: Needs { registration_dir: true, ..NODE },
        kinds: &[],
        cluster_rules: &[],
        chart: ChartRow {
            values_key: "registrar",
            pods: NODE_POD,
            container: "node-driver-registrar",
            port_name: "registrar",
            port: 9809,
            value_rules: &[],
        },
        tool: None,
    },
    ModuleDesc {
        name: "prober",
        binary_names: &["livenessprobe"],
        replaces: "livenessprobe",
        summary: "answers /healthz from the driver's Probe",
        info: prober::config::ProberFlags::get_args_info,
        parse: parse_flags::<prober::config::ProberFlags>,
        shared: prober::config::SHARED_FLAGS,
        feature_gates: &[],
        kep_names: &["livenessprobe"],
        needs: Needs { default_health_port: true, ..NODE },
        kinds: &[],
        cluster_rules: &[],
        chart: ChartRow {
            values_key: "prober",
            pods: Pods { controller: true, node: true },
            container: "liveness-probe",
            port_name: "healthz",
            port: 9898,
            value_rules: &[],
        },
        tool: None,
    },
];

impl ModuleDesc {
    /// Whether the module campaigns for a Lease: a Kubernetes module that
    /// takes the leader-election flags (snapshot-metadata talks to the API
    /// without one: every replica serves).
    pub fn leads(&self) -> bool {
        self.needs.kube && self.shared.iter().any(|group| group.contains(&"leader-election"))
    }

    /// Parses normalised arguments into this module's configuration.
    pub fn configure(&'static self, args: &[&str]) -> Result<ModuleConfig, argh::EarlyExit> {
        (self.parse)(self.name, args).map(|module| ModuleConfig { desc: self, module })
    }
}

/// Rows beside the table: modules a program embedding csi-sidecar adds
/// (the tests add their own), each by its row alone ([`add_row`]).
static ADDED: std::sync::RwLock<Vec<&'static ModuleDesc>> = std::sync::RwLock::new(Vec::new());

/// A row [`add_row`] refuses: one of its names or kinds is another row's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("module {row}: {what} {taken:?} is already module {by}'s")]
pub struct RowClash {
    /// The refused row's name.
    pub row: &'static str,
    /// What clashes ("name", "kind").
    pub what: &'static str,
    /// The name or kind.
    pub taken: &'static str,
    /// The row that has it.
    pub by: &'static str,
}

/// Every row: the table's, then the added ones, in the order added.
pub fn rows() -> Vec<&'static ModuleDesc> {
    let added = ADDED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    MODULES.iter().chain(added.iter().copied()).collect()
}

/// Adds a module by its row: the command line, the host, `--list` and the
/// kind lookup know it from then on. Refused when a name (subcommand,
/// binary or KEP-4958 name) or a kind is already another row's.
pub fn add_row(row: &'static ModuleDesc) -> Result<(), RowClash> {
    let mut added = ADDED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let names = |d: &'static ModuleDesc| {
        std::iter::once(d.name).chain(d.binary_names.iter().copied()).chain(d.kep_names.iter().copied())
    };
    for other in MODULES.iter().chain(added.iter().copied()) {
        let clash = |what, taken| RowClash { row: row.name, what, taken, by: other.name };
        if let Some(n) = names(row).find(|n| names(other).any(|o| o == *n)) {
            return Err(clash("name", n));
        }
        if let Some(k) = row.kinds.iter().find(|k| other.kinds.contains(k)) {
            return Err(clash("kind", k));
        }
    }
    added.push(row);
    Ok(())
}

/// KEP-4958 controller names → modules: each row's `kep_names`, then its
/// own name (also accepted).
pub fn kep_controllers() -> impl Iterator<Item = (&'static str, &'static str)> {
    let rows = rows();
    let kep: Vec<_> = rows.iter().flat_map(|m| m.kep_names.iter().map(move |k| (*k, m.name))).collect();
    kep.into_iter().chain(rows.into_iter().map(|m| (m.name, m.name)))
}

/// The module whose ledger answers for objects of API kind `kind`; `None`
/// for a kind no module tracks.
pub fn module_of_kind(kind: &str) -> Option<&'static str> {
    rows().into_iter().find(|m| m.kinds.contains(&kind)).map(|m| m.name)
}

/// The module a name selects: its subcommand name or an upstream binary name.
pub fn lookup(name: &str) -> Option<&'static ModuleDesc> {
    rows().into_iter().find(|m| m.name == name || m.binary_names.contains(&name))
}

impl ModuleConfig {
    /// The module's table name.
    pub fn name(&self) -> &'static str {
        self.desc.name
    }

    /// The module's row of [`MODULES`].
    pub fn desc(&self) -> &'static ModuleDesc {
        self.desc
    }

    /// The module's typed flags, when they are a `T`.
    pub fn flags<T: Module>(&self) -> Option<&T> {
        (&*self.module as &dyn Any).downcast_ref::<T>()
    }

    /// See [`Module::validate`].
    pub fn validate(&self) -> Result<(), ModuleError> {
        self.module.validate()
    }

    /// See [`Module::early_exit`].
    pub fn early_exit(&self) -> Option<u8> {
        self.module.early_exit()
    }

    /// See [`Module::discovery_timeout`].
    pub fn discovery_timeout(&self) -> Duration {
        self.module.discovery_timeout()
    }

    /// The row's [`Needs::kube`].
    pub fn needs_kube(&self) -> bool {
        self.desc.needs.kube
    }

    /// See [`Module::master`].
    pub fn master(&self) -> Option<&str> {
        self.module.master()
    }

    /// The address the host binds for the module: [`Module::listen_address`]
    /// when its row needs a listener.
    pub fn listen_address(&self) -> Option<String> {
        self.desc.needs.listener.then(|| self.module.listen_address()).flatten()
    }

    /// Runs one instance of the module (see [`Module::run`]).
    pub fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        self.module.run(ctx)
    }
}

impl fmt::Debug for ModuleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple(self.name()).field(&self.module).finish()
    }
}

impl PartialEq for ModuleConfig {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name() && DynEq::dyn_eq(&*self.module, &*other.module as &dyn Any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_parses_its_defaults_into_a_config_of_its_own() {
        for desc in MODULES {
            let config = desc.configure(&[]).unwrap_or_else(|e| panic!("{}: {}", desc.name, e.output));
            assert_eq!(config.name(), desc.name);
            assert!(std::ptr::eq(config.desc(), desc));
            assert_eq!(lookup(desc.name).map(|d| d.name), Some(desc.name));
            assert_eq!(config, desc.configure(&[]).unwrap_or_else(|e| panic!("{}", e.output)));
            assert!(format!("{config:?}").starts_with(desc.name), "{config:?}");
        }
        let prober = lookup("prober").and_then(|d| d.configure(&[]).ok()).expect("prober");
        let registrar = lookup("registrar").and_then(|d| d.configure(&[]).ok()).expect("registrar");
        assert_ne!(prober, registrar);
        assert!(prober.flags::<prober::config::ProberFlags>().is_some());
        assert!(prober.flags::<registrar::config::RegistrarFlags>().is_none());
        let slower = lookup("prober").and_then(|d| d.configure(&["--probe-timeout", "5s"]).ok()).expect("prober");
        assert_ne!(prober, slower, "equal names, different flags");
    }

    #[test]
    fn each_kind_belongs_to_at_most_one_row_and_an_unknown_kind_to_none() {
        let mut seen = std::collections::BTreeSet::new();
        for kind in MODULES.iter().flat_map(|m| m.kinds) {
            assert!(seen.insert(*kind), "{kind} is listed by two rows");
        }
        assert_eq!(module_of_kind("VolumeAttachment"), Some("attacher"));
        assert_eq!(module_of_kind("PersistentVolumeClaim"), Some("provisioner"));
        assert_eq!(module_of_kind("Pod"), None, "not the provisioner's by default");
    }

    /// A row whose name, binary name, KEP-4958 name or kind is another
    /// row's is refused, naming both (it is not added).
    #[test]
    fn an_added_row_may_not_take_another_rows_name_or_kind() {
        static ATTACHER_AGAIN: ModuleDesc = ModuleDesc { binary_names: &[], ..MODULES[1] };
        static TAKES_A_BINARY: ModuleDesc =
            ModuleDesc { name: "x1", binary_names: &["csi-resizer"], kinds: &[], ..MODULES[1] };
        static TAKES_A_KEP_NAME: ModuleDesc =
            ModuleDesc { name: "x2", binary_names: &["node-driver-registrar"], kinds: &[], ..MODULES[1] };
        static TAKES_A_KIND: ModuleDesc = ModuleDesc { name: "x3", binary_names: &[], ..MODULES[1] };
        let refused = |row, what, taken, by| Err(RowClash { row, what, taken, by });
        assert_eq!(add_row(&ATTACHER_AGAIN), refused("attacher", "name", "attacher", "attacher"));
        assert_eq!(add_row(&TAKES_A_BINARY), refused("x1", "name", "csi-resizer", "resizer"));
        assert_eq!(add_row(&TAKES_A_KEP_NAME), refused("x2", "name", "node-driver-registrar", "registrar"));
        assert_eq!(add_row(&TAKES_A_KIND), refused("x3", "kind", "VolumeAttachment", "attacher"));
        assert_eq!(rows().len(), MODULES.len(), "none was added");
        let text = add_row(&TAKES_A_KIND).err().map(|e| e.to_string());
        assert_eq!(text.as_deref(), Some("module x3: kind \"VolumeAttachment\" is already module attacher's"));
    }
}
