//! Invariant 8's bookkeeping: CreateVolume calls that may still be running
//! in the driver, kept by claim UID until the PV exists or the driver gave a
//! final answer, and finished (the volume deleted) when their claim went
//! away meanwhile. Also the short memories of PVs this process deleted.

use super::*;

/// How long a deleted backend volume is remembered (stale cache events of
/// its PV arrive within seconds).
pub(super) const DELETED_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);

/// A CreateVolume that may still be running in the driver: retried to a
/// final answer even if its PVC is deleted meanwhile (no leaked volume).
/// Keyed by the claim's UID: a claim deleted and re-created under the same
/// name is another claim, with its own plan.
#[derive(Clone)]
pub(super) struct InFlight {
    /// `namespace/name` of the claim (its work-queue key).
    pub(super) key: String,
    pub(super) plan: Plan,
    /// The provisioner secret as resolved for the first attempt: the
    /// cleanup of an orphaned volume needs it after the claim, its
    /// namespace and the secret may be gone. Memory only, never logged.
    pub(super) secrets: Secrets,
}

/// Secret data for a CSI call; `Debug` prints only the keys' count.
#[derive(Clone, Default)]
pub(super) struct Secrets(pub(super) HashMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} secret keys>", self.0.len())
    }
}

/// UIDs remembered for [`DELETED_MEMORY`] (pruned on insert).
#[derive(Default)]
pub(super) struct RecentUids(Mutex<HashMap<String, std::time::Instant>>);

impl RecentUids {
    pub(super) fn contains(&self, uid: &str) -> bool {
        self.0.lock().contains_key(uid)
    }

    pub(super) fn insert(&self, uid: &str) {
        let mut uids = self.0.lock();
        uids.retain(|_, at| at.elapsed() < DELETED_MEMORY);
        uids.insert(uid.to_string(), std::time::Instant::now());
    }
}

impl Provisioner {
    /// The `namespace/name` keys of the sources of `kind` of unfinished creates.
    pub(super) fn in_flight_sources(&self, kind: SourceKind) -> Vec<String> {
        let in_flight = self.in_flight.lock();
        in_flight.values().filter_map(|f| f.plan.source.as_ref()).filter(|s| s.kind == kind).map(|s| s.key()).collect()
    }

    /// In-flight creates of claims named `key` other than the live one.
    pub(super) fn orphans_named(&self, key: &str, live_uid: Option<&str>) -> Vec<(String, InFlight)> {
        let in_flight = self.in_flight.lock();
        in_flight
            .iter()
            .filter(|(uid, f)| f.key == key && Some(uid.as_str()) != live_uid)
            .map(|(u, f)| (u.clone(), f.clone()))
            .collect()
    }

    pub(super) fn forget_in_flight(&self, uid: &str) {
        let gone = self.in_flight.lock().remove(uid);
        // A clone source the create held: the protection controller looks again.
        if let (Some(src), Some((_, queue))) = (gone.and_then(|f| f.plan.source), &self.clone_protection)
            && src.kind == SourceKind::Clone
        {
            queue.add(ClaimKey::namespaced(src.namespace, src.name));
        }
    }

    /// The PVC with this UID went away while its CreateVolume was undecided:
    /// get a final answer, and delete what it created, with the secrets of
    /// the first attempt (the PVC's namespace and its secret may be gone).
    pub(super) async fn finish_orphaned(&self, uid: &str, f: &InFlight) -> Reconciled {
        let key = f.key.as_str();
        // The claim left the cache: deleted, or bound (bound claims are not
        // cached). If the PV was saved after all (a create whose answer was
        // lost), the volume is the PV's, and its reclaim policy decides.
        // Read live (a list by name: the `list` verb the role has anyway).
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let by_name = ListParams::default().fields(&format!("metadata.name={}", f.plan.pv_name));
        match pvs.list_metadata(&by_name).await {
            Ok(l) if !l.items.is_empty() => {
                tracing::info!(claim = %key, pv = %f.plan.pv_name, "The volume's PV exists; it owns the volume");
                self.forget_in_flight(uid);
                return Ok(Done::Finished);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(claim = %key, error = %e, "Cannot check for the PV of an orphaned volume; retrying");
                return Err(Wait::on(WaitingFor::ApiServer));
            }
        }
        let mut request = f.plan.request.clone();
        request.secrets = f.secrets.0.clone();
        match self.create_volume(request.clone()).await {
            Ok(resp) => {
                let Some(v) = resp.volume.filter(|v| !v.volume_id.is_empty()) else {
                    self.forget_in_flight(uid);
                    return Ok(Done::Finished);
                };
                match self.cleanup(&v.volume_id, &request.secrets).await {
                    Ok(()) => {
                        tracing::info!(claim = %key, volume = %v.volume_id, "Deleted the volume of a PVC deleted during provisioning");
                        self.forget_in_flight(uid);
                        Ok(Done::Finished)
                    }
                    Err(e) => {
                        tracing::warn!(claim = %key, error = %e, "Cleanup of an orphaned volume failed; retrying");
                        Err(Wait::on(WaitingFor::Driver))
                    }
                }
            }
            Err(s) if decide::classify_create_error(s.code(), false) == CreateFailure::InBackground => {
                Err(Wait::on(WaitingFor::Driver))
            }
            Err(s) => {
                tracing::info!(claim = %key, error = %status_text(&s), "CreateVolume of a deleted PVC ended in a final error");
                self.forget_in_flight(uid);
                Ok(Done::Finished)
            }
        }
    }

    /// Deletes a volume that cannot be used (an unusable answer, an
    /// orphan): one attempt. On a failure the caller keeps the create in
    /// flight and the queue's backoff brings the next one; a burst would
    /// hit a restarting driver, and a hanging one would hold the worker
    /// for several `--timeout`s.
    pub(super) async fn cleanup(&self, volume_id: &str, secrets: &HashMap<String, String>) -> Result<(), String> {
        self.delete_volume(volume_id, secrets.clone()).await.map_err(|s| status_text(&s))
    }
}
