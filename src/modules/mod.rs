//! The modules, one per upstream sidecar, and the static table that names
//! them. argv[0] and the subcommand both resolve through [`MODULES`].

pub mod attacher;
pub mod led;
pub mod prober;
pub mod provisioner;
pub mod registrar;
pub mod resizer;
pub mod snapshotter;
pub mod views;

use argh::{ArgsInfo, FromArgs};

/// A parsed module configuration, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub enum ModuleConfig {
    /// livenessprobe.
    Prober(prober::config::ProberFlags),
    /// node-driver-registrar.
    Registrar(registrar::config::RegistrarFlags),
    /// external-provisioner.
    Provisioner(Box<provisioner::config::ProvisionerFlags>),
    /// external-attacher.
    Attacher(Box<attacher::config::AttacherFlags>),
    /// external-resizer.
    Resizer(Box<resizer::config::ResizerFlags>),
    /// csi-snapshotter.
    Snapshotter(Box<snapshotter::config::SnapshotterFlags>),
}

/// How a module's own flags are parsed.
pub struct FlagSpec {
    /// argh's description of the module's own flags.
    pub info: fn() -> argh::CommandInfoWithArgs,
    /// Parses normalised arguments into the module's configuration.
    pub parse: fn(&str, &[&str]) -> Result<ModuleConfig, argh::EarlyExit>,
    /// The shared flags (besides logging) upstream accepts for this sidecar.
    /// Groups of shared flag names (see `flags::shared::CONTROLLER`).
    pub shared: &'static [&'static [&'static str]],
}

/// One row of the module table.
pub struct ModuleDesc {
    /// Subcommand name.
    pub name: &'static str,
    /// Upstream binary names (argv[0] basenames) that select this module.
    pub binary_names: &'static [&'static str],
    /// The upstream sidecar this module replaces.
    pub replaces: &'static str,
    /// One line for `--list`.
    pub summary: &'static str,
    /// `None` while the module is not built yet.
    pub flags: Option<FlagSpec>,
}

/// Every module, built or planned.
pub static MODULES: &[ModuleDesc] = &[
    ModuleDesc {
        name: "provisioner",
        binary_names: &["csi-provisioner"],
        replaces: "external-provisioner",
        summary: "dynamic provisioning and deletion of volumes",
        flags: Some(FlagSpec {
            info: provisioner::config::ProvisionerFlags::get_args_info,
            parse: |cmd, args| {
                provisioner::config::ProvisionerFlags::from_args(&[cmd], args)
                    .map(|f| ModuleConfig::Provisioner(Box::new(f)))
            },
            shared: provisioner::config::SHARED_FLAGS,
        }),
    },
    ModuleDesc {
        name: "attacher",
        binary_names: &["csi-attacher"],
        replaces: "external-attacher",
        summary: "ControllerPublish/Unpublish for VolumeAttachments",
        flags: Some(FlagSpec {
            info: attacher::config::AttacherFlags::get_args_info,
            parse: |cmd, args| {
                attacher::config::AttacherFlags::from_args(&[cmd], args).map(|f| ModuleConfig::Attacher(Box::new(f)))
            },
            shared: attacher::config::SHARED_FLAGS,
        }),
    },
    ModuleDesc {
        name: "registrar",
        binary_names: &["csi-node-driver-registrar", "node-driver-registrar"],
        replaces: "node-driver-registrar",
        summary: "registers the driver with the kubelet's plugin manager",
        flags: Some(FlagSpec {
            info: registrar::config::RegistrarFlags::get_args_info,
            parse: |cmd, args| registrar::config::RegistrarFlags::from_args(&[cmd], args).map(ModuleConfig::Registrar),
            shared: registrar::config::SHARED_FLAGS,
        }),
    },
    ModuleDesc {
        name: "prober",
        binary_names: &["livenessprobe"],
        replaces: "livenessprobe",
        summary: "answers /healthz from the driver's Probe",
        flags: Some(FlagSpec {
            info: prober::config::ProberFlags::get_args_info,
            parse: |cmd, args| prober::config::ProberFlags::from_args(&[cmd], args).map(ModuleConfig::Prober),
            shared: prober::config::SHARED_FLAGS,
        }),
    },
    ModuleDesc {
        name: "resizer",
        binary_names: &["csi-resizer"],
        replaces: "external-resizer",
        summary: "volume expansion and VolumeAttributesClass changes",
        flags: Some(FlagSpec {
            info: resizer::config::ResizerFlags::get_args_info,
            parse: |cmd, args| {
                resizer::config::ResizerFlags::from_args(&[cmd], args).map(|f| ModuleConfig::Resizer(Box::new(f)))
            },
            shared: resizer::config::SHARED_FLAGS,
        }),
    },
    ModuleDesc {
        name: "snapshotter",
        binary_names: &["csi-snapshotter"],
        replaces: "csi-snapshotter",
        summary: "CreateSnapshot/DeleteSnapshot/ListSnapshots for VolumeSnapshotContents",
        flags: Some(FlagSpec {
            info: snapshotter::config::SnapshotterFlags::get_args_info,
            parse: |cmd, args| {
                snapshotter::config::SnapshotterFlags::from_args(&[cmd], args)
                    .map(|f| ModuleConfig::Snapshotter(Box::new(f)))
            },
            shared: snapshotter::config::SHARED_FLAGS,
        }),
    },
];

/// The module a name selects: its subcommand name or an upstream binary name.
pub fn lookup(name: &str) -> Option<&'static ModuleDesc> {
    MODULES.iter().find(|m| m.name == name || m.binary_names.contains(&name))
}

impl ModuleConfig {
    /// The module's table name.
    pub fn name(&self) -> &'static str {
        match self {
            ModuleConfig::Prober(_) => "prober",
            ModuleConfig::Registrar(_) => "registrar",
            ModuleConfig::Provisioner(_) => "provisioner",
            ModuleConfig::Attacher(_) => "attacher",
            ModuleConfig::Resizer(_) => "resizer",
            ModuleConfig::Snapshotter(_) => "snapshotter",
        }
    }
}

/// What a module gets from the host: the shared services, never its own.
#[derive(Clone)]
pub struct ModuleContext {
    /// The one driver connection.
    pub csi: crate::csi::Connection,
    /// The one health registry (served by the one HTTP server).
    pub health: crate::http::HealthRegistry,
    /// The process shutdown token.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The Kubernetes client and informer cache, when a module needs them.
    pub kube: Option<crate::kube::KubeContext>,
}

/// Why a module stopped before shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The configuration cannot work (exit status 1, like upstream).
    #[error("{module}: {message}")]
    Config {
        /// The module.
        module: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A failure the module cannot recover from.
    #[error("{module}: {message}")]
    Fatal {
        /// The module.
        module: &'static str,
        /// What happened.
        message: String,
    },
}

impl ModuleConfig {
    /// Checks that need no I/O, run before anything starts. Upstream exits
    /// with status 1 for these.
    pub fn validate(&self) -> Result<(), ModuleError> {
        match self {
            ModuleConfig::Prober(_) => Ok(()),
            ModuleConfig::Registrar(r) => registrar::validate(r),
            ModuleConfig::Provisioner(p) => {
                p.validate().map(|_| ()).map_err(|message| ModuleError::Config { module: "provisioner", message })
            }
            ModuleConfig::Attacher(a) => {
                a.validate().map_err(|message| ModuleError::Config { module: "attacher", message })
            }
            ModuleConfig::Resizer(r) => {
                r.validate().map(|_| ()).map_err(|message| ModuleError::Config { module: "resizer", message })
            }
            ModuleConfig::Snapshotter(s) => {
                s.validate().map(|_| ()).map_err(|message| ModuleError::Config { module: "snapshotter", message })
            }
        }
    }

    /// A module that asks the process to exit at once with this status,
    /// before anything starts (registrar `--mode=kubelet-registration-probe`).
    pub fn early_exit(&self) -> Option<u8> {
        match self {
            ModuleConfig::Registrar(r) => registrar::early_exit(r),
            ModuleConfig::Prober(_)
            | ModuleConfig::Provisioner(_)
            | ModuleConfig::Attacher(_)
            | ModuleConfig::Resizer(_)
            | ModuleConfig::Snapshotter(_) => None,
        }
    }

    /// The per-call timeout this module wants for driver discovery.
    pub fn discovery_timeout(&self) -> std::time::Duration {
        match self {
            ModuleConfig::Prober(p) => p.probe_timeout,
            ModuleConfig::Registrar(r) => r.timeout,
            ModuleConfig::Provisioner(p) => p.timeout,
            ModuleConfig::Attacher(a) => a.timeout,
            ModuleConfig::Resizer(r) => r.timeout,
            ModuleConfig::Snapshotter(s) => s.timeout,
        }
    }

    /// Whether the module needs the Kubernetes client and informer cache.
    pub fn needs_kube(&self) -> bool {
        matches!(
            self,
            ModuleConfig::Provisioner(_)
                | ModuleConfig::Attacher(_)
                | ModuleConfig::Resizer(_)
                | ModuleConfig::Snapshotter(_)
        )
    }

    /// `--master`, where the module has it.
    pub fn master(&self) -> Option<&str> {
        match self {
            ModuleConfig::Provisioner(p) => p.master.as_deref(),
            ModuleConfig::Resizer(r) => r.master.as_deref(),
            _ => None,
        }
    }

    /// Runs the module until shutdown.
    pub async fn run(self, ctx: ModuleContext) -> Result<(), ModuleError> {
        match self {
            ModuleConfig::Prober(c) => prober::run(c, ctx).await,
            ModuleConfig::Registrar(c) => registrar::run(c, ctx).await,
            ModuleConfig::Provisioner(c) => provisioner::run(*c, ctx).await,
            ModuleConfig::Attacher(c) => attacher::run(*c, ctx).await,
            ModuleConfig::Resizer(c) => resizer::run(*c, ctx).await,
            ModuleConfig::Snapshotter(c) => snapshotter::run(*c, ctx).await,
        }
    }
}
