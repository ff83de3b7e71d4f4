//! What `csi-sidecar explain` says about an object (pure): from the facts
//! read from the API and csi-sidecar's debug endpoint, whether the object
//! is done, what blocks it, and what happens next.

use crate::debug::{
    Phase, WaitingFor,
    query::{ObjectView, Page},
};

/// The API's view of a claim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claim {
    /// `namespace/name`.
    pub key: String,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `spec.volumeName`.
    pub volume_name: Option<String>,
    /// `spec.storageClassName`.
    pub class_name: Option<String>,
    /// `volume.kubernetes.io/selected-node`.
    pub selected_node: Option<String>,
    /// The deletion has begun (finalizers left).
    pub deleting: Option<Vec<String>>,
}

/// The claim's StorageClass, as read.
#[derive(Clone, Debug, PartialEq)]
pub enum Class {
    /// The claim names none.
    None,
    /// It does not exist.
    Missing(String),
    /// It exists.
    Found {
        /// Its name.
        name: String,
        /// Its provisioner.
        provisioner: String,
        /// `WaitForFirstConsumer` or not.
        wait_for_consumer: bool,
    },
}

/// The API's view of a VolumeAttachment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attachment {
    /// Its name.
    pub name: String,
    /// `spec.attacher`.
    pub attacher: String,
    /// `spec.nodeName`.
    pub node: String,
    /// The PV it attaches.
    pub pv: Option<String>,
    /// `status.attached`.
    pub attached: bool,
    /// `status.attachError.message`.
    pub attach_error: Option<String>,
    /// `status.detachError.message`.
    pub detach_error: Option<String>,
    /// Being deleted (detach).
    pub deleting: bool,
}

/// The API's view of a VolumeSnapshot and its content.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// `namespace/name`.
    pub key: String,
    /// `status.readyToUse`.
    pub ready: bool,
    /// `status.boundVolumeSnapshotContentName`.
    pub content: Option<String>,
    /// `status.error.message`.
    pub error: Option<String>,
    /// The class's driver, when the class was read.
    pub class_driver: Option<String>,
    /// `spec.source.persistentVolumeClaimName`.
    pub source_claim: Option<String>,
    /// The source claim is Bound (read only while there is no content).
    pub source_claim_bound: bool,
    /// The content's `status.error.message`.
    pub content_error: Option<String>,
    /// The content's `spec.driver`.
    pub content_driver: Option<String>,
    /// Being deleted.
    pub deleting: bool,
}

/// An event about the object (the newest first).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// `Normal` or `Warning`.
    pub kind: String,
    /// Its reason.
    pub reason: String,
    /// Its text.
    pub message: String,
    /// How often it happened.
    pub count: i32,
}

/// What the debug endpoint said.
#[derive(Clone, Debug, PartialEq)]
pub enum Sidecar {
    /// No endpoint was given.
    NotAsked,
    /// It did not answer (the text says why).
    Unreachable(String),
    /// Its answers (one per endpoint asked).
    Pages(Vec<Page>),
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The object is done.
    pub done: bool,
    /// What blocks it and what happens next (first line first).
    pub lines: Vec<String>,
}

impl Verdict {
    fn done(line: String) -> Self {
        Verdict { done: true, lines: vec![line] }
    }

    fn waits(line: String) -> Self {
        Verdict { done: false, lines: vec![line] }
    }

    /// The exit status: 0 done, 1 waits.
    pub fn exit_code(&self) -> u8 {
        if self.done { 0 } else { 1 }
    }
}

/// The driver the sidecar serves, from its pages.
fn served_driver(sidecar: &Sidecar) -> Option<&str> {
    match sidecar {
        Sidecar::Pages(p) => p.iter().find_map(|p| p.driver.as_deref()),
        _ => None,
    }
}

/// The entry the sidecar holds for (kind, namespace, name).
fn entry<'a>(sidecar: &'a Sidecar, kind: &'a str, key: &'a str) -> Option<&'a ObjectView> {
    entries(sidecar, kind, key).find(|o| Some(o.module.as_str()) == module_for(kind))
}

/// Every entry any module holds for (kind, namespace, name).
fn entries<'a>(sidecar: &'a Sidecar, kind: &'a str, key: &'a str) -> impl Iterator<Item = &'a ObjectView> + 'a {
    let pages: &[Page] = match sidecar {
        Sidecar::Pages(p) => p,
        _ => &[],
    };
    let (ns, name) = crate::debug::query::split_key(key);
    pages
        .iter()
        .flat_map(|p| &p.objects)
        .filter(move |o| o.kind == kind && o.name == name && o.namespace.as_deref() == ns)
}

/// What the asked endpoints say of `module` itself: not run there, still
/// starting or filling its cache, or not leading.
fn module_state(sidecar: &Sidecar, module: &str) -> Option<String> {
    let Sidecar::Pages(pages) = sidecar else { return None };
    let views: Vec<&crate::debug::query::ModuleView> =
        pages.iter().flat_map(|p| &p.modules).filter(|m| m.module == module).collect();
    let Some(furthest) = views.iter().map(|m| m.phase).max() else {
        return Some(format!(
            "the csi-sidecar asked does not run the {module} module: give the --endpoint of the one that does"
        ));
    };
    match furthest {
        Phase::Starting => Some(format!(
            "csi-sidecar's {module} is still starting: it waits for its CSI driver to answer{}",
            if pages.iter().any(|p| p.driver.is_some()) { "" } else { " (no driver discovered yet)" }
        )),
        Phase::Standby => not_leader(sidecar, module),
        Phase::SyncingCache => Some(format!(
            "csi-sidecar's {module} is filling its cache from the API; it acts on objects once that is done"
        )),
        Phase::Running => None,
    }
}

/// "this replica is not the leader ..." when the module is led elsewhere:
/// no endpoint asked runs it as the leader (or without leader election).
fn not_leader(sidecar: &Sidecar, module: &str) -> Option<String> {
    let Sidecar::Pages(pages) = sidecar else { return None };
    let mut views = pages.iter().flat_map(|p| &p.modules).filter(|m| m.module == module);
    if views.clone().any(|m| m.leader.as_ref().is_none_or(|l| l.leading)) {
        return None;
    }
    let leader = views.next()?.leader.as_ref()?;
    Some(match &leader.holder {
        Some(h) => format!(
            "this replica is not the leader (the Lease {} is held by {h}): ask the leader's debug endpoint",
            leader.lease
        ),
        None => format!("this replica is not the leader, and no holder of the Lease {} is known yet", leader.lease),
    })
}

/// "next attempt in 12 s" (rounded up), or none.
fn next_attempt(o: &ObjectView) -> Option<String> {
    o.next_retry_in_seconds.map(|s| format!("next attempt in {} s", s.ceil() as u64))
}

/// A CSI method's short name (`/csi.v1.Controller/CreateVolume` → `CreateVolume`).
fn short_method(m: &str) -> &str {
    m.rsplit('/').next().unwrap_or(m)
}

/// The call a module makes for a kind, named in failure sentences.
fn call_of(o: &ObjectView, deleting: bool) -> &'static str {
    if o.module == "resizer" {
        return if o.queue.ends_with("-modify") { "ControllerModifyVolume" } else { "ControllerExpandVolume" };
    }
    match (o.kind.as_str(), deleting) {
        ("PersistentVolumeClaim", _) => "CreateVolume",
        ("PersistentVolume", _) => "DeleteVolume",
        ("VolumeAttachment", false) => "ControllerPublishVolume",
        ("VolumeAttachment", true) => "ControllerUnpublishVolume",
        ("VolumeSnapshotContent", false) => "CreateSnapshot",
        ("VolumeSnapshotContent", true) => "DeleteSnapshot",
        _ => "the CSI call",
    }
}

/// The sentence for what the sidecar holds about an object.
pub fn held(o: &ObjectView, deleting: bool, node: Option<&str>) -> String {
    let last = o.last_error.as_deref().map(|e| format!(" (last: {e})")).unwrap_or_default();
    let times = |n: u32| if n == 1 { "once".to_string() } else { format!("{n} times") };
    let mut s = match o.waiting_for {
        WaitingFor::Driver if o.attempts > 0 => {
            format!("{} failed {}{last}", call_of(o, deleting), times(o.attempts))
        }
        WaitingFor::Driver => format!("waiting for the CSI driver{last}"),
        WaitingFor::Retry => format!("the last attempt failed{last}"),
        WaitingFor::Scheduler => "WaitForFirstConsumer: no pod has been scheduled with this claim yet".to_string(),
        WaitingFor::Infeasible => format!(
            "the driver called the request infeasible{last}; it is not retried before the delay unless the StorageClass changes"
        ),
        WaitingFor::Class => format!("the StorageClass cannot be used{last}"),
        WaitingFor::Secret => format!("a secret the class names is missing or cannot be read{last}"),
        WaitingFor::DataSource => format!("the data source cannot be used yet{last}"),
        WaitingFor::Populator => "its dataSourceRef is left to an external volume populator".to_string(),
        WaitingFor::SnapshotReady => match o.kind.as_str() {
            "VolumeSnapshotContent" | "VolumeGroupSnapshotContent" => {
                format!("the CSI driver says the snapshot is not ready to use yet{last}")
            }
            _ => format!("the source VolumeSnapshot is not ready to use yet{last}"),
        },
        WaitingFor::Node => format!("the node is not ready for the driver yet (no CSINode or node ID){last}"),
        WaitingFor::Topology => format!("the accessibility requirements cannot be built yet{last}"),
        WaitingFor::VolumeInUse => {
            format!("the volume is in use and the driver cannot expand it online: waiting for the pods to stop{last}")
        }
        WaitingFor::ApiServer => format!("writing the result to the API failed{last}"),
        WaitingFor::Dependent => format!("waiting for another object to change first{last}"),
    };
    if let Some(call) = &o.csi_call {
        s.push_str(&format!("; {} in flight for {} s", short_method(&call.method), call.seconds.round() as u64));
    } else if let Some(next) = next_attempt(o) {
        s.push_str("; ");
        s.push_str(&next);
        if let Some(n) = node {
            s.push_str(&format!(" on {n}"));
        }
    }
    s
}

/// The newest Warning, as a line.
fn last_warning(events: &[Event]) -> Option<String> {
    let e = events.iter().find(|e| e.kind == "Warning")?;
    let times = if e.count > 1 { format!(" ({} times)", e.count) } else { String::new() };
    Some(format!("last warning: {}{times}: {}", e.reason, e.message))
}

/// What the sidecar adds when it holds nothing, or could not be asked.
fn sidecar_note(sidecar: &Sidecar, events: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    match sidecar {
        Sidecar::NotAsked => out.push("csi-sidecar was not asked (give --endpoint for its own state)".to_string()),
        Sidecar::Unreachable(why) => out.push(format!("csi-sidecar's debug endpoint did not answer: {why}")),
        Sidecar::Pages(_) => {}
    }
    out.extend(last_warning(events));
    out
}

/// Whether a provisioner name is not this sidecar's driver.
fn other_driver<'a>(wanted: &'a str, sidecar: &Sidecar) -> Option<(&'a str, Option<String>)> {
    match served_driver(sidecar) {
        Some(d) if d != wanted => Some((wanted, Some(d.to_string()))),
        _ => None,
    }
}

/// A claim.
pub fn claim(c: &Claim, class: &Class, sidecar: &Sidecar, events: &[Event]) -> Verdict {
    if let Some(finalizers) = &c.deleting {
        let mut v = Verdict::waits(format!("the claim is being deleted; finalizers left: {}", finalizers.join(", ")));
        v.lines.extend(last_warning(events));
        return v;
    }
    match (c.phase.as_deref(), c.volume_name.as_deref()) {
        (Some("Bound"), Some(pv)) => {
            let bound = format!("bound to PersistentVolume {pv}");
            // A bound claim may still wait for an expansion or a modification.
            let changes: Vec<String> = entries(sidecar, "PersistentVolumeClaim", &c.key)
                .filter(|o| o.module == "resizer")
                .map(|o| {
                    format!(
                        "{}: {}",
                        if o.queue.ends_with("-modify") { "modify" } else { "resize" },
                        held(o, false, None)
                    )
                })
                .collect();
            if changes.is_empty() {
                return Verdict::done(bound);
            }
            let mut v = Verdict::waits(bound);
            v.lines.extend(changes);
            return v;
        }
        (Some("Lost"), pv) => {
            return Verdict::waits(format!(
                "Lost: its PersistentVolume {} no longer exists; the claim cannot be used",
                pv.unwrap_or("?")
            ));
        }
        (_, Some(pv)) => {
            return Verdict::waits(format!(
                "it names PersistentVolume {pv}: waiting for the PersistentVolume controller to bind them"
            ));
        }
        _ => {}
    }
    match class {
        Class::None => {
            return Verdict::waits(
                "no StorageClass: the claim waits for a matching PersistentVolume; no provisioner makes one"
                    .to_string(),
            );
        }
        Class::Missing(name) => {
            let mut v = Verdict::waits(format!("its StorageClass \"{name}\" does not exist"));
            v.lines.extend(last_warning(events));
            return v;
        }
        Class::Found { provisioner, wait_for_consumer, .. } => {
            if let Some((wanted, Some(served))) = other_driver(provisioner, sidecar) {
                return Verdict::waits(format!(
                    "not handled here: the claim asks for {wanted}, this csi-sidecar serves {served}"
                ));
            }
            if *wait_for_consumer && c.selected_node.is_none() {
                return Verdict::waits(
                    "WaitForFirstConsumer: no pod has been scheduled with this claim yet".to_string(),
                );
            }
        }
    }
    let mut v = Verdict { done: false, lines: Vec::new() };
    v.lines.extend(module_state(sidecar, "provisioner"));
    match entry(sidecar, "PersistentVolumeClaim", &c.key) {
        Some(o) => v.lines.push(held(o, false, c.selected_node.as_deref())),
        None if matches!(sidecar, Sidecar::Pages(_)) && v.lines.is_empty() => v
            .lines
            .push("csi-sidecar holds nothing for it: provisioning has not failed; it is queued or in progress".into()),
        None => {}
    }
    v.lines.extend(sidecar_note(sidecar, events));
    if v.lines.is_empty() {
        v.lines.push("pending, with no warning yet".to_string());
    }
    v
}

/// A VolumeAttachment.
pub fn attachment(a: &Attachment, sidecar: &Sidecar, events: &[Event]) -> Verdict {
    if let Some((wanted, Some(served))) = other_driver(&a.attacher, sidecar) {
        return Verdict::waits(format!(
            "not handled here: the attachment is for {wanted}, this csi-sidecar serves {served}"
        ));
    }
    if a.attached && !a.deleting {
        return Verdict::done(format!("attached to node {}", a.node));
    }
    let mut v = Verdict::waits(if a.deleting {
        format!("being detached from node {}", a.node)
    } else {
        format!("not attached to node {} yet", a.node)
    });
    v.lines.extend(module_state(sidecar, "attacher"));
    if let Some(o) = entry(sidecar, "VolumeAttachment", &a.name) {
        v.lines.push(held(o, a.deleting, None));
    }
    let error = if a.deleting { &a.detach_error } else { &a.attach_error };
    if let Some(e) = error {
        v.lines.push(format!("the attachment's status says: {e}"));
    }
    v.lines.extend(sidecar_note(sidecar, events));
    v
}

/// A VolumeSnapshot.
pub fn snapshot(s: &Snapshot, sidecar: &Sidecar, events: &[Event]) -> Verdict {
    let driver = s.content_driver.as_deref().or(s.class_driver.as_deref());
    if let Some((wanted, Some(served))) = driver.and_then(|d| other_driver(d, sidecar)) {
        return Verdict::waits(format!(
            "not handled here: the snapshot is for {wanted}, this csi-sidecar serves {served}"
        ));
    }
    if s.ready && !s.deleting {
        return Verdict::done(format!("ready to use (content {})", s.content.as_deref().unwrap_or("?")));
    }
    let mut v = Verdict::waits(match (&s.content, s.deleting) {
        (_, true) => "being deleted".to_string(),
        (None, false) => match &s.source_claim {
            Some(c) if s.source_claim_bound => format!(
                "no VolumeSnapshotContent yet: the source claim {c} is bound; the snapshot-controller has not made one yet"
            ),
            Some(c) => format!(
                "no VolumeSnapshotContent yet: the snapshot-controller makes one once the source claim {c} is bound"
            ),
            None => "no VolumeSnapshotContent bound yet (the snapshot-controller's step)".to_string(),
        },
        (Some(c), false) => format!("not ready to use yet (content {c})"),
    });
    v.lines.extend(module_state(sidecar, "snapshotter"));
    if let Some(o) = s.content.as_deref().and_then(|c| entry(sidecar, "VolumeSnapshotContent", c)) {
        v.lines.push(held(o, s.deleting, None));
    }
    for e in [&s.content_error, &s.error].into_iter().flatten() {
        if !v.lines.iter().any(|l| l.contains(e.as_str())) {
            v.lines.push(format!("its status says: {e}"));
        }
    }
    v.lines.extend(sidecar_note(sidecar, events));
    v
}

/// The module of csi-sidecar whose ledger answers for `kind` (its row
/// says so; the endpoint query asks it too).
pub fn module_for(kind: &str) -> Option<&'static str> {
    crate::modules::module_of_kind(kind)
}
