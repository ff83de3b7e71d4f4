//! The health monitor's decisions, without I/O: which form and mode the
//! driver's capabilities call for (or what is missing), what a driver's
//! answer means, and what to write for it: an event (the released form) or
//! the claim's `status.healthStatus` (the CSI 1.13 form on Kubernetes 1.37+).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{compat::health_monitor as upstream, csi::HealthCapabilities};

/// How the driver reports health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// CSI <= 1.12: `VolumeCondition` in ListVolumes / ControllerGetVolume.
    Condition,
    /// CSI 1.13: ControllerListVolumeHealth / ControllerGetVolumeHealth.
    Health,
}

/// How volumes are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One paginated list per `--list-volumes-interval`.
    List,
    /// One call per bound volume per `--monitor-interval`.
    Get,
}

/// The form and mode the capabilities call for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub form: Form,
    pub mode: Mode,
    /// List mode can confirm, one call per volume, a volume that was
    /// abnormal and is missing from the list (the 1.13 form with both RPCs).
    pub confirm_missing: bool,
}

/// The plan for a driver, or the start-up error naming what it lacks.
/// The 1.13 RPCs win when the driver offers both forms.
pub fn plan(offer: HealthCapabilities) -> Result<Plan, String> {
    if !offer.controller_service {
        return Err(format!("{}: the health monitor needs CONTROLLER_SERVICE", upstream::ERR_NO_CONTROLLER_SERVICE));
    }
    if offer.list_volume_health || offer.get_volume_health {
        let mode = if offer.list_volume_health { Mode::List } else { Mode::Get };
        let confirm_missing = mode == Mode::List && offer.get_volume_health;
        return Ok(Plan { form: Form::Health, mode, confirm_missing });
    }
    let mut missing = Vec::new();
    if !offer.list_volumes && !offer.get_volume {
        missing.push("LIST_VOLUMES or GET_VOLUME");
    }
    if !offer.volume_condition {
        missing.push("VOLUME_CONDITION");
    }
    if !missing.is_empty() {
        return Err(format!(
            "CSI driver does not report volume health: it lacks {} (CSI <= 1.12), and LIST_VOLUME_HEALTH or \
             GET_VOLUME_HEALTH (CSI 1.13)",
            missing.join(" and ")
        ));
    }
    let mode = if offer.list_volumes { Mode::List } else { Mode::Get };
    Ok(Plan { form: Form::Condition, mode, confirm_missing: false })
}

/// One adverse condition of a volume, as `status.healthStatus` spells it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Condition {
    /// `Degraded`, `Inaccessible` or `DataLoss`.
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// What the driver said about one volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    Healthy,
    /// The conditions (sorted, at most [`upstream::MAX_HEALTH_CONDITIONS`]) and
    /// the text an event carries.
    Abnormal {
        conditions: Vec<Condition>,
        message: String,
    },
}

/// The CSI 1.13 status of a condition: `DEGRADED` and unknown values are
/// `Degraded` (a CO ignores nothing: an unknown adverse condition is still
/// one).
pub fn status_name(status: crate::csi::HealthStatus) -> &'static str {
    use crate::csi::HealthStatus as S;
    match status {
        S::Inaccessible => upstream::STATUS_INACCESSIBLE,
        S::DataLoss => upstream::STATUS_DATA_LOSS,
        S::Degraded | S::Unknown => upstream::STATUS_DEGRADED,
    }
}

/// A v1.12 `VolumeCondition`: abnormal gives one `Degraded` condition with
/// the driver's message (the event carries the message alone, as upstream).
/// A volume reported without a condition says nothing (`None`).
pub fn from_condition(abnormal: Option<bool>, message: &str) -> Option<Observed> {
    Some(match abnormal? {
        false => Observed::Healthy,
        true => Observed::Abnormal {
            conditions: vec![Condition {
                status: upstream::STATUS_DEGRADED.into(),
                reason: String::new(),
                message: message.into(),
            }],
            message: message.into(),
        },
    })
}

/// A condition's reason as the API accepts it (a CamelCase word:
/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024 characters, and
/// present: it keys the list with the status). The driver's reason with
/// other characters dropped (a dropped space capitalises the next letter:
/// "no path" becomes "NoPath"); none left: the status itself.
pub fn condition_reason(raw: &str, status: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in raw.chars() {
        let keep = c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':');
        if !keep || (out.is_empty() && !c.is_ascii_alphabetic()) {
            upper = true;
            continue;
        }
        out.push(if upper { c.to_ascii_uppercase() } else { c });
        upper = false;
    }
    out.truncate(1024);
    while out.ends_with([',', ':']) {
        out.pop();
    }
    if out.is_empty() { status.to_string() } else { out }
}

/// A CSI 1.13 `VolumeHealth`: no entries is healthy.
pub fn from_health(entries: impl IntoIterator<Item = Condition>) -> Observed {
    let mut conditions: Vec<Condition> =
        entries.into_iter().map(|c| Condition { reason: condition_reason(&c.reason, &c.status), ..c }).collect();
    if conditions.is_empty() {
        return Observed::Healthy;
    }
    conditions.sort();
    conditions.dedup_by(|a, b| a.status == b.status && a.reason == b.reason);
    conditions.truncate(upstream::MAX_HEALTH_CONDITIONS);
    let message = conditions
        .iter()
        .map(|c| match c.reason == c.status {
            true => format!("{}: {}", c.status, c.message),
            false => format!("{} ({}): {}", c.status, c.reason, c.message),
        })
        .collect::<Vec<_>>()
        .join("; ");
    Observed::Abnormal { conditions, message }
}

/// What the events form last said about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reported {
    Healthy,
    Abnormal(String),
}

/// An event to publish on the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventOut {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The event for `observed` given what was last reported (`None`: nothing
/// known), and what is reported after it. Nothing is written while nothing
/// changes (upstream repeats the abnormal event every pass, and the normal
/// one while an old abnormal event is cached); a healthy volume never
/// reported abnormal gets no event.
pub fn event_for(previous: Option<&Reported>, observed: &Observed) -> (Option<EventOut>, Reported) {
    match (previous, observed) {
        (Some(Reported::Abnormal(_)), Observed::Healthy) => (
            Some(EventOut {
                warning: false,
                reason: upstream::REASON_NORMAL,
                message: upstream::MESSAGE_NORMAL.into(),
            }),
            Reported::Healthy,
        ),
        (_, Observed::Healthy) => (None, Reported::Healthy),
        (Some(Reported::Abnormal(m)), Observed::Abnormal { message, .. }) if m == message => {
            (None, Reported::Abnormal(m.clone()))
        }
        (_, Observed::Abnormal { message, .. }) => (
            Some(EventOut { warning: true, reason: upstream::REASON_ABNORMAL, message: message.clone() }),
            Reported::Abnormal(message.clone()),
        ),
    }
}

/// One of this monitor's past events about a claim (for [`recall`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastEvent {
    pub claim_uid: String,
    pub reason: String,
    pub message: String,
    /// Last time it was seen (RFC 3339 sorts as text).
    pub last_seen: String,
}

/// What was last reported per claim UID, from this monitor's own events
/// (after a restart or a failover: no duplicate abnormal event, and the
/// recovery event still comes).
pub fn recall(events: &[PastEvent]) -> HashMap<String, Reported> {
    let mut latest: HashMap<&str, &PastEvent> = HashMap::new();
    for e in events {
        if e.reason != upstream::REASON_ABNORMAL && e.reason != upstream::REASON_NORMAL {
            continue;
        }
        let newer = latest.get(e.claim_uid.as_str()).is_none_or(|l| e.last_seen >= l.last_seen);
        if newer {
            latest.insert(&e.claim_uid, e);
        }
    }
    latest
        .into_iter()
        .map(|(uid, e)| {
            let r = match e.reason == upstream::REASON_ABNORMAL {
                true => Reported::Abnormal(e.message.clone()),
                false => Reported::Healthy,
            };
            (uid.to_string(), r)
        })
        .collect()
}

/// A claim's `status.healthStatus` (Kubernetes 1.37+).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    #[serde(default)]
    pub health_conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

fn same_set(a: &[Condition], b: &[Condition]) -> bool {
    let keys = |c: &[Condition]| {
        let mut k: Vec<(String, String)> = c.iter().map(|c| (c.status.clone(), c.reason.clone())).collect();
        k.sort();
        k
    };
    keys(a) == keys(b)
}

/// The merge patch of the claim's status for `observed`, or `None` when
/// the claim already says it. Healthy clears the field (`null`); the
/// transition time moves only when the set of (status, reason) changes.
pub fn status_patch(current: Option<&HealthStatus>, observed: &Observed, now: &str) -> Option<Value> {
    let current = current.filter(|c| !c.health_conditions.is_empty());
    match observed {
        Observed::Healthy => current.map(|_| json!({ "status": { "healthStatus": null } })),
        Observed::Abnormal { conditions, .. } => {
            if current.is_some_and(|c| {
                let mut have = c.health_conditions.clone();
                have.sort();
                &have == conditions
            }) {
                return None;
            }
            let time = match current {
                Some(c) if same_set(&c.health_conditions, conditions) => {
                    c.last_transition_time.clone().unwrap_or_else(|| now.to_string())
                }
                _ => now.to_string(),
            };
            Some(json!({ "status": { "healthStatus": {
                "healthConditions": conditions,
                "lastTransitionTime": time,
            } } }))
        }
    }
}

#[cfg(test)]
mod tests;
