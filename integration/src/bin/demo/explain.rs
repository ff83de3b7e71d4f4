//! The demos' last step: `csi-sidecar explain` (the real binary, as a user
//! runs it) on a claim that is done and on one that is stuck, because its
//! StorageClass names a provisioner secret nobody created. Both answers are
//! printed as they come; the demo fails unless the done one exits 0 saying
//! it is bound and the stuck one exits 1 naming the missing secret.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use csi_sidecar_integration::{
    kube_support::{create, pvc, storage_class},
    sidecar_bin,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{Api, api::DeleteParams};

use super::until;

/// What the done claim's answer says.
const DONE: &str = "bound to PersistentVolume";
/// What the stuck claim's answer says once the provisioner has tried.
const MISSING_SECRET: &str = "a secret the class names is missing or cannot be read";
/// How long the provisioner may take to try the stuck claim.
const STUCK_WITHIN: Duration = Duration::from_secs(60);

/// Where `explain` reads: the cluster and csi-sidecar's HTTP endpoint.
pub struct Target<'a> {
    pub kubeconfig: &'a Path,
    pub endpoint: &'a str,
}

impl Target<'_> {
    fn command_line(&self, ns: &str, name: &str) -> String {
        format!(
            "csi-sidecar explain pvc {ns}/{name} --endpoint {} --kubeconfig {}",
            self.endpoint,
            self.kubeconfig.display()
        )
    }

    /// One run of the binary: its exit status, and its stdout then stderr.
    async fn run(&self, ns: &str, name: &str) -> anyhow::Result<(i32, String)> {
        let run = tokio::process::Command::new(sidecar_bin())
            .args(["explain", "pvc", &format!("{ns}/{name}"), "--endpoint", self.endpoint, "--kubeconfig"])
            .arg(self.kubeconfig)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .context("csi-sidecar explain did not finish within 30 s")?
            .context("running csi-sidecar explain")?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok((out.status.code().unwrap_or(-1), text))
    }

    fn show(&self, ns: &str, name: &str, code: i32, text: &str) {
        println!("$ {}", self.command_line(ns, name));
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
        println!("(exit status {code})");
    }
}

/// A StorageClass of `driver` (Immediate: tried at once) whose provisioner
/// secret `missing-secret` in `ns` does not exist, and the claim `claim`
/// of it; returns when the claim was created.
pub async fn stuck_claim(client: &kube::Client, ns: &str, class: &str, driver: &str, claim: &str) -> Instant {
    let mut sc = storage_class(class, driver);
    sc.parameters = Some(
        [
            ("csi.storage.k8s.io/provisioner-secret-name", "missing-secret"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", ns),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    create(&Api::<StorageClass>::all(client.clone()), &sc).await;
    create(&Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns), &pvc(claim, Some(class), "1Gi")).await;
    let created = Instant::now();
    println!(
        "StorageClass {class}: provisioner-secret-name missing-secret (in {ns}, never created); claim {ns}/{claim} of it"
    );
    created
}

/// Explains `done` (once: it is bound) and `stuck`, created at `created`
/// (until the answer names the missing secret, within [`STUCK_WITHIN`]),
/// printing both answers.
pub async fn check(t: &Target<'_>, ns: &str, done: &str, stuck: &str, created: Instant) -> anyhow::Result<()> {
    let (code, text) = t.run(ns, done).await?;
    t.show(ns, done, code, &text);
    if code != 0 || !text.contains(DONE) {
        bail!("explain on the bound claim {ns}/{done}: want exit status 0 and {DONE:?}");
    }
    println!();
    let mut tries = 0;
    let (code, text) = loop {
        let (code, text) = t.run(ns, stuck).await?;
        tries += 1;
        if (code == 1 && text.contains(MISSING_SECRET)) || created.elapsed() > STUCK_WITHIN {
            break (code, text);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    t.show(ns, stuck, code, &text);
    if code != 1 || !text.contains(MISSING_SECRET) {
        bail!(
            "explain on the stuck claim {ns}/{stuck} after {STUCK_WITHIN:?}: want exit status 1 and {MISSING_SECRET:?}"
        );
    }
    let runs = if tries == 1 { "the first run".to_string() } else { format!("run {tries}") };
    println!("(this answer {} ms after the claim was created: {runs} of explain)", created.elapsed().as_millis());
    Ok(())
}

/// Deletes the two claims and the stuck class; waits for the done claim's
/// PV to be deleted (DeleteVolume).
pub async fn clean_up(client: &kube::Client, ns: &str, done: &str, stuck: &str, class: &str) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pv = claims.get(done).await?.spec.and_then(|s| s.volume_name).unwrap_or_default();
    for c in [done, stuck] {
        claims.delete(c, &DeleteParams::default()).await?;
    }
    Api::<StorageClass>::all(client.clone()).delete(class, &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    until("the PV deleted", Duration::from_secs(120), async || pvs.get_opt(&pv).await.ok().filter(Option::is_none))
        .await?;
    println!("claims {done} and {stuck}, PV {pv} and StorageClass {class} deleted");
    Ok(())
}
