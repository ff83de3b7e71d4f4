//! [`FaultEnv`], a fault-driver test's setup around the driver.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::{FaultDriver, Script, Transport};

/// What a fault-driver test needs around the driver: a namespace on the
/// shared control plane, a fresh driver name and a directory for the sockets
/// and logs.
pub struct FaultEnv {
    /// Sockets and logs.
    pub dir: tempfile::TempDir,
    /// `<unique>.fault.example.com`.
    pub driver_name: String,
    /// The test's namespace (deleted on drop).
    pub ns: crate::kube_support::TestNamespace,
    /// The admin kubeconfig of the control plane the sidecars talk to.
    pub kubeconfig: PathBuf,
}

impl FaultEnv {
    /// A namespace and a driver name, both from `prefix`, on the caller's
    /// test module's shared control plane.
    #[track_caller]
    pub fn new(prefix: &str) -> impl Future<Output = FaultEnv> + '_ {
        Self::on(crate::cluster::ControlPlane::shared(), prefix)
    }

    /// Like [`FaultEnv::new`], on the control plane `cp` (e.g. a dedicated one
    /// a test restarts components of).
    pub async fn on(cp: &crate::cluster::ControlPlane, prefix: &str) -> FaultEnv {
        let ns = crate::kube_support::TestNamespace::new(&cp.client().await, prefix).await;
        let driver_name = format!("{}.fault.example.com", crate::kube_support::unique_name(prefix));
        FaultEnv { dir: tempfile::tempdir().expect("tempdir"), driver_name, ns, kubeconfig: cp.kubeconfig().into() }
    }

    /// The driver's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    /// A script for this driver name with the controller service.
    pub fn script(&self) -> Script {
        Script { name: self.driver_name.clone(), controller: true, ..Script::default() }
    }

    /// Starts csi-sidecar (`program`: the binary or an upstream-named
    /// symlink) on the driver's socket and the env's control plane, with
    /// `args` after those two flags.
    pub fn sidecar(&self, name: &str, program: &Path, args: &[&str]) -> crate::process::Proc {
        self.sidecar_env(name, program, args, &[])
    }

    /// Like [`FaultEnv::sidecar`], with environment variables.
    pub fn sidecar_env(&self, name: &str, program: &Path, args: &[&str], env: &[(&str, &str)]) -> crate::process::Proc {
        let mut all = vec![
            format!("--csi-address={}", self.socket().display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, Some(*v))).collect();
        crate::process::Proc::spawn_env(name, program, &all, &env, self.dir.path())
    }

    /// Starts the driver (gRPC, `script`) and csi-sidecar running the
    /// provisioner and `module` at `-v=5` with retries from 200 ms to 2 s,
    /// `args` after those.
    pub fn start_with_provisioner(
        &self,
        module: &str,
        script: Script,
        args: &[&str],
    ) -> (FaultDriver, crate::process::Proc) {
        let driver = FaultDriver::start(&self.socket(), Transport::Grpc, script);
        let mut all = vec!["-v=5", "provisioner", module, "--retry-interval-start=200ms", "--retry-interval-max=2s"];
        all.extend(args);
        (driver, self.sidecar("csi-sidecar", &crate::sidecar_bin(), &all))
    }

    /// Creates a StorageClass of the driver named `name` scoped to the
    /// namespace (after `edit`); its name.
    pub async fn storage_class(
        &self,
        name: &str,
        edit: impl FnOnce(&mut k8s_openapi::api::storage::v1::StorageClass),
    ) -> String {
        let mut sc = crate::kube_support::storage_class(&self.ns.scoped(name), &self.driver_name);
        edit(&mut sc);
        crate::kube_support::create(&kube::Api::all(self.ns.client().clone()), &sc).await;
        sc.metadata.name.unwrap_or_default()
    }

    /// Creates the 1Mi claims `names` of class `sc`, all at once.
    pub async fn create_claims(&self, names: &[String], sc: &str) {
        let pvcs: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = self.ns.api();
        futures::future::join_all(names.iter().map(|n| {
            let (pvcs, claim) = (pvcs.clone(), crate::kube_support::pvc(n, Some(sc), "1Mi"));
            async move { crate::kube_support::create(&pvcs, &claim).await }
        }))
        .await;
    }

    /// Waits up to `timeout` (each) until every claim of `names` is Bound.
    pub async fn wait_bound(&self, names: &[String], timeout: Duration) {
        let pvcs: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = self.ns.api();
        for n in names {
            crate::kube_support::wait_for(&pvcs, n, timeout, |c| {
                c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            })
            .await;
        }
    }

    /// Creates the 1Mi claim `name` of class `sc` and waits up to `timeout`
    /// for it to be Bound; its PV's name.
    pub async fn bound_claim(&self, name: &str, sc: &str, timeout: Duration) -> String {
        let pvcs: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = self.ns.api();
        crate::kube_support::create(&pvcs, &crate::kube_support::pvc(name, Some(sc), "1Mi")).await;
        let c = crate::kube_support::wait_for(&pvcs, name, timeout, |c| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await;
        c.spec.and_then(|s| s.volume_name).expect("volumeName")
    }
}

/// Implements `Deref<Target = FaultEnv>` for a test's environment struct
/// that keeps its [`FaultEnv`] in the field `base`.
#[macro_export]
macro_rules! deref_fault_env {
    ($ty:ty) => {
        impl ::std::ops::Deref for $ty {
            type Target = $crate::fault_driver::FaultEnv;
            fn deref(&self) -> &$crate::fault_driver::FaultEnv {
                &self.base
            }
        }
    };
}
