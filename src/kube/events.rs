//! Kubernetes Events (`core/v1`, like upstream's client-go recorder, so the
//! upstream RBAC rule for `events` keeps working), with client-go's
//! aggregation (a repeat of the same object, reason and message within 10
//! minutes bumps `count` instead of creating a new Event) and its spam filter
//! (per object: a burst of 25, then one every 5 minutes).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ::kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
};
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};

use super::client::TokenBucket;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
const SPAM_BURST: u32 = 25;
const SPAM_QPS: f64 = 1.0 / 300.0;

#[derive(Clone, PartialEq, Eq, Hash)]
struct AggregateKey {
    uid: String,
    reason: String,
    message: String,
    kind: EventType,
}

struct Seen {
    event_name: String,
    namespace: String,
    count: i32,
    first: Time,
    at: Instant,
}

/// Publishes Events for one component. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    source: EventSource,
    seen: Arc<Mutex<HashMap<AggregateKey, Seen>>>,
    spam: Arc<Mutex<HashMap<String, Arc<TokenBucket>>>>,
    /// One write at a time per aggregate key: a repeat published while the
    /// first Event is still being created waits for it and patches its
    /// count, instead of creating a second Event.
    writing: Arc<Mutex<HashMap<AggregateKey, Arc<tokio::sync::Mutex<()>>>>>,
}

/// A reference to `obj` for `involvedObject`.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

impl Recorder {
    /// Events from `component` (upstream: `external-provisioner`, ...) on `host`.
    pub fn new(client: Client, component: &str, host: &str) -> Self {
        Recorder {
            client,
            source: EventSource { component: Some(component.to_string()), host: Some(host.to_string()) },
            seen: Arc::default(),
            spam: Arc::default(),
            writing: Arc::default(),
        }
    }

    /// Records an event in the background; failures are logged, never fatal.
    pub fn publish(&self, object: ObjectReference, kind: EventType, reason: &str, message: &str) {
        let uid = object.uid.clone().unwrap_or_default();
        let bucket = self
            .spam
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.clone())
            .or_insert_with(|| Arc::new(TokenBucket::new(SPAM_QPS, SPAM_BURST)))
            .clone();
        if bucket.try_take(Instant::now()).is_err() {
            tracing::debug!(reason, object = ?object.name, "Event dropped by the spam filter");
            return;
        }
        let key = AggregateKey { uid, reason: reason.to_string(), message: message.to_string(), kind };
        let this = self.clone();
        let (reason, message) = (reason.to_string(), message.to_string());
        let lock = {
            let mut writing = this.writing.lock().unwrap_or_else(|e| e.into_inner());
            // Locks nobody holds or waits for are dropped.
            writing.retain(|_, l| Arc::strong_count(l) > 1);
            writing.entry(key.clone()).or_default().clone()
        };
        tokio::spawn(async move {
            let _turn = lock.lock().await;
            if let Err(e) = this.write(key, object, kind, &reason, &message).await {
                tracing::warn!(reason, error = %e, "Cannot write event");
            }
        });
    }

    async fn write(
        &self,
        key: AggregateKey,
        object: ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ::kube::Error> {
        let now = Time(Timestamp::now());
        let repeat = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|_, s| s.at.elapsed() < AGGREGATE_WINDOW);
            seen.get_mut(&key).map(|s| {
                s.count += 1;
                s.at = Instant::now();
                (s.event_name.clone(), s.namespace.clone(), s.count, s.first.clone())
            })
        };
        if let Some((name, namespace, count, _)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch = serde_json::json!({"count": count, "lastTimestamp": now});
            if api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                return Ok(());
            }
            // The event expired or was deleted: write a new one.
        }
        let namespace = object.namespace.clone().unwrap_or_else(|| "default".to_string());
        let nanos = Timestamp::now().as_nanosecond();
        let name = format!("{}.{:x}", object.name.clone().unwrap_or_default(), nanos);
        let event = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            involved_object: object,
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(kind.as_str().to_string()),
            source: Some(self.source.clone()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            count: Some(1),
            event_time: None::<MicroTime>,
            reporting_component: self.source.component.clone(),
            reporting_instance: self.source.host.clone(),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &event).await?;
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Seen { event_name: name, namespace, count: 1, first: now, at: Instant::now() });
        Ok(())
    }
}
