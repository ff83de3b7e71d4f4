//! `widgets`: a module this test adds through its folder (this file) and
//! its row alone, to show that is all a module needs. A controller on the
//! kit: it marks each ConfigMap labelled with its driver's name
//! (`widgets.example.com/driver`) with `widgets.example.com/seen-by`, and
//! leaves one labelled `widgets.example.com/hold` waiting.

use std::{sync::Arc, time::Duration};

use argh::{ArgsInfo, FromArgs};
use csi_sidecar::{
    debug::WaitingFor,
    k8s::key::ObjectKey,
    modules::{
        ChartRow, Module, ModuleContext, ModuleDesc, ModuleError, Needs, Pods, Rule,
        kit::{Done, Kit, Reconciled, Wait},
        parse_flags,
    },
};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};

/// The label that selects a ConfigMap for a driver.
pub const DRIVER_LABEL: &str = "widgets.example.com/driver";
/// The annotation the module writes.
pub const SEEN_BY: &str = "widgets.example.com/seen-by";
/// The label that holds a ConfigMap back.
pub const HOLD: &str = "widgets.example.com/hold";

/// Marks widgets.
#[derive(FromArgs, ArgsInfo, Clone, Debug, PartialEq)]
pub struct WidgetFlags {
    /// widget workers (default 2)
    #[argh(option, default = "2")]
    pub workers: usize,
    /// a shared flag the module accepts
    #[argh(option, default = "Duration::from_secs(10)", from_str_fn(seconds))]
    pub timeout: Duration,
}

fn seconds(s: &str) -> Result<Duration, String> {
    s.trim_end_matches('s').parse().map(Duration::from_secs).map_err(|e| format!("{e}"))
}

/// The module's row: everything the host, the command line, `explain`, the
/// chart and the RBAC know of it.
pub static ROW: ModuleDesc = ModuleDesc {
    name: "widgets",
    binary_names: &["csi-widgets"],
    replaces: "nothing (a test's module)",
    summary: "marks ConfigMaps labelled for the driver",
    info: WidgetFlags::get_args_info,
    parse: parse_flags::<WidgetFlags>,
    shared: &[csi_sidecar::flags::shared::CONTROLLER],
    feature_gates: &[],
    kep_names: &["widget-marker"],
    needs: Needs {
        kube: true,
        kubeconfig_env: false,
        default_health_port: false,
        registration_dir: false,
        listener: false,
    },
    kinds: &["ConfigMap"],
    cluster_rules: &[
        Rule::new(&[""], &["configmaps"], &["list", "watch", "patch"]),
        Rule::new(&[""], &["events"], &["create", "patch"]),
    ],
    chart: ChartRow {
        values_key: "widgets",
        pods: Pods { controller: true, node: false },
        container: "csi-widgets",
        port_name: "widgets",
        port: 8099,
        value_rules: &[],
    },
    tool: None,
};

impl Module for WidgetFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        match self.workers {
            0 => Err(ModuleError::Config { module: ROW.name, message: "--workers must be at least 1".into() }),
            _ => Ok(()),
        }
    }

    fn discovery_timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        Box::pin(run(self.clone(), ctx))
    }
}

struct Marker {
    driver: String,
    client: kube::Client,
    cache: csi_sidecar::k8s::cache::Cache<ConfigMap>,
}

async fn run(flags: WidgetFlags, ctx: ModuleContext) -> Result<(), ModuleError> {
    let kit = Kit::new(ROW.name, ctx)?;
    let Some(driver) = kit.driver().await else { return Ok(()) };
    let name = driver.name.to_string();
    let wanted = name.clone();
    let informer = kit.kube.informers.view::<ConfigMap>("widgets", move |cm| {
        cm.metadata.labels.as_ref().and_then(|l| l.get(DRIVER_LABEL)) == Some(&wanted)
    });
    let queue = kit.queue::<ConfigMap>("widgets");
    {
        let queue = queue.clone();
        informer.on_change(&kit.ctx.shutdown, move |c| {
            if !c.is_deleted() {
                queue.add(ObjectKey::of(&c.object().metadata));
            }
        });
    }
    kit.kube.informers.start(&kit.ctx.process);
    let marker = Arc::new(Marker { driver: name.clone(), client: kit.kube.client.clone(), cache: informer.store() });
    kit.lead(&format!("widgets-{}", name.replace('.', "-")), move |mut crew| async move {
        if !crew.synced("marking widgets", informer.synced()).await {
            return;
        }
        crew.serve(&queue, flags.workers, &marker, |m, key| async move { m.reconcile(key).await });
        crew.run().await;
    })
    .await
}

impl Marker {
    async fn reconcile(&self, key: ObjectKey<ConfigMap>) -> Reconciled {
        let Some(cm) = self.cache.get_named(key.namespace(), key.name()) else { return Ok(Done::Finished) };
        if cm.metadata.labels.as_ref().is_some_and(|l| l.contains_key(HOLD)) {
            return Err(Wait::failed(WaitingFor::ApiServer, "held by its label").after(Duration::from_secs(1)));
        }
        if cm.metadata.annotations.as_ref().and_then(|a| a.get(SEEN_BY)) == Some(&self.driver) {
            return Ok(Done::Finished);
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), key.namespace().unwrap_or_default());
        let patch = serde_json::json!({"metadata": {"annotations": {SEEN_BY: self.driver}}});
        match api.patch(key.name(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(Done::Finished),
            Err(e) => Err(Wait::failed(WaitingFor::ApiServer, e.to_string())),
        }
    }
}

mod test {
    use std::collections::BTreeMap;

    use csi_sidecar_integration::{
        cluster::{ControlPlane, Identity},
        failover::fast_leader_election,
        fault_driver::{FaultDriver, FaultEnv, Transport},
        free_port,
        http::get,
        kube_support::create,
        wait_until,
    };
    use k8s_openapi::api::{
        coordination::v1::Lease,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    };
    use kube::api::{DeleteParams, ObjectMeta};
    use serde_json::{Value, json};

    use super::*;

    /// The chart's entry of every controller row ([`csi_sidecar::chart::render`]
    /// of every row, read back as YAML), by name.
    fn chart_entries() -> BTreeMap<String, Value> {
        let text = csi_sidecar::chart::render(&csi_sidecar::modules::rows());
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), text).expect("write");
        let doc = csi_sidecar_integration::yaml::documents(file.path()).remove(0);
        let list = doc["controller"].as_array().cloned().unwrap_or_default();
        list.into_iter().map(|e| (e["name"].as_str().unwrap_or_default().to_string(), e)).collect()
    }

    /// A ClusterRole of an entry's rules (its Secrets rule too) and its
    /// binding to `user`, named after `prefix`.
    async fn grant(client: &kube::Client, prefix: &str, entry: &Value, user: &str) -> Vec<String> {
        let name = format!("{prefix}-{}", entry["name"].as_str().unwrap_or_default());
        let rules: Vec<Value> = entry["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| json!({"apiGroups": r["apiGroups"], "resources": r["resources"], "verbs": r["verbs"]}))
            .collect();
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).expect("role");
        create(&Api::all(client.clone()), &role).await;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": name, "apiGroup": "rbac.authorization.k8s.io"}}))
        .expect("binding");
        create(&Api::all(client.clone()), &binding).await;
        vec![name]
    }

    /// A module added through its folder (widgets.rs) and its row alone runs
    /// in one process with the provisioner, parsed from a command line with
    /// its own flags, under exactly the RBAC its row renders into the chart:
    /// it leads its own Lease, marks its ConfigMaps, and files the one it
    /// holds back in `/debug/objects` under the kind its row names, while a
    /// claim is provisioned beside it. The process then stops cleanly.
    #[tokio::test]
    async fn a_module_added_by_its_row_alone_runs_beside_the_provisioner() {
        csi_sidecar::modules::add_row(&ROW).expect("a row of its own");
        assert_eq!(csi_sidecar::modules::module_of_kind("ConfigMap"), Some("widgets"), "explain asks the row");
        let entries = chart_entries();
        let entry = &entries["widgets"];
        assert_eq!((entry["values"].as_str(), entry["container"].as_str()), (Some("widgets"), Some("csi-widgets")));
        assert_eq!(entry["leader"], Value::Bool(true));

        let env = FaultEnv::new("byrow").await;
        let admin = env.ns.client().clone();
        let user = format!("{}-sidecar", env.ns.name());
        let mut roles = grant(&admin, env.ns.name(), &entries["provisioner"], &user).await;
        roles.extend(grant(&admin, env.ns.name(), entry, &user).await);
        let lease_rules = json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update"]}]);
        let meta = |n: &str| ObjectMeta { name: Some(n.into()), ..Default::default() };
        let role: Role =
            serde_json::from_value(json!({"metadata": meta("leader-election"), "rules": lease_rules})).expect("role");
        create(&env.ns.api::<Role>(), &role).await;
        let binding: RoleBinding = serde_json::from_value(json!({"metadata": meta("leader-election"),
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "Role", "name": "leader-election", "apiGroup": "rbac.authorization.k8s.io"}}))
        .expect("binding");
        create(&env.ns.api::<RoleBinding>(), &binding).await;
        let kubeconfig = ControlPlane::shared().mint(&Identity::user(&user, &[]));

        let _driver = FaultDriver::start(&env.socket(), Transport::Grpc, env.script());
        let addr = format!("127.0.0.1:{}", free_port());
        let mut argv: Vec<String> = vec![
            "csi-sidecar".into(),
            format!("--csi-address={}", env.socket().display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--http-endpoint={addr}"),
            "--enable-debug-endpoints".into(),
        ];
        argv.extend(fast_leader_election(env.ns.name()));
        argv.extend(["provisioner", "widgets", "--workers=3"].map(String::from));
        let inv = match csi_sidecar::cli::parse(&argv) {
            csi_sidecar::cli::Command::Run(inv) => *inv,
            csi_sidecar::cli::Command::Exit { code, text } => panic!("exit {code}: {text}"),
        };
        let names: Vec<&str> = inv.modules.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["provisioner", "widgets"]);
        assert_eq!(inv.modules[1].flags::<WidgetFlags>().map(|f| f.workers), Some(3), "its own flag");
        let stop = tokio_util::sync::CancellationToken::new();
        let host = tokio::spawn(csi_sidecar::host::run_until(inv, stop.clone()));

        let cms: Api<ConfigMap> = env.ns.api();
        let labelled = |name: &str, hold: bool| {
            let mut labels = BTreeMap::from([(DRIVER_LABEL.to_string(), env.driver_name.clone())]);
            if hold {
                labels.insert(HOLD.into(), "yes".into());
            }
            ConfigMap {
                metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..meta(name) },
                ..Default::default()
            }
        };
        create(&cms, &labelled("marked", false)).await;
        create(&cms, &labelled("held", true)).await;
        let sc = env.storage_class("sc", |_| {}).await;
        env.bound_claim("claim", &sc, Duration::from_secs(60)).await;
        wait_until("the widget marked", Duration::from_secs(60), async || {
            let cm = cms.get("marked").await.ok();
            let seen = cm.and_then(|c| c.metadata.annotations).and_then(|a| a.get(SEEN_BY).cloned());
            (seen.as_deref() == Some(env.driver_name.as_str()), seen)
        })
        .await;
        let query = format!("/debug/objects?kind=ConfigMap&namespace={}", env.ns.name());
        // The held one is filed under the module's kind; the marked one,
        // finished, leaves the ledger (a resync of it may be in flight at
        // first: the wait is for both).
        wait_until("the held widget filed, the marked one gone", Duration::from_secs(30), async || {
            let body = get(&addr, &query).await.map(|r| r.body).unwrap_or_default();
            let page: Value = serde_json::from_str(&body).unwrap_or_default();
            let objects = page["objects"].as_array().cloned().unwrap_or_default();
            let named = |n: &str| objects.iter().find(|o| o["name"] == n).cloned();
            let held = named("held").is_some_and(|o| {
                (o["module"].as_str(), o["kind"].as_str(), o["last_error"].as_str())
                    == (Some("widgets"), Some("ConfigMap"), Some("held by its label"))
            });
            (held && named("marked").is_none(), body)
        })
        .await;
        let lease = format!("widgets-{}", env.driver_name.replace('.', "-"));
        let holder = env.ns.api::<Lease>().get(&lease).await.ok().and_then(|l| l.spec?.holder_identity);
        assert!(holder.is_some_and(|h| !h.is_empty()), "the module leads its own Lease {lease}");
        assert!(cms.get("held").await.ok().and_then(|c| c.metadata.annotations).is_none(), "held back");

        stop.cancel();
        let code = host.await.expect("host");
        assert_eq!(format!("{code:?}"), format!("{:?}", std::process::ExitCode::SUCCESS));
        for name in roles {
            let _ = Api::<ClusterRoleBinding>::all(admin.clone()).delete(&name, &DeleteParams::default()).await;
            let _ = Api::<ClusterRole>::all(admin.clone()).delete(&name, &DeleteParams::default()).await;
        }
    }
}
