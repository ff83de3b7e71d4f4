//! The contract between the host and a module: what a module is
//! ([`Module`]), what it gets from the host ([`ModuleContext`]) and how it
//! stops ([`ModuleError`]). Modules import this, never the module table
//! (`modules/mod.rs`), which imports them.

use std::{any::Any, fmt, time::Duration};

use argh::FromArgs;
use futures::future::BoxFuture;

/// A module: its parsed flags, which know how to check and run it. Each
/// module's flags struct implements this in the module's own folder.
pub trait Module: fmt::Debug + Send + Sync + Any + DynEq {
    /// Checks that need no I/O, run before anything starts. Upstream exits
    /// with status 1 for these.
    fn validate(&self) -> Result<(), ModuleError>;

    /// A module that asks the process to exit at once with this status,
    /// before anything starts (registrar `--mode=kubelet-registration-probe`).
    fn early_exit(&self) -> Option<u8> {
        None
    }

    /// The per-call timeout this module wants for driver discovery.
    fn discovery_timeout(&self) -> Duration;

    /// `--master`, where the module has it.
    fn master(&self) -> Option<&str> {
        None
    }

    /// Where the host binds the module's listener (`host:port`, or `:port`
    /// for every interface), when its row needs one.
    fn listen_address(&self) -> Option<String> {
        None
    }

    /// Runs one instance of the module until shutdown (or until it stops
    /// with an error: the host then starts a new instance, with a fresh
    /// context scope).
    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>>;
}

/// One rule of a module's ClusterRole: every verb on every resource of
/// every API group listed (RBAC's own shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""`: the core group).
    pub groups: &'static [&'static str],
    /// Resources, subresources as `resource/sub`.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
}

impl Rule {
    /// A rule of `verbs` on `resources` of `groups`.
    pub const fn new(
        groups: &'static [&'static str],
        resources: &'static [&'static str],
        verbs: &'static [&'static str],
    ) -> Rule {
        Rule { groups, resources, verbs }
    }

    /// Every (API group, resource, verb) the rule grants.
    pub fn triples(&self) -> impl Iterator<Item = (&'static str, &'static str, &'static str)> + '_ {
        self.groups
            .iter()
            .flat_map(move |g| self.resources.iter().flat_map(move |r| self.verbs.iter().map(move |v| (*g, *r, *v))))
    }
}

/// What the chart needs to know about a module besides its name, RBAC and
/// needs (which the row already says).
#[derive(Clone, Copy, Debug)]
pub struct ChartRow {
    /// The key of its block under `controller.modules` and `node.modules`
    /// in values.yaml (`enabled`, `port`, `args`).
    pub values_key: &'static str,
    /// The pods that can run it.
    pub pods: Pods,
    /// Its container's name in the drop-in layout (the name upstream's
    /// manifests give the sidecar).
    pub container: &'static str,
    /// The name of its HTTP port in the drop-in layout.
    pub port_name: &'static str,
    /// Its own port in the drop-in layout (values.yaml's default).
    pub port: u16,
    /// Rules granted besides the row's `cluster_rules` only while the
    /// module's chart value of this name is true (a feature the user opts
    /// into, whose RBAC the static manifests leave out).
    pub value_rules: &'static [(&'static str, Rule)],
}

/// The pods of the chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pods {
    /// The controller Deployment.
    pub controller: bool,
    /// The node DaemonSet.
    pub node: bool,
}

impl Pods {
    /// Whether the pod named `pod` ("controller" or "node") runs it.
    pub fn runs_in(self, pod: &str) -> bool {
        match pod {
            "controller" => self.controller,
            "node" => self.node,
            _ => false,
        }
    }
}

/// Equality of two modules' flags behind `dyn Module`; every flags struct
/// with `PartialEq` has it.
pub trait DynEq {
    /// Whether `other` is the same flags type with equal values.
    fn dyn_eq(&self, other: &dyn Any) -> bool;
}

impl<T: PartialEq + Any> DynEq for T {
    fn dyn_eq(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
}

/// Parses a module's normalised arguments (command name, arguments) into its flags.
pub type ParseFlags = fn(&str, &[&str]) -> Result<Box<dyn Module>, argh::EarlyExit>;

/// [`ModuleDesc::parse`] for a flags struct `T`.
pub fn parse_flags<T: FromArgs + Module>(command: &str, args: &[&str]) -> Result<Box<dyn Module>, argh::EarlyExit> {
    T::from_args(&[command], args).map(|flags| Box::new(flags) as Box<dyn Module>)
}

/// What a module gets from the host: the shared services, never its own.
#[derive(Clone)]
pub struct ModuleContext {
    /// The one driver connection.
    pub csi: crate::csi::Connection,
    /// The one health registry (served by the one HTTP server).
    pub health: crate::http::HealthRegistry,
    /// This module instance's scope: cancelled on the process's shutdown
    /// and when the host stops the instance to restart it. Everything the
    /// module starts (handlers, workers, its Lease) ends with it.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The process's shutdown: only for the shared services a module may be
    /// the first to start (the informers' watches, the shared Lease), which
    /// outlive any one module instance.
    pub process: tokio_util::sync::CancellationToken,
    /// How long work may drain once cancelled (the host's shutdown grace:
    /// the longest CSI `--timeout` plus the final writes), on shutdown and
    /// on a lost Lease alike.
    pub grace: std::time::Duration,
    /// The Kubernetes client and informer cache, when a module needs them.
    pub kube: Option<crate::k8s::KubeContext>,
    /// The modules' ledgers of objects not done (`/debug/objects`).
    pub debug: crate::debug::Registry,
    /// The module's listener, when its row needs one (bound once by the
    /// host; each instance serves on a clone of it).
    pub listener: Option<std::sync::Arc<std::net::TcpListener>>,
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
    /// A failure the module cannot recover from by itself (the host
    /// restarts it, with backoff).
    #[error("{module}: {message}")]
    Fatal {
        /// The module.
        module: &'static str,
        /// What happened.
        message: String,
    },
    /// The module lost its Lease (its work has drained): the host starts it
    /// again at once, to campaign from standby.
    #[error("{module}: {message}")]
    LostLease {
        /// The module.
        module: &'static str,
        /// Why the Lease was lost.
        message: String,
    },
}
