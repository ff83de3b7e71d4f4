//! The volume path: one PV name from the `volumes` queue: the finalizer
//! added, or DeleteVolume and the PV removed for a Released `Delete` PV.

use super::*;

impl Provisioner {
    /// Handles one PV name.
    pub(super) async fn sync_volume(&self, key: PvKey) -> Reconciled {
        let Some(pv) = self.pvs.get(&key.cache_ref()).map(|p| p.to_full()) else { return Ok(Done::Finished) };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match decide::decide_volume(&pv, &self.driver.name) {
            VolumeDecision::Ignore => Ok(Done::Finished),
            VolumeDecision::AddFinalizer => patch_finalizers(&api, &pv, true).await,
            VolumeDecision::RemoveFinalizer => self.release_finalizer(&api, &pv).await,
            VolumeDecision::Delete => self.delete(&api, &pv).await,
        }
    }

    pub(super) async fn delete(&self, api: &Api<PersistentVolume>, pv: &PersistentVolume) -> Reconciled {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let failed = |msg: &str| {
            self.events.publish(reference(pv), EventType::Warning, upstream::REASON_VOLUME_FAILED_DELETE, msg)
        };
        if let Some(vas) = &self.attachments
            && let Some(va) = vas.by_index(crate::modules::views::VA_BY_PV, &name).first()
        {
            failed(&format!("persistentvolume {name} is still attached to node {}", va.spec.node_name));
            return Err(Wait::on(WaitingFor::Dependent));
        }
        if !self.driver.has_plugin_service(Svc::ControllerService)
            || !self.driver.has_controller_capability(Rpc::CreateDeleteVolume)
        {
            failed(
                "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
            );
            return Err(Wait::on(WaitingFor::Driver));
        }
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        let already = self.volume_deleted.contains(&uid);
        if !already {
            let secrets = match self.deletion_secrets(pv).await {
                Ok(s) => s,
                Err(e) => {
                    failed(&e);
                    return Err(Wait::on(WaitingFor::Secret));
                }
            };
            let (handle, migrated) = match decide::volume_handle(pv) {
                Ok(h) => h,
                Err(e) => {
                    failed(&e);
                    return Err(Wait::on(WaitingFor::Retry));
                }
            };
            let deleted = crate::csi::connection::migrated_scope(migrated, self.delete_volume(&handle, secrets)).await;
            if let Err(s) = deleted {
                failed(&status_text(&s));
                return Err(Wait::on(WaitingFor::Driver));
            }
            tracing::info!(pv = %name, volume = %handle, "Deleted volume");
            self.volume_deleted.insert(&uid);
            if let Some(c) = &self.capacity {
                c.deleted(pv);
            }
        }
        let mut current = pv.clone();
        if pv.metadata.deletion_timestamp.is_none() {
            match api.delete(&name, &DeleteParams::default()).await {
                // Still there because of finalizers: drop ours from this version.
                Ok(either::Either::Left(deleting)) => current = deleting,
                Ok(either::Either::Right(_)) => return Ok(Done::Finished),
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Done::Finished),
                Err(e) => {
                    failed(&format!("error deleting PersistentVolume {name}: {}", api_error_text(&e)));
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
            }
        }
        self.release_finalizer(api, &current).await
    }

    /// Removes the provisioner finalizer, once per PV: a stale cached copy
    /// still showing it after the removal is not patched again.
    pub(super) async fn release_finalizer(&self, api: &Api<PersistentVolume>, pv: &PersistentVolume) -> Reconciled {
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        if self.finalizer_released.contains(&uid) {
            return Ok(Done::Finished);
        }
        let outcome = patch_finalizers(api, pv, false).await;
        if outcome == Ok(Done::Finished) {
            self.finalizer_released.insert(&uid);
        }
        outcome
    }

    /// The provisioner secret for DeleteVolume ([`decide::deletion_secret_ref`]);
    /// a secret that cannot be read is logged and the deletion goes on
    /// without it, as upstream.
    pub(super) async fn deletion_secrets(&self, pv: &PersistentVolume) -> Result<HashMap<String, String>, String> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let sc = (!class.is_empty()).then(|| self.classes.get(&ObjectRef::new(&class))).flatten();
        match decide::deletion_secret_ref(pv, sc.as_deref())? {
            None => Ok(HashMap::new()),
            Some(r) => Ok(self.secret(&r).await.unwrap_or_else(|e| {
                tracing::error!(pv = %pv_name, error = %e, "Failed to get deletion credentials; deleting without them");
                HashMap::new()
            })),
        }
    }
}

pub(super) async fn patch_finalizers(api: &Api<PersistentVolume>, pv: &PersistentVolume, add: bool) -> Reconciled {
    let result = if add {
        crate::k8s::finalizers::add(api, pv, upstream::PV_FINALIZER).await
    } else {
        crate::k8s::finalizers::remove(api, pv, upstream::PV_FINALIZER).await
    };
    match result {
        Ok(()) => Ok(Done::Finished),
        Err(e) => {
            tracing::warn!(pv = %pv.metadata.name.as_deref().unwrap_or_default(), error = %e, "Updating the PV finalizer failed");
            Err(Wait::on(WaitingFor::ApiServer))
        }
    }
}
