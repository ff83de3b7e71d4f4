//! The claim path: one PVC key from the `claims` queue to a PV (or an
//! event saying why not), with the node-deployment race, the infeasible
//! delay, the data source prepared and the CreateVolume failure handled.

use super::*;

impl Provisioner {
    /// Handles one PVC key.
    pub(super) async fn sync_claim(&self, claim: ClaimKey) -> Reconciled {
        let key = claim.to_string();
        let pvc = self.claim(&claim);
        let live_uid =
            pvc.as_ref().filter(|p| p.metadata.deletion_timestamp.is_none()).and_then(|p| p.metadata.uid.clone());
        // Uncertain creates of claims by this name that are no longer the
        // live claim (deleted, or deleted and re-created): finish them first.
        for (uid, f) in self.orphans_named(&key, live_uid.as_deref()) {
            self.finish_orphaned(&uid, &f).await?;
        }
        self.infeasible.lock().forget_named(&claim, live_uid.as_deref());
        let Some(pvc) = pvc.filter(|_| live_uid.is_some()) else {
            self.races.forget(&key);
            return Ok(Done::Finished);
        };
        let in_flight = live_uid.as_ref().and_then(|u| self.in_flight.lock().get(u).cloned());
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let sc = self.classes.get(&ObjectRef::new(&class_name));
        let pv_name = self.pv_name_of(pvc.metadata.uid.as_deref().unwrap_or_default());
        let pv_exists = self.pvs.get(&ObjectRef::new(&pv_name)).is_some();
        match decide::decide_claim(&pvc, sc.as_deref(), &self.driver.name, pv_exists) {
            ClaimDecision::Ignore(why) => {
                tracing::trace!(claim = %key, why, "Nothing to do");
                Ok(Done::Finished)
            }
            decision @ ClaimDecision::WaitForScheduler => {
                tracing::debug!(claim = %key, "Waiting for the scheduler to select a node");
                Ok(decision.waiting_for().map_or(Done::Finished, Done::Parked))
            }
            ClaimDecision::Provision => match sc {
                Some(sc) => {
                    if in_flight.is_none()
                        && let Some(wait) = self.infeasible_wait(live_uid.as_deref().unwrap_or_default(), &sc)
                    {
                        tracing::debug!(claim = %key, retry_in = ?wait, "Infeasible CreateVolume: not retried yet (delay running, class unchanged)");
                        return Err(Wait::on(WaitingFor::Infeasible).after(wait));
                    }
                    if let Some(nd) = self.node.as_ref().filter(|_| in_flight.is_none()) {
                        let selected =
                            pvc.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_SELECTED_NODE));
                        let immediate = node_deployment::immediate(&sc);
                        match node_deployment::ownership(
                            selected.map(String::as_str),
                            &nd.node,
                            immediate,
                            nd.immediate_binding,
                        ) {
                            node_deployment::Ownership::Ours => {}
                            node_deployment::Ownership::NotOurs => {
                                tracing::trace!(claim = %key, "Not this node's claim");
                                self.races.forget(&key);
                                return Ok(Done::Finished);
                            }
                            node_deployment::Ownership::Race => {
                                // A class whose allowedTopologies exclude this node is not raced for.
                                if sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty())
                                    && self.accessibility(&pvc, &sc).is_err()
                                {
                                    tracing::debug!(claim = %key, "The class's allowed topologies exclude this node");
                                    return Ok(Done::Finished);
                                }
                                return self.race(&key, &pvc, &sc).await;
                            }
                        }
                    }
                    self.provision(&key, &pvc, &sc, in_flight).await
                }
                None => {
                    let msg = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
                    self.event_pvc(&pvc, EventType::Warning, upstream::REASON_PROVISIONING_FAILED, &msg);
                    Err(Wait::on(WaitingFor::Class))
                }
            },
        }
    }

    /// How long claim `uid` of class `sc` waits before CreateVolume after an
    /// infeasible one.
    pub(super) fn infeasible_wait(&self, uid: &str, sc: &StorageClass) -> Option<std::time::Duration> {
        let class = sc.metadata.name.as_deref().unwrap_or_default();
        let version = sc.metadata.resource_version.as_deref().unwrap_or_default();
        self.infeasible.lock().wait(uid, class, version, std::time::Instant::now())
    }

    /// The plan of a new provisioning, with its data source checked and
    /// protected (upstream `prepareProvision`).
    pub(super) async fn prepare(&self, pvc: &PersistentVolumeClaim, sc: &StorageClass) -> Result<Plan, PlanError> {
        let invalid = |e: String| PlanError::Invalid(e);
        let source = sources::data_source(pvc, self.cross_namespace).map_err(|e| invalid(e.to_string()))?;
        let claim_ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(src) = source.as_ref().filter(|s| s.namespace != claim_ns) {
            let api: Api<ReferenceGrant> = Api::namespaced(self.client.clone(), &src.namespace);
            let grants = api.list(&ListParams::default()).await.map_err(|e| {
                invalid(format!(
                    "error getting ReferenceGrants in {} namespace from api server: {}",
                    src.namespace,
                    api_error_text(&e)
                ))
            })?;
            sources::check_granted(pvc, src, &grants.items).map_err(|e| invalid(e.to_string()))?;
        }
        let mut plan = decide::plan(pvc, sc, &self.driver, &self.settings, source.as_ref())?;
        if let Some(class) = vac::class_name(pvc, self.vac_gate) {
            vac::check_driver(&self.driver).map_err(|e| PlanError::Capability(e.to_string()))?;
            let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
            let found = api.get(class).await.map_err(|e| invalid(api_error_text(&e)))?;
            plan.request.mutable_parameters =
                vac::mutable_parameters(&found, &self.driver.name).map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(src) = plan.source.clone() {
            let kind = match src.kind {
                SourceKind::Clone => upstream::KIND_PVC,
                SourceKind::Snapshot => upstream::KIND_SNAPSHOT,
            };
            let content = match src.kind {
                SourceKind::Clone => self.clone_source(pvc, sc, &src).await,
                SourceKind::Snapshot => self.snapshot_source(pvc, sc, &src).await,
            };
            let (content, read) = content.map_err(|(waiting_for, e)| PlanError::Source {
                waiting_for,
                message: sources::handle_error(kind, &src.name, &e),
            })?;
            plan.request.volume_content_source = Some(content);
            self.protect_source(read).await.map_err(invalid)?;
        }
        Ok(plan)
    }

    pub(super) async fn provision(
        &self,
        key: &str,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        saved: Option<InFlight>,
    ) -> Reconciled {
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        let class = sc.metadata.name.clone().unwrap_or_default();
        self.event_pvc(
            pvc,
            EventType::Normal,
            upstream::REASON_PROVISIONING,
            &format!("External provisioner is provisioning volume for claim \"{key}\""),
        );
        // As the provisioning library reports what `Provision` returns: the
        // error as it is, without a StorageClass prefix.
        let failed = |msg: String| {
            self.event_pvc(pvc, EventType::Warning, upstream::REASON_PROVISIONING_FAILED, &msg);
        };
        // CSI migration: a class of the in-tree plugin is provisioned with its
        // translation, and the PV is saved in the in-tree form.
        let translated = match decide::migrated_class(sc, &self.driver.name) {
            Ok(t) => t,
            Err(e) => {
                failed(e);
                return Err(Wait::on(WaitingFor::Class));
            }
        };
        let migrated = translated.is_some();
        let effective = translated.as_ref().unwrap_or(sc);
        let saved_secrets = saved.as_ref().map(|f| f.secrets.clone());
        let plan = match saved.map(|f| Ok(f.plan)) {
            Some(p) => p,
            None => self.prepare(pvc, effective).await,
        };
        let plan = match plan {
            Ok(p) => p,
            Err(PlanError::ExternalPopulator(kind)) => {
                tracing::info!(claim = %key, kind, "Data source left to an external populator");
                // A normal wait (the long-wait alert leaves it out).
                self.own_events.publish(
                    reference(pvc),
                    EventType::Normal,
                    upstream::REASON_PROVISIONING,
                    "Assuming an external populator will provision the volume",
                );
                return Ok(Done::Parked(WaitingFor::Populator));
            }
            Err(e) => {
                failed(e.to_string());
                return Err(Wait::on(e.waiting_for()));
            }
        };
        let mut request = plan.request.clone();
        match self.accessibility(pvc, effective) {
            Ok(r) => request.accessibility_requirements = r,
            Err(topology::TopologyError::Reschedule(e)) => {
                // A missing node: upstream reports the lookup's error as it is.
                failed(e);
                return reschedule(&self.client, pvc, WaitingFor::Scheduler).await;
            }
            Err(topology::TopologyError::Retry(e)) => {
                failed(format!("error generating accessibility requirements: {e}"));
                return Err(Wait::on(WaitingFor::Topology));
            }
        }
        match (&plan.provisioner_secret, saved_secrets) {
            (_, Some(s)) => request.secrets = s.0,
            (Some(r), None) => match self.secret(r).await {
                Ok(s) => request.secrets = s,
                Err(e) => {
                    failed(e);
                    return Err(Wait::on(WaitingFor::Secret));
                }
            },
            (None, None) => {}
        }
        // From here on the driver may create a volume: remember it until the
        // PV exists or the driver gave a final answer.
        let entry = InFlight { key: key.to_string(), plan: plan.clone(), secrets: Secrets(request.secrets.clone()) };
        self.in_flight.lock().insert(uid.clone(), entry);
        let resp = match crate::csi::connection::migrated_scope(migrated, self.create_volume(request.clone())).await {
            Ok(r) => r,
            Err(status) => return self.create_failed(&uid, key, pvc, sc, &status, &failed).await,
        };
        let built = match decide::build_pv(&plan, &resp, pvc, sc, &self.driver.name, &self.identity, &self.settings) {
            // With the gate off, upstream does not record the class either.
            Ok(mut pv) if !self.vac_gate => {
                if let Some(spec) = pv.spec.as_mut() {
                    spec.volume_attributes_class_name = None;
                }
                Ok(pv)
            }
            other => other,
        };
        // A failed translation reads as upstream's `Provision` returns it: as it is.
        let built = match built {
            Ok(pv) if migrated => crate::migration::csi_pv_to_in_tree(&pv).map_err(|e| e.to_string()),
            other => other.map_err(|e| e.to_string()),
        };
        let pv = match built {
            Ok(pv) => pv,
            Err(msg) => {
                // Unusable volume: delete it, then try again from scratch.
                if let Some(v) = resp.volume.as_ref().filter(|v| !v.volume_id.is_empty())
                    && let Err(ce) = self.cleanup(&v.volume_id, &request.secrets).await
                {
                    failed(decide::orphaned_volume_text(&msg, &plan.pv_name, &ce));
                    return Err(Wait::on(WaitingFor::Driver));
                }
                self.forget_in_flight(&uid);
                failed(msg);
                return Err(Wait::on(WaitingFor::Driver));
            }
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(claim = %key, pv = %plan.pv_name, "PV already exists")
            }
            Err(e) => {
                // The volume exists; keep it in flight so the next attempt
                // (CreateVolume is idempotent by name) saves the PV.
                failed(format!("error saving PersistentVolume {}: {}", plan.pv_name, api_error_text(&e)));
                return Err(Wait::on(WaitingFor::ApiServer));
            }
        }
        self.forget_in_flight(&uid);
        self.infeasible.lock().forget(&uid);
        tracing::info!(claim = %key, pv = %plan.pv_name, "Provisioned volume");
        if let Some(c) = &self.capacity {
            c.provisioned(&pv, &class);
        }
        if let Some(src) = plan.source.as_ref().filter(|s| s.kind == SourceKind::Snapshot) {
            self.release_snapshot(src, &uid).await;
        }
        self.event_pvc(
            pvc,
            EventType::Normal,
            upstream::REASON_PROVISIONING_SUCCEEDED,
            &format!("Successfully provisioned volume {}", plan.pv_name),
        );
        Ok(Done::Finished)
    }

    pub(super) async fn create_failed(
        &self,
        uid: &str,
        key: &str,
        pvc: &PersistentVolumeClaim,
        sc: &StorageClass,
        status: &tonic::Status,
        failed: &(dyn Fn(String) + Sync),
    ) -> Reconciled {
        let selected = pvc.metadata.annotations.as_ref().and_then(|a| a.get(upstream::ANN_SELECTED_NODE)).is_some();
        let topology = self.driver.has_plugin_service(Svc::VolumeAccessibilityConstraints);
        let class = decide::classify_create_error(status.code(), topology && selected);
        tracing::warn!(claim = %key, error = %status_text(status), class = ?class, "CreateVolume failed");
        let waiting_for = waiting::create_failure_waiting(class, status.code());
        failed(decide::create_error_text(status.code(), &status_text(status)));
        if let (Some(c), Some(sc)) = (&self.capacity, pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref())) {
            c.refresh_class(sc);
        }
        match class {
            CreateFailure::InBackground => Err(Wait::on(waiting_for)),
            CreateFailure::Final | CreateFailure::Reschedule => {
                self.forget_in_flight(uid);
                if class == CreateFailure::Reschedule {
                    return reschedule(&self.client, pvc, waiting_for).await;
                }
                if status.code() == tonic::Code::InvalidArgument {
                    // Infeasible: slow retry (upstream's "slow set"), which
                    // no claim event or earlier delay brings forward.
                    let delay = self.cfg.retry_interval_max;
                    self.infeasible.lock().record(
                        uid,
                        &ClaimKey::of(&pvc.metadata),
                        sc.metadata.name.as_deref().unwrap_or_default(),
                        sc.metadata.resource_version.as_deref().unwrap_or_default(),
                        std::time::Instant::now(),
                        delay,
                    );
                    Err(Wait::on(waiting_for).after(delay))
                } else {
                    Err(Wait::on(waiting_for))
                }
            }
        }
    }
}

/// Hands the claim back to the scheduler and parks it on `parked_on`. The
/// scheduler keeps its choice until the annotation goes, so a failed removal
/// is retried (with the step that led here) rather than parked.
async fn reschedule(client: &Client, pvc: &PersistentVolumeClaim, parked_on: WaitingFor) -> Reconciled {
    match unselect_node(client, pvc).await {
        Ok(()) => Ok(Done::Parked(parked_on)),
        Err(e) => {
            tracing::warn!(error = %e, "Removing the selected-node annotation failed");
            Err(Wait::on(WaitingFor::ApiServer))
        }
    }
}

/// Asks the scheduler for another node: removes `selected-node` (an update
/// where the role grants no patch, as upstream's RBAC).
async fn unselect_node(client: &Client, pvc: &PersistentVolumeClaim) -> Result<(), kube::Error> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), pvc.metadata.namespace.as_deref().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {upstream::ANN_SELECTED_NODE: null}}});
    let name = pvc.metadata.name.as_deref().unwrap_or_default();
    crate::k8s::update_fallback::patch_else_update(&api, name, &Patch::Merge(&patch), |claim| {
        claim.metadata.annotations.as_mut().and_then(|a| a.remove(upstream::ANN_SELECTED_NODE)).is_some()
    })
    .await
}
