//! The second benchmark: the idle memory of a fresh provisioner with a large cache.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::Result;
use csi_sidecar_integration::{
    bench::{Qps, mib, snapshot},
    kube_support::{csi_pv, pvc, storage_class, unique_name},
    process::status_kib,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube::{
    Api, Resource,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;

use super::{DRIVER, OTHER_DRIVER, create_retrying, meta, sidecar::Env};

pub struct CacheResult {
    pub objects: usize,
    pub create_s: f64,
    pub pvcs_in_cluster: usize,
    pub pvs_in_cluster: usize,
    pub json_mb: f64,
    pub synced_s: f64,
    /// "Watch synced kind=..." lines: kind → time since the spawn.
    pub watch_synced: BTreeMap<String, Duration>,
    /// LIST requests (all clients) from the spawn until ready, by "resource code".
    pub lists: Vec<(String, f64)>,
    /// Requests of the sidecar's user from the spawn until ready.
    pub startup_requests: f64,
    pub rss_5s: f64,
    pub hwm: f64,
    pub stop: String,
    pub problems: Vec<(String, usize)>,
    pub driver: String,
    pub pvcs: String,
}

pub async fn cache_idle(env: &Env, count: usize) -> Result<CacheResult> {
    let admin = &env.admin;
    let ns_name = unique_name("bench-cache");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &Namespace { metadata: meta(&ns_name), ..Default::default() })
        .await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns_name);
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let errors = Mutex::new(0usize);
    let own = match env.args.cache_driver.as_str() {
        "own" => true,
        "other" => false,
        x => anyhow::bail!("--cache-driver must be own or other, not {x:?}"),
    };
    let pending = match env.args.cache_pvcs.as_str() {
        "bound" => false,
        "pending" => true,
        x => anyhow::bail!("--cache-pvcs must be bound or pending, not {x:?}"),
    };
    let wffc = format!("{ns_name}-wffc");
    if pending {
        let mut sc = storage_class(&wffc, DRIVER);
        sc.volume_binding_mode = Some("WaitForFirstConsumer".into());
        Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &sc).await?;
    }
    let t = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    stream::iter(0..2 * count)
        .map(|j| {
            let (pvcs, pvs, errors, done, ns_name, wffc) = (&pvcs, &pvs, &errors, &done, &ns_name, &wffc);
            async move {
                let i = j / 2;
                if j % 2 == 0 {
                    // Class "" and a spec.volumeName that does not exist: nothing
                    // provisions it and the PV binder only keeps it Pending (no
                    // matching against the PVs below, no events).
                    let mut c = pvc(&format!("cache-pvc-{i:05}"), pending.then_some(wffc.as_str()), "1Mi");
                    if let Some(s) = c.spec.as_mut()
                        && !pending
                    {
                        s.volume_name = Some(format!("{ns_name}-missing-{i:05}"));
                    }
                    if own {
                        // Annotated for the sidecar's driver; pre-bound (not
                        // cached: a claim with a volume never needs one) or of
                        // a WaitForFirstConsumer class without a selected node
                        // (cached, waiting); never provisioned either way.
                        c.metadata.annotations =
                            Some([("volume.kubernetes.io/storage-provisioner".to_string(), DRIVER.to_string())].into());
                    }
                    create_retrying(pvcs, &c, errors).await?;
                } else {
                    let name = format!("{ns_name}-pv-{i:05}");
                    let driver = if own { DRIVER } else { OTHER_DRIVER };
                    let mut pv = csi_pv(&name, driver, &format!("vol-{i:05}"), "1Mi");
                    // What a dynamically provisioned volume carries (Retain:
                    // nothing for the sidecar to do with it).
                    if let Some(c) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
                        c.fs_type = Some("ext4".into());
                        c.volume_attributes = Some(
                            [(
                                "storage.kubernetes.io/csiProvisionerIdentity".to_string(),
                                format!("1764460000000-{i}-{driver}"),
                            )]
                            .into(),
                        );
                    }
                    create_retrying(pvs, &pv, errors).await?;
                    // Set phase Available ourselves (unthrottled), so that the PV
                    // binder (20 qps) has nothing left to write afterwards.
                    let patch = serde_json::json!({"status": {"phase": "Available"}});
                    pvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
                let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if d % 2000 == 0 {
                    eprintln!("  [cache] {d}/{} objects created", 2 * count);
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(env.args.creators.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    let create_s = t.elapsed().as_secs_f64();
    // Let kube-controller-manager catch up with the new objects.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (pvcs_in_cluster, pvc_bytes) = json_size(&Api::<PersistentVolumeClaim>::all(admin.clone())).await?;
    let (pvs_in_cluster, pv_bytes) = json_size(&pvs).await?;
    let before = snapshot(admin, None).await?;
    let sidecar = env.start_sidecar("sidecar-cache", &Qps::Default).await?;
    let startup = snapshot(admin, None).await?.delta(&before);
    let lists: Vec<(String, f64)> = startup
        .requests
        .iter()
        .filter_map(|(k, n)| k.strip_prefix("LIST ").map(|rest| (rest.to_string(), *n)))
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = sidecar.pid();
    let (rss_5s, hwm) = (mib(status_kib(pid, "VmRSS:")), mib(status_kib(pid, "VmHWM:")));
    let (_, problems) = sidecar.log_problems();
    let synced_s = sidecar.synced_after.as_secs_f64();
    let sidecar_watch_synced = sidecar.watch_synced.clone();
    let stop = sidecar.stop().await;
    let json_mb = (pvc_bytes + pv_bytes) as f64 / 1e6;
    Ok(CacheResult {
        objects: count,
        driver: env.args.cache_driver.clone(),
        pvcs: env.args.cache_pvcs.clone(),
        create_s,
        pvcs_in_cluster,
        pvs_in_cluster,
        json_mb,
        synced_s,
        watch_synced: sidecar_watch_synced,
        lists,
        startup_requests: startup.sidecar,
        rss_5s,
        hwm,
        stop,
        problems,
    })
}

/// How many objects of a kind there are and their JSON size without
/// managedFields (what the sidecar's informer keeps).
async fn json_size<K>(api: &Api<K>) -> Result<(usize, usize)>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut lp = ListParams::default().limit(500);
    let (mut count, mut bytes) = (0, 0);
    loop {
        let list = api.list(&lp).await?;
        for mut item in list.items {
            item.meta_mut().managed_fields = None;
            bytes += serde_json::to_vec(&item)?.len();
            count += 1;
        }
        match list.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok((count, bytes)),
        }
    }
}
