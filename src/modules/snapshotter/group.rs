//! Group snapshots: the I/O around [`super::group_decide`]. The driver's
//! VolumeGroupSnapshotContents get CreateVolumeGroupSnapshot (dynamic),
//! GetVolumeGroupSnapshot (pre-provisioned), DeleteVolumeGroupSnapshot (on
//! deletion with policy Delete), their status with the member list
//! snapshot-controller builds the member VolumeSnapshots from, the group
//! being-created annotation, the finalizer removal and upstream's events,
//! through the queue `csi-snapshotter-groupsnapshotcontent`.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, runtime::reflector::ObjectRef};

use super::{
    config::SnapshotterFlags,
    decide::Naming,
    group_decide::{self as gd, GroupError, GroupObserved, GroupStep},
};
use crate::{
    compat::{self, snapshotter as upstream},
    csi::{Connection, proto::csi::v1 as csi},
    debug::WaitingFor,
    k8s::{
        cache::Cache,
        events::{EventType, Recorder, reference},
        group_snapshot_api::{VolumeGroupSnapshotClass, VolumeGroupSnapshotContent},
        key::ObjectKey,
    },
    modules::kit::{Done, Reconciled, Wait},
};

/// The newest version of each group content this process wrote.
pub(super) type Written = super::written::Written<VolumeGroupSnapshotContent>;

/// The group snapshot half of the snapshotter.
pub(super) struct GroupSnapshotter {
    pub cfg: SnapshotterFlags,
    pub naming: Naming,
    pub driver: Arc<str>,
    pub csi: Connection,
    pub client: Client,
    pub events: Recorder,
    pub contents: Cache<VolumeGroupSnapshotContent>,
    pub classes: Cache<VolumeGroupSnapshotClass>,
    pub written: Written,
}

type Failed = (Arc<VolumeGroupSnapshotContent>, GroupError);

impl GroupSnapshotter {
    fn api(&self) -> Api<VolumeGroupSnapshotContent> {
        Api::all(self.client.clone())
    }

    fn current(&self, name: &str) -> Option<Arc<VolumeGroupSnapshotContent>> {
        super::written::current(&self.written, name, self.contents.get(&ObjectRef::new(name)))
    }

    async fn patch(&self, name: &str, p: serde_json::Value) -> Result<Arc<VolumeGroupSnapshotContent>, kube::Error> {
        super::written::patch(&self.api(), &self.written, name, p, false).await
    }

    async fn patch_status(
        &self,
        name: &str,
        p: serde_json::Value,
    ) -> Result<Arc<VolumeGroupSnapshotContent>, kube::Error> {
        super::written::patch(&self.api(), &self.written, name, p, true).await
    }

    fn event(&self, c: &VolumeGroupSnapshotContent, reason: &str, message: &str) {
        self.events.publish(reference(c), EventType::Warning, reason, message);
    }

    fn class(&self, c: &VolumeGroupSnapshotContent) -> Option<Arc<VolumeGroupSnapshotClass>> {
        c.spec.volume_group_snapshot_class_name.as_deref().and_then(|n| self.classes.get(&ObjectRef::new(n)))
    }

    async fn secrets(&self, name: &str, namespace: &str) -> Result<HashMap<String, String>, String> {
        crate::k8s::secrets::secret_data(&self.client, name, namespace).await
    }

    /// One sync of group content `name`.
    pub async fn sync(&self, key: ObjectKey<VolumeGroupSnapshotContent>) -> Reconciled {
        let name = key.name();
        let Some(content) = self.current(name) else {
            tracing::debug!("Group content gone");
            return Ok(Done::Finished);
        };
        let class = self.class(&content);
        if !gd::is_ours(&content, &self.driver, class.as_deref()) {
            tracing::trace!("Not this driver's group content");
            return Ok(Done::Finished);
        }
        let step = gd::step(&content);
        tracing::debug!(?step, "Synchronizing VolumeGroupSnapshotContent");
        match step {
            GroupStep::Delete { group_id } => self.delete(content, group_id).await,
            GroupStep::Create { first } => {
                let (reason, text): (&str, fn(&str) -> String) = if first {
                    (upstream::REASON_GROUP_CREATION_FAILED, upstream::text_group_creation_failed)
                } else {
                    (upstream::REASON_GROUP_CHECK_FAILED, upstream::text_group_check_failed)
                };
                match self.create(content, class.as_deref()).await {
                    Ok(c) => self.ready_or_poll(&c),
                    Err((latest, e)) => {
                        tracing::warn!(error = %e, "CreateVolumeGroupSnapshot failed");
                        self.record_error(&latest, reason, &text(&e.to_string())).await;
                        Err(Wait::on(super::waiting::group_create_waiting(&latest, &e)))
                    }
                }
            }
            GroupStep::Ready { remove_annotation } => {
                if !remove_annotation {
                    return Ok(Done::Finished);
                }
                match self.patch(name, gd::remove_being_created_patch()).await {
                    Ok(c) => self.ready_or_poll(&c),
                    Err(e) => {
                        tracing::warn!(error = %e, "Removing the group being-created annotation failed");
                        Err(Wait::on(WaitingFor::ApiServer))
                    }
                }
            }
            GroupStep::Check => match self.check(content.clone(), class.as_deref()).await {
                Ok(c) => self.ready_or_poll(&c),
                Err(e) => {
                    tracing::warn!(error = %e, "Checking the group snapshot failed");
                    let latest = self.current(name).unwrap_or(content);
                    self.record_error(
                        &latest,
                        upstream::REASON_GROUP_CHECK_FAILED,
                        &upstream::text_group_check_failed(&e.to_string()),
                    )
                    .await;
                    Err(Wait::on(e.waiting_for()))
                }
            },
        }
    }

    /// Done when ready; a ready group content being deleted comes round
    /// again soon (the annotation's removal is our own write, not
    /// announced); else polled with backoff.
    fn ready_or_poll(&self, c: &VolumeGroupSnapshotContent) -> Reconciled {
        super::ready_or_poll(c, self.cfg.retry_interval_start)
    }

    async fn record_error(&self, c: &VolumeGroupSnapshotContent, reason: &str, message: &str) {
        super::record_error(&self.api(), &self.written, &self.events, c, (reason, message), "group content").await
    }

    /// The group secret from the deletion-secret annotations.
    async fn group_secrets(&self, c: &VolumeGroupSnapshotContent) -> Result<HashMap<String, String>, GroupError> {
        let name = c.metadata.name.clone().unwrap_or_default();
        match gd::deletion_secret_ref(c)? {
            None => Ok(HashMap::new()),
            Some((secret, ns)) => self.secrets(&secret, &ns).await.map_err(|e| {
                tracing::warn!(error = %e, "Reading the group snapshotter secret failed");
                GroupError::Credentials(name)
            }),
        }
    }

    async fn create(
        &self,
        content: Arc<VolumeGroupSnapshotContent>,
        class: Option<&VolumeGroupSnapshotClass>,
    ) -> Result<Arc<VolumeGroupSnapshotContent>, Failed> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut req = match gd::create_request(&content, class, &self.naming) {
            Ok(r) => r,
            Err(e) => return Err((content, e)),
        };
        req.secrets = match self.group_secrets(&content).await {
            Ok(s) => s,
            Err(e) => return Err((content, GroupError::CreateInput { content: name, source: Box::new(e) })),
        };
        let mut content = content;
        let mut fresh = false;
        if !gd::has_annotation(&content, upstream::ANN_GROUP_BEING_CREATED) {
            content = match self.patch(&name, gd::being_created_patch(content.as_ref())).await {
                Ok(c) => c,
                Err(e) => return Err((content, GroupError::AddAnnotation { content: name, error: e.to_string() })),
            };
            fresh = true;
        }
        let volumes = gd::go_list(&req.source_volume_ids);
        tracing::info!(group_snapshot = %req.name, volumes = %volumes, "Creating group snapshot through the driver");
        let resp = match self.csi.create_volume_group_snapshot(self.cfg.timeout, req).await {
            Ok(r) => r,
            Err(status) => {
                let error = compat::grpc_error_text(&status);
                if gd::is_final(Some(status.code())) {
                    match self.patch(&name, gd::remove_being_created_patch()).await {
                        Ok(c) => content = c,
                        Err(e) => {
                            let error = format!(
                                "failed to remove VolumeGroupSnapshotBeingCreated annotation from the group snapshot content {name}: {e}"
                            );
                            return Err((content, GroupError::Take { volumes, error }));
                        }
                    }
                }
                return Err((content, GroupError::Take { volumes, error }));
            }
        };
        let observed = match gd::observe(resp.group_snapshot.as_ref(), true, "", Timestamp::now()) {
            Ok(o) => o,
            Err(e) => return Err((content, GroupError::Take { volumes, error: e.to_string() })),
        };
        tracing::debug!(handle = %observed.handle, members = observed.members.len(), ready = observed.ready, "Group snapshot created");
        let content = self.write_status(&name, content, &observed, fresh).await?;
        match self.patch(&name, gd::remove_being_created_patch()).await {
            Ok(c) => Ok(c),
            Err(e) => Err((content, GroupError::RemoveAnnotation { content: name, error: e.to_string() })),
        }
    }

    /// Writes the status of an observation, against `content` when it is
    /// the apiserver's answer to our own write just before, else a fresh
    /// read.
    async fn write_status(
        &self,
        name: &str,
        content: Arc<VolumeGroupSnapshotContent>,
        observed: &GroupObserved,
        fresh: bool,
    ) -> Result<Arc<VolumeGroupSnapshotContent>, Failed> {
        let err = |e: kube::Error| GroupError::Status { content: name.to_string(), error: e.to_string() };
        let fresh = if fresh {
            content
        } else {
            match self.api().get(name).await {
                Ok(c) => super::written::wrote(&self.written, c),
                Err(e) => return Err((content, err(e))),
            }
        };
        let Some(status) = gd::status_update(fresh.status.as_ref(), observed) else { return Ok(fresh) };
        match self.patch_status(name, gd::status_patch(&status)).await {
            Ok(c) => Ok(c),
            Err(e) => Err((fresh, err(e))),
        }
    }

    /// A pre-provisioned group content: GetVolumeGroupSnapshot and the status.
    async fn check(
        &self,
        content: Arc<VolumeGroupSnapshotContent>,
        class: Option<&VolumeGroupSnapshotClass>,
    ) -> Result<Arc<VolumeGroupSnapshotContent>, GroupError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut secrets = HashMap::new();
        if let Some(class_name) = &content.spec.volume_group_snapshot_class_name {
            let class = class.ok_or_else(|| GroupError::CheckClass {
                class: class_name.clone(),
                content: name.clone(),
                error: GroupError::ClassNotFound(class_name.clone()).to_string(),
            })?;
            let r = gd::get_secret_ref(class.parameters.as_ref(), &name)
                .map_err(|error| GroupError::SecretRef { content: name.clone(), error })?;
            if let Some((secret, ns)) = r {
                secrets = self
                    .secrets(&secret, &ns)
                    .await
                    .map_err(|error| GroupError::GetCredentials { content: name.clone(), error })?;
            }
        }
        let (group_snapshot_id, snapshot_ids) = gd::get_request_ids(&content)?;
        let req =
            csi::GetVolumeGroupSnapshotRequest { group_snapshot_id: group_snapshot_id.clone(), snapshot_ids, secrets };
        let resp = self
            .csi
            .get_volume_group_snapshot(self.cfg.timeout, req)
            .await
            .map_err(|s| GroupError::Get { content: name.clone(), error: compat::grpc_error_text(&s) })?;
        let observed = gd::observe(resp.group_snapshot.as_ref(), false, &group_snapshot_id, Timestamp::now())?;
        self.write_status(&name, content, &observed, false).await.map_err(|(_, e)| e)
    }

    /// DeleteVolumeGroupSnapshot (when there is a backend group snapshot),
    /// the status cleared, then the finalizer.
    async fn delete(&self, content: Arc<VolumeGroupSnapshotContent>, group_id: Option<String>) -> Reconciled {
        let name = content.metadata.name.clone().unwrap_or_default();
        let mut content = content;
        if let Some(id) = group_id {
            let secrets = match self.group_secrets(&content).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "No group snapshotter secret for the deletion");
                    self.event(&content, upstream::REASON_GROUP_DELETE_ERROR, upstream::TEXT_DELETE_CREDENTIALS);
                    return Err(Wait::on(e.waiting_for()));
                }
            };
            let snapshot_ids = match gd::delete_snapshot_ids(&content) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot delete the group snapshot");
                    self.event(&content, upstream::REASON_GROUP_DELETE_ERROR, upstream::TEXT_GROUP_DELETE_FAILED);
                    return Err(Wait::on(e.waiting_for()));
                }
            };
            tracing::info!(group_snapshot = %id, members = snapshot_ids.len(), "Deleting group snapshot through the driver");
            let req = csi::DeleteVolumeGroupSnapshotRequest { group_snapshot_id: id.clone(), snapshot_ids, secrets };
            if let Err(s) = self.csi.delete_volume_group_snapshot(self.cfg.timeout, req).await {
                tracing::warn!(group_snapshot = %id, error = %compat::grpc_error_text(&s), "DeleteVolumeGroupSnapshot failed");
                self.event(&content, upstream::REASON_GROUP_DELETE_ERROR, upstream::TEXT_GROUP_DELETE_FAILED);
                return Err(Wait::on(WaitingFor::Driver));
            }
            let cleared = async {
                let fresh = self.api().get(&name).await?;
                let status = gd::cleared_status(fresh.status.as_ref());
                self.patch_status(&name, gd::status_patch(&status)).await
            };
            match cleared.await {
                Ok(c) => content = c,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Done::Finished),
                Err(e) => {
                    tracing::warn!(error = %e, "Clearing the group content status failed");
                    self.event(&content, upstream::REASON_GROUP_DELETE_ERROR, upstream::TEXT_DELETE_CLEAR_STATUS);
                    return Err(Wait::on(WaitingFor::ApiServer));
                }
            }
        }
        match crate::k8s::finalizers::remove(&self.api(), &*content, upstream::GROUP_CONTENT_FINALIZER).await {
            Ok(()) => {
                tracing::debug!("Removed the group content's protection finalizer");
                Ok(Done::Finished)
            }
            Err(e) => {
                tracing::warn!(error = %e, "Removing the group content finalizer failed");
                Err(Wait::on(WaitingFor::ApiServer))
            }
        }
    }
}
