//! `demo --real-node`: the chart installed with helm, as its README says, on
//! a real node (containerd and the kubelet): the pods Running, a workload
//! writing into its volume, the file read from the directory the kubelet
//! published on the node, everything undone again; then `csi-sidecar
//! explain` against the chart's debug endpoint, for a bound claim and for
//! one stuck on a missing secret.

use std::time::Duration;

use anyhow::{Context, bail};
use csi_sidecar_integration::{
    chart::{
        DRIVER, Helm, NAMESPACE, RELEASE, STORAGE_CLASS, install_args, pod_phase, pods_of, published_dir, volume_pod,
        wait_rollout, world_args,
    },
    cluster::ControlPlane,
    free_port,
    kube_support::{TestNamespace, create, pvc},
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount};
use kube::{Api, api::DeleteParams};

use super::{bound, explain, step, until};

pub async fn run(once: bool) -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("--real-node runs containerd and a kubelet: run the demo as root");
    }
    step(
        "starting a real control plane and a real node on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, \
         kube-scheduler, containerd with runc and a kubelet (1.36.3), images built here with umoci",
    );
    let cp = ControlPlane::with_real_node();
    let node = cp.info().real_node.clone().context("the launcher's real node")?;
    println!("node {} Ready; images {}; kubeconfig {}", node.name, node.images.join(" "), cp.kubeconfig().display());
    let client = cp.client().await;
    let helm = Helm::new(cp);

    step("helm install, the chart README's line (combined layout: one csi-sidecar container per pod)");
    let mut install = install_args(&node);
    install.extend(world_args(cp.info().ports.apiserver, "combined"));
    // The controller pod is on the node's network: its HTTP endpoint, with
    // /debug/objects on, is 127.0.0.1:<a port no other run here takes>.
    let http_port = free_port();
    install.extend(["--set".to_string(), format!("controller.httpPort={http_port},controller.debugEndpoints=true")]);
    println!("helm {}", install.join(" "));
    helm.run(&install);
    wait_rollout(&client, Duration::from_secs(180)).await;
    for component in ["controller", "node"] {
        for p in pods_of(&client, component).await {
            let statuses = p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
            let containers: Vec<String> =
                statuses.iter().map(|c| format!("{} ready={} restarts={}", c.name, c.ready, c.restart_count)).collect();
            println!(
                "{NAMESPACE}/{} {}: {}",
                p.metadata.name.unwrap_or_default(),
                pod_phase(&Pod { status: p.status.clone(), ..Default::default() }),
                containers.join(", ")
            );
        }
    }

    step("a pod with a new claim writes into its volume; the file is read on the node");
    let ns = TestNamespace::new(&client, "demo").await;
    let sa: Api<ServiceAccount> = ns.api();
    until("the namespace's ServiceAccount", Duration::from_secs(60), async || {
        sa.get_opt("default").await.ok().flatten()
    })
    .await?;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let pods: Api<Pod> = ns.api();
    create(&claims, &pvc("data", Some(STORAGE_CLASS), "1Gi")).await;
    let script = "echo hello from a pod > /data/hello && until [ -f /data/done ]; do sleep 0.2; done";
    create(&pods, &volume_pod("writer", "data", script)).await;
    let running = until("the pod Running", Duration::from_secs(120), async || {
        pods.get("writer").await.ok().filter(|p| pod_phase(p) == "Running")
    })
    .await?;
    let pv =
        until("the claim Bound", Duration::from_secs(10), async || claims.get("data").await.ok()?.spec?.volume_name)
            .await?;
    let dir = published_dir(&node, running.metadata.uid.as_deref().unwrap_or(""), &pv);
    let text = until("the pod's file on the node", Duration::from_secs(60), async || {
        std::fs::read_to_string(dir.join("hello")).ok()
    })
    .await?;
    println!("{}: {}", dir.join("hello").display(), text.trim());
    std::fs::write(dir.join("done"), "")?;
    until("the pod Succeeded", Duration::from_secs(60), async || {
        pods.get("writer").await.ok().filter(|p| pod_phase(p) == "Succeeded")
    })
    .await?;
    println!("pod writer Succeeded");

    step("everything undone: pod and claim deleted (unpublish, unstage, detach, DeleteVolume)");
    pods.delete("writer", &DeleteParams::default()).await?;
    claims.delete("data", &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    until("the PV deleted", Duration::from_secs(120), async || pvs.get_opt(&pv).await.ok().filter(Option::is_none))
        .await?;
    println!("PV {pv} deleted; {} removed: {}", dir.display(), !dir.exists());

    step(
        "csi-sidecar explain against the chart's debug endpoint: a claim that is done, and one stuck on a missing secret",
    );
    let stuck_class = ns.scoped("missing-secret");
    let created = explain::stuck_claim(&client, ns.name(), &stuck_class, DRIVER, "stuck").await;
    create(&claims, &pvc("done", Some(STORAGE_CLASS), "1Gi")).await;
    let done_pv = bound(&claims, "done").await?;
    println!("claim {}/done of {STORAGE_CLASS} Bound to {done_pv}", ns.name());
    let endpoint = format!("127.0.0.1:{http_port}");
    let target = explain::Target { kubeconfig: cp.kubeconfig(), endpoint: &endpoint };
    explain::check(&target, ns.name(), "done", "stuck", created).await?;

    if once {
        explain::clean_up(&client, ns.name(), "done", "stuck", &stuck_class).await?;
        step("helm uninstall");
        helm.run(&["uninstall".into(), RELEASE.into(), "--namespace".into(), NAMESPACE.into(), "--wait".into()]);
        ns.delete().await;
        println!("done");
        return Ok(());
    }
    println!(
        "\nThe chart keeps running. KUBECONFIG={} kubectl -n {NAMESPACE} get pods; Ctrl-C stops everything.",
        cp.kubeconfig().display()
    );
    println!(
        "{} explain pvc {}/stuck --endpoint {endpoint} --kubeconfig {} says why that claim waits.",
        csi_sidecar_integration::sidecar_bin().display(),
        ns.name(),
        cp.kubeconfig().display()
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}
