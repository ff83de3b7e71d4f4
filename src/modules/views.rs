//! The views of the shared informer cache that the controller modules read.
//! Every module of a process serves the one driver behind `--csi-address`,
//! so objects of other drivers are never read and are not cached. Each view
//! has a name; two modules asking for the same view share it, different
//! views of one kind share one watch and one store.

use crate::{
    compat::provisioner::{ANN_PROVISIONED_BY, CLONE_FINALIZER, SNAPSHOT_SOURCE_FINALIZER},
    k8s::{
        cache::Cache,
        cached::{CachedPod, CachedPv, CachedPvc, CachedVa},
        group_snapshot_api::{VolumeGroupSnapshotClass, VolumeGroupSnapshotContent},
        informers::{Informer, Informers},
        snapshot_api::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent},
    },
};

/// Index of the VolumeAttachment store: attachments by PV name.
pub const VA_BY_PV: &str = "pv";

/// PVs of the driver (by CSI source or by provisioner annotation), and
/// in-tree PVs whose plugin migrates to it.
pub fn driver_pvs(informers: &Informers, driver: &str) -> Informer<CachedPv> {
    let d = driver.to_string();
    informers.view(&format!("driver={driver}"), move |pv: &CachedPv| {
        pv.spec.as_ref().and_then(|s| s.csi_driver().or_else(|| s.migrated_driver())) == Some(d.as_str())
            || pv.annotation(ANN_PROVISIONED_BY) == Some(d.as_str())
    })
}

/// VolumeAttachments the driver attaches, indexed by PV name ([`VA_BY_PV`]).
pub fn driver_vas(informers: &Informers, driver: &str) -> Informer<CachedVa> {
    let d = driver.to_string();
    let inf = informers.view(&format!("driver={driver}"), move |va: &CachedVa| *va.spec.attacher == *d);
    inf.store().add_index(VA_BY_PV, CachedVa::pv_name);
    inf
}

/// Claims of the driver that may still need a volume: a claim with
/// `spec.volumeName` (bound, or pre-bound by its author) never does, so a
/// cluster's thousands of bound claims cost the provisioner no memory.
pub fn unbound_claims(
    informers: &Informers,
    driver: &str,
    for_driver: fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, &str) -> bool,
) -> Informer<CachedPvc> {
    let d = driver.to_string();
    informers.view(&format!("unbound,driver={driver}"), move |c: &CachedPvc| {
        for_driver(&c.metadata, &d) && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty)
    })
}

/// With `--node-deployment`: the claims of [`unbound_claims`] that `keep`
/// accepts (not yet on a node, or on `node`); a claim another node won
/// leaves the view.
pub fn node_unbound_claims(
    informers: &Informers,
    driver: &str,
    for_driver: fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, &str) -> bool,
    node: &str,
    keep: impl Fn(&CachedPvc) -> bool + Send + Sync + 'static,
) -> Informer<CachedPvc> {
    let d = driver.to_string();
    informers.view(&format!("unbound,driver={driver},node={node}"), move |c: &CachedPvc| {
        for_driver(&c.metadata, &d)
            && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty)
            && keep(c)
    })
}

/// With `--node-deployment`: the PVs of [`driver_pvs`] that `accessible`
/// accepts (those `node` can access); other nodes' PVs cost nothing.
pub fn node_pvs(
    informers: &Informers,
    driver: &str,
    node: &str,
    accessible: impl Fn(&CachedPv) -> bool + Send + Sync + 'static,
) -> Informer<CachedPv> {
    let d = driver.to_string();
    informers.view(&format!("driver={driver},node={node}"), move |pv: &CachedPv| {
        (pv.spec.as_ref().and_then(|s| s.csi_driver()) == Some(d.as_str())
            || pv.annotation(ANN_PROVISIONED_BY) == Some(d.as_str()))
            && accessible(pv)
    })
}

/// Bound claims (with `spec.volumeName`) that may be on a volume of the
/// driver: `for_driver` drops those another driver provisioned, so other
/// drivers' claims cost nothing; a claim bound to a pre-created PV has no
/// provisioner annotation and is kept (its PV decides).
pub fn bound_claims(
    informers: &Informers,
    driver: &str,
    for_driver: fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, &str) -> bool,
) -> Informer<CachedPvc> {
    let d = driver.to_string();
    informers.view(&format!("bound,driver={driver}"), move |c: &CachedPvc| {
        for_driver(&c.metadata, &d)
            && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty())
    })
}

/// Pods that use claims and have not terminated, as the resizer's in-use
/// check needs them (claims only); asked for only when the driver can
/// expand offline only. A pod that terminates leaves the view.
/// Indexed by `<namespace>/<claim>` of every claim a pod uses
/// ([`PODS_BY_CLAIM`]).
pub fn pods_using_claims(informers: &Informers) -> Informer<CachedPod> {
    let inf = informers.view("using-claims", |p: &CachedPod| !p.claims.is_empty() && !p.terminated);
    inf.store().add_multi_index(PODS_BY_CLAIM, claim_keys);
    inf
}

/// The index of [`pods_using_claims`]: `<namespace>/<claim>`.
pub const PODS_BY_CLAIM: &str = "claim";

fn claim_keys(p: &CachedPod) -> Vec<String> {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    p.claims.iter().map(|c| format!("{ns}/{c}")).collect()
}

/// Whether a pod of `pods` (the [`pods_using_claims`] view) uses the claim
/// `namespace/name`: the index's pods of that claim only, not a scan.
pub fn claim_in_use(pods: &Cache<CachedPod>, namespace: Option<&str>, name: &str) -> bool {
    let Some(ns) = namespace else { return false };
    !pods.by_index(PODS_BY_CLAIM, &format!("{ns}/{name}")).is_empty()
}

/// VolumeSnapshotContents of the driver (`spec.driver`): the snapshotter
/// acts on them, the provisioner reads the content of a snapshot it
/// restores from. Ask for it only when the snapshot API is installed
/// ([`crate::k8s::snapshot_api::installed`]).
pub fn driver_snapshot_contents(informers: &Informers, driver: &str) -> Informer<VolumeSnapshotContent> {
    let d = driver.to_string();
    informers.view(&format!("driver={driver}"), move |c: &VolumeSnapshotContent| c.spec.driver == d)
}

/// Every VolumeSnapshotClass (a cluster has a handful).
pub fn snapshot_classes(informers: &Informers) -> Informer<VolumeSnapshotClass> {
    informers.get::<VolumeSnapshotClass>()
}

/// Claims carrying the provisioner's cloning-protection finalizer (clone
/// sources; bound, so not in [`unbound_claims`]): the cloning-protection
/// controller releases them. A cluster has few.
pub fn cloning_protected_claims(informers: &Informers) -> Informer<CachedPvc> {
    informers.view("cloning-protection", |c: &CachedPvc| {
        c.metadata.finalizers.iter().flatten().any(|f| f == CLONE_FINALIZER)
    })
}

/// VolumeSnapshots carrying the provisioner's source finalizer (restores
/// in progress, or orphans for the sweep). Ask for it only when the
/// snapshot API is installed ([`crate::k8s::snapshot_api::installed`]).
pub fn provisioner_protected_snapshots(informers: &Informers) -> Informer<VolumeSnapshot> {
    informers.view("provisioner-source", |s: &VolumeSnapshot| {
        s.metadata.finalizers.iter().flatten().any(|f| f == SNAPSHOT_SOURCE_FINALIZER)
    })
}

/// Claims of any driver still waiting for a volume that clone a claim or
/// restore a snapshot (`with_source`: the provisioner's test of the data
/// source): what keeps a clone source's or a snapshot's protection. Any
/// driver, as upstream: a claim of a late-binding class has no provisioner
/// annotation before the scheduler picks a node. A claim that binds leaves.
pub fn claims_waiting_for_sources(informers: &Informers, with_source: fn(&CachedPvc) -> bool) -> Informer<CachedPvc> {
    informers.view("waiting-for-source", move |c: &CachedPvc| with_source(c))
}

/// VolumeGroupSnapshotContents of the driver (`spec.driver`), for the
/// snapshotter's group snapshots. Ask for it only when the group snapshot
/// API is installed ([`crate::k8s::group_snapshot_api::installed`]).
pub fn driver_group_snapshot_contents(informers: &Informers, driver: &str) -> Informer<VolumeGroupSnapshotContent> {
    let d = driver.to_string();
    informers.view(&format!("driver={driver}"), move |c: &VolumeGroupSnapshotContent| c.spec.driver == d)
}

/// Every VolumeGroupSnapshotClass (a cluster has a handful).
pub fn group_snapshot_classes(informers: &Informers) -> Informer<VolumeGroupSnapshotClass> {
    informers.get::<VolumeGroupSnapshotClass>()
}

/// The CSIStorageCapacity objects this provisioner manages: watched in
/// `namespace` only, selected by the driver and managed-by labels (the
/// apiserver filters; the view checks again).
pub fn capacity_objects(
    informers: &Informers,
    namespace: &str,
    driver: &str,
    managed_by: &str,
) -> Informer<k8s_openapi::api::storage::v1::CSIStorageCapacity> {
    use crate::compat::capacity::{LABEL_DRIVER_NAME, LABEL_MANAGED_BY};
    let scope = crate::k8s::informers::Scope {
        namespace: namespace.to_string(),
        labels: format!("{LABEL_DRIVER_NAME}={driver},{LABEL_MANAGED_BY}={managed_by}"),
    };
    let (d, m) = (driver.to_string(), managed_by.to_string());
    informers.scoped(
        scope,
        &format!("capacity,driver={driver}"),
        move |c: &k8s_openapi::api::storage::v1::CSIStorageCapacity| {
            let labels = c.metadata.labels.as_ref();
            labels.and_then(|l| l.get(LABEL_DRIVER_NAME)) == Some(&d)
                && labels.and_then(|l| l.get(LABEL_MANAGED_BY)) == Some(&m)
        },
    )
}

#[cfg(test)]
#[path = "views_tests.rs"]
mod tests;
