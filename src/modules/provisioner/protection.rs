//! Data-source protection: the clone or snapshot source read live, checked
//! and given the provisioner's finalizer before CreateVolume, and released
//! when no waiting claim or unfinished create needs it (the
//! cloning-protection controller and the snapshot-finalizer sweep).

use super::*;

/// A clone's or restore's source as read for its checks.
pub(super) enum ReadSource {
    Claim(Box<PersistentVolumeClaim>),
    Snapshot(Box<VolumeSnapshot>),
}

impl Provisioner {
    /// The clone source's volume, checked (read live: bound claims and
    /// their PVs need not be in this provisioner's caches).
    pub(super) async fn clone_source(
        &self,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        src: &PlanSource,
    ) -> Result<(csi::VolumeContentSource, ReadSource), (WaitingFor, String)> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &src.namespace);
        let source = claims.get(&src.name).await.map_err(|e| {
            let not_found = matches!(&e, kube::Error::Api(s) if s.code == 404);
            let claim_ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
            (WaitingFor::DataSource, sources::source_claim_error(&src.name, claim_ns, not_found, &api_error_text(&e)))
        })?;
        let volume = source.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty());
        let pv = match volume {
            None => None,
            Some(v) => match Api::<PersistentVolume>::all(self.client.clone()).get(&v).await {
                Ok(pv) => Some(pv),
                Err(e) => {
                    tracing::warn!(pv = %v, source = %src.key(), error = %e, "Cannot read the clone source's volume");
                    None
                }
            },
        };
        let content = sources::clone_source(pvc, &sc.provisioner, &source, pv.as_ref())
            .map_err(|e| (WaitingFor::DataSource, e))?;
        Ok((content, ReadSource::Claim(Box::new(source))))
    }

    /// The snapshot's handle, checked (read live, as upstream).
    pub(super) async fn snapshot_source(
        &self,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        src: &PlanSource,
    ) -> Result<(csi::VolumeContentSource, ReadSource), (WaitingFor, String)> {
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &src.namespace);
        let snapshot = snapshots.get(&src.name).await.map_err(|e| {
            (
                WaitingFor::DataSource,
                format!("error getting snapshot {} from api server: {}", src.name, api_error_text(&e)),
            )
        })?;
        let unusable = |e: String| (super::waiting::snapshot_source_waiting(&snapshot), e);
        sources::snapshot_usable(&snapshot).map_err(unusable)?;
        let content = match sources::bound_content_name(&snapshot) {
            None => None,
            Some(name) => match Api::<VolumeSnapshotContent>::all(self.client.clone()).get(name).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(content = %name, snapshot = %src.key(), error = %e, "Cannot read the snapshot's content");
                    None
                }
            },
        };
        let prevent = self.cfg.prevent_volume_mode_conversion;
        let handle =
            sources::snapshot_source(pvc, &sc.provisioner, &snapshot, content.as_ref(), prevent).map_err(unusable)?;
        Ok((handle, ReadSource::Snapshot(Box::new(snapshot))))
    }

    /// Puts the provisioner's finalizer on the source as read (nothing to
    /// write when it has it; a snapshot's tested patch re-reads on a change).
    pub(super) async fn protect_source(&self, read: ReadSource) -> Result<(), String> {
        let result = match read {
            ReadSource::Claim(c) => {
                let ns = c.metadata.namespace.clone().unwrap_or_default();
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
                crate::k8s::finalizers::add(&api, &*c, upstream::CLONE_FINALIZER).await
            }
            ReadSource::Snapshot(snap) => {
                let ns = snap.metadata.namespace.clone().unwrap_or_default();
                let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &ns);
                match crate::k8s::finalizers::add(&api, &*snap, upstream::SNAPSHOT_SOURCE_FINALIZER).await {
                    // Upstream's RBAC grants no write on snapshots: the
                    // restore goes on without the protection, as upstream's.
                    Err(e) if crate::k8s::update_fallback::refused(&e) => {
                        tracing::info!(error = %e, "Restoring without the snapshot's source-protection finalizer: the role may not write VolumeSnapshots");
                        Ok(())
                    }
                    other => other,
                }
            }
        };
        result.map_err(|e| api_error_text(&e))
    }

    /// Drops the provisioner's finalizer from the snapshot the claim
    /// `restored` (a UID) got its volume from, unless another claim waiting
    /// for a volume or an unfinished create still restores from it; a
    /// failure, and a snapshot kept, are left to the sweep (or the release
    /// after the last restore).
    pub(super) async fn release_snapshot(&self, src: &PlanSource, restored: &str) {
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Snapshot);
        let provisioned = |c: &CachedPvc| {
            let uid = c.metadata.uid.as_deref().unwrap_or_default();
            uid == restored || self.pvs.get(&ObjectRef::new(&self.pv_name_of(uid))).is_some()
        };
        let key = src.key();
        if let Some(why) = sources::snapshot_still_needed(&key, pending.iter().map(|c| &**c), &in_flight, provisioned) {
            tracing::debug!(snapshot = %key, why, "Snapshot source still needed");
            return;
        }
        let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &src.namespace);
        let result = match api.get(&src.name).await {
            Ok(snap) => crate::k8s::finalizers::remove(&api, &snap, upstream::SNAPSHOT_SOURCE_FINALIZER).await,
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(snapshot = %src.key(), error = %e, "Failed to remove the snapshot finalizer; the sweep will");
        }
    }

    /// The cloning-protection controller: one source claim.
    pub(super) async fn sync_clone_source(&self, key: ClaimKey) -> Reconciled {
        let Some((protected, _)) = &self.clone_protection else { return Ok(Done::Finished) };
        let Some(source) = protected.get(&key.cache_ref()) else { return Ok(Done::Finished) };
        let ns = key.namespace().unwrap_or_default();
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Clone);
        tracing::trace!(source = %key, waiting = pending.len(), in_flight = in_flight.len(), "Checking a clone source");
        match sources::clone_protection(&source, pending.iter().map(|c| &**c), &in_flight) {
            CloneProtection::Nothing => Ok(Done::Finished),
            CloneProtection::Wait(why) => {
                tracing::debug!(source = %key, why, "Clone source still needed");
                Err(Wait::on(WaitingFor::Dependent))
            }
            CloneProtection::Release => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                match crate::k8s::finalizers::remove(&api, &source.to_full(), upstream::CLONE_FINALIZER).await {
                    Ok(()) => {
                        tracing::info!(source = %key, "Removed the cloning-protection finalizer");
                        Ok(Done::Finished)
                    }
                    Err(e) => {
                        tracing::info!(source = %key, error = %e, "Failed to remove the clone finalizer");
                        Err(Wait::on(WaitingFor::ApiServer))
                    }
                }
            }
        }
    }

    /// One pass of the snapshot-finalizer sweep (upstream's
    /// SnapshotFinalizerProtection controller).
    pub(super) async fn sweep_snapshots(&self) {
        let Some(snapshots) = &self.protected_snapshots else { return };
        let all = snapshots.state();
        let pending = self.waiting.as_ref().map(|w| w.state()).unwrap_or_default();
        let in_flight = self.in_flight_sources(SourceKind::Snapshot);
        let orphans = sources::orphaned_snapshots(all.iter().map(|s| &**s), pending.iter().map(|c| &**c), &in_flight);
        for key in orphans {
            let Some((ns, name)) = key.split_once('/') else { continue };
            let Some(snap) = snapshots.get(&ObjectRef::new(name).within(ns)) else { continue };
            let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), ns);
            match crate::k8s::finalizers::remove(&api, &snap, upstream::SNAPSHOT_SOURCE_FINALIZER).await {
                Ok(()) => tracing::info!(snapshot = %key, "Removed an orphaned snapshot source finalizer"),
                Err(e) => {
                    tracing::warn!(snapshot = %key, error = %e, "Failed to remove an orphaned snapshot finalizer")
                }
            }
        }
    }
}

/// The snapshot-finalizer sweep, every `--snapshot-orphan-sweep-interval`
/// (first once its cache synced). Provisioning does not wait for that cache:
/// a role without `list`/`watch` on VolumeSnapshots (upstream's are
/// optional) costs the sweep, logged as the watch's refusal, not the
/// provisioner.
pub(super) async fn run_snapshot_sweep(
    p: Arc<Provisioner>,
    snapshots: Option<crate::k8s::informers::Informer<VolumeSnapshot>>,
    token: CancellationToken,
) {
    let Some(snapshots) = snapshots else { return };
    if token.run_until_cancelled(snapshots.synced()).await.is_none() {
        return;
    }
    let mut every = tokio::time::interval(p.cfg.snapshot_orphan_sweep_interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while token.run_until_cancelled(every.tick()).await.is_some() {
        p.sweep_snapshots().instrument(tracing::info_span!("snapshot_sweep")).await;
    }
}
