//! The one informer cache of the process (invariant: only this module opens
//! watches). A module asks for the kinds it reads, before [`Informers::start`];
//! each kind is listed and watched once however many modules read it, every
//! module reads the same [`Store`], and change handlers fan events out to the
//! modules' work queues.
//!
//! Stored objects are trimmed to what modules read: `managedFields` and the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation are dropped,
//! and kinds only needed for names, labels or annotations are watched as
//! metadata ([`Informers::metadata`]).

use std::{
    any::Any,
    collections::HashMap,
    fmt::Debug,
    sync::{Arc, Mutex, RwLock},
};

use ::kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::ObjectRef,
        watcher::{self, Event},
    },
};
use futures::{StreamExt, future::BoxFuture};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cache::{Applied, Cache, Writer};

/// The annotation kubectl keeps a whole copy of the object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A change seen by the watch.
pub enum Change<'a, K> {
    /// Created or updated (also every object of the initial list).
    Applied(&'a K),
    /// Deleted.
    Deleted(&'a K),
}

type Handler<K> = Arc<dyn Fn(&Change<'_, K>) + Send + Sync>;

struct Shared<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: Cache<K>,
    writer: Mutex<Option<Writer<K>>>,
    handlers: RwLock<Vec<Handler<K>>>,
    synced: watch::Sender<bool>,
}

/// One kind's shared cache.
pub struct Informer<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    shared: Arc<Shared<K>>,
}

impl<K: Resource + Clone + 'static> Clone for Informer<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn clone(&self) -> Self {
        Informer { shared: self.shared.clone() }
    }
}

impl<K: Resource + Clone + 'static> Informer<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    /// The shared read-only store.
    pub fn store(&self) -> Cache<K> {
        self.shared.store.clone()
    }

    /// Calls `handler` for every change, in the watch task: keep it cheap
    /// (enqueue a key).
    pub fn on_change(&self, handler: impl Fn(&Change<'_, K>) + Send + Sync + 'static) {
        self.shared.handlers.write().unwrap_or_else(|e| e.into_inner()).push(Arc::new(handler));
    }

    /// Waits until the initial list is in the store.
    pub async fn synced(&self) {
        let mut rx = self.shared.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Drops what no module reads.
fn trim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

type Keep<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

type Starter = Box<dyn FnOnce(Client, CancellationToken) -> BoxFuture<'static, ()> + Send>;

struct Entry {
    informer: Arc<dyn Any + Send + Sync>,
    kind: String,
    type_name: &'static str,
    starter: Option<Starter>,
}

/// The registry of shared informers.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Informers {
    /// No kinds yet.
    pub fn new(client: Client) -> Self {
        Informers { client, entries: Arc::default() }
    }

    /// The shared informer of full `K` objects (cluster-wide).
    pub fn get<K>(&self) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.get_filtered(|_: &K| true)
    }

    /// Like [`Informers::get`], caching only the objects `keep` accepts (an
    /// object that stops matching leaves the cache, as if deleted). All
    /// modules of a process serve one driver, so they ask for the same
    /// filter; the first request's filter is the one used.
    pub fn get_filtered<K>(&self, keep: impl Fn(&K) -> bool + Send + Sync + 'static) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let kind = format!("{}/{}", K::api_version(&()), K::kind(&()));
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = entries.get(&kind) {
            match e.informer.clone().downcast::<Shared<K>>() {
                Ok(shared) => return Informer { shared },
                // A programming error caught by any test that starts the
                // modules together: two representations of one resource
                // would mean two watches of it.
                Err(_) => panic!("{kind} is already cached as another Rust type; use {}", e.type_name),
            }
        }
        let store = Cache::<K>::default();
        let writer = Writer::new(store.clone());
        let (synced, _) = watch::channel(false);
        let shared = Arc::new(Shared { store, writer: Mutex::new(Some(writer)), handlers: RwLock::default(), synced });
        let for_task = shared.clone();
        let keep: Keep<K> = Arc::new(keep);
        let starter: Starter =
            Box::new(move |client, shutdown| Box::pin(run_watch::<K>(client, for_task, keep, shutdown)));
        let entry = Entry {
            informer: shared.clone(),
            kind: kind.clone(),
            type_name: std::any::type_name::<K>(),
            starter: Some(starter),
        };
        entries.insert(kind, entry);
        Informer { shared }
    }

    /// The shared informer of `K`'s metadata only (names, labels, annotations).
    pub fn metadata<K>(&self) -> Informer<PartialObjectMeta<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.get::<PartialObjectMeta<K>>()
    }

    /// The kinds watched, for tests and logs (`v1/PersistentVolume`, ...).
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<_> =
            self.entries.lock().unwrap_or_else(|e| e.into_inner()).values().map(|e| e.kind.clone()).collect();
        k.sort();
        k
    }

    /// Starts one watch per kind requested so far; they run until `shutdown`.
    /// Kinds requested later are started by a later call.
    pub fn start(&self, shutdown: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .values_mut()
            .filter_map(|e| {
                let starter = e.starter.take()?;
                tracing::info!(kind = %e.kind, "Starting watch");
                Some(tokio::spawn(starter(self.client.clone(), shutdown.clone())))
            })
            .collect()
    }
}

/// Drops objects the modules do not read: during the initial list they are
/// skipped; later an object that stops matching is turned into a delete,
/// and changes of objects that never matched are dropped.
fn only_kept<K>(keep: &Keep<K>, cached: impl Fn(&K) -> bool, event: Event<K>) -> Option<Event<K>> {
    match event {
        Event::InitApply(o) if !keep(&o) => None,
        Event::Apply(o) if !keep(&o) => cached(&o).then_some(Event::Delete(o)),
        Event::Delete(o) if !keep(&o) && !cached(&o) => None,
        other => Some(other),
    }
}

async fn run_watch<K>(client: Client, shared: Arc<Shared<K>>, keep: Keep<K>, shutdown: CancellationToken)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let Some(mut writer) = shared.writer.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
    let reader = shared.store.clone();
    let api: Api<K> = Api::all(client);
    let stream =
        watcher::watcher(api, watcher::Config::default()).default_backoff().modify(trim::<K>).filter_map(move |e| {
            let (keep, store) = (keep.clone(), reader.clone());
            let cached = move |o: &K| store.get(&ObjectRef::from_obj(o)).is_some();
            async move { e.map(|e| only_kept(&keep, cached, e)).transpose() }
        });
    let mut stream = std::pin::pin!(stream);
    let kind = K::kind(&());
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            n = stream.next() => n,
        };
        let Some(event) = next else { return };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(kind = %kind, error = %e, "Watch failed; retrying with backoff");
                continue;
            }
        };
        let init_done = matches!(event, Event::InitDone);
        // Stored first, then announced: a handler's reader finds the object.
        let applied = writer.apply(event);
        if init_done {
            shared.synced.send_replace(true);
            tracing::info!(kind = %kind, objects = shared.store.len(), "Watch synced");
        }
        let Some(applied) = applied else { continue };
        let handlers = shared.handlers.read().unwrap_or_else(|e| e.into_inner()).clone();
        let change = match &applied {
            Applied::Stored(o) => Change::Applied(o.as_ref()),
            Applied::Removed(o) => Change::Deleted(o),
        };
        for h in handlers {
            h(&change);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::PersistentVolumeClaim,
        apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta},
    };

    use super::*;

    #[test]
    fn trim_drops_managed_fields_and_last_applied() {
        let mut pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("a".into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                annotations: Some(
                    [(LAST_APPLIED.to_string(), "{...}".to_string()), ("keep".to_string(), "me".to_string())].into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        trim(&mut pvc);
        assert_eq!(pvc.metadata.managed_fields, None);
        let ann = pvc.metadata.annotations.expect("annotations");
        assert_eq!(ann.len(), 1);
        assert_eq!(ann["keep"], "me");
    }

    #[test]
    fn only_kept_table() {
        let pvc = |name: &str| PersistentVolumeClaim {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        };
        let keep: Keep<PersistentVolumeClaim> = Arc::new(|c| c.metadata.name.as_deref() == Some("mine"));
        let kind = |e: Option<Event<PersistentVolumeClaim>>| match e {
            None => "dropped",
            Some(Event::Apply(_)) => "apply",
            Some(Event::InitApply(_)) => "init-apply",
            Some(Event::Delete(_)) => "delete",
            Some(_) => "other",
        };
        let table = [
            // (event, name, in the cache, expected)
            ("init", "mine", false, "init-apply"),
            ("init", "other", false, "dropped"),
            ("apply", "mine", true, "apply"),
            ("apply", "other", true, "delete"),
            ("apply", "other", false, "dropped"),
            ("delete", "other", false, "dropped"),
            ("delete", "other", true, "delete"),
            ("delete", "mine", true, "delete"),
        ];
        for (ev, name, cached, want) in table {
            let o = pvc(name);
            let e = match ev {
                "init" => Event::InitApply(o),
                "apply" => Event::Apply(o),
                _ => Event::Delete(o),
            };
            assert_eq!(kind(only_kept(&keep, |_| cached, e)), want, "{ev} {name} cached={cached}");
        }
    }
}
