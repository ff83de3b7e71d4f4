//! The one informer cache of the process (invariant: only this module opens
//! watches). A module asks for the kinds it reads; each kind is listed and
//! watched once however many modules read it, and change handlers fan
//! events out to the modules' work queues.
//!
//! client-go's contract, which upstream's controllers rely on, holds here:
//! - handlers run after the store holds the change, so a handler's reader
//!   finds what it was told about;
//! - a relist (after 410 Gone) announces, once it is complete, every object
//!   added, changed or gone compared with the content it replaced;
//! - a handler registered late first sees every object already cached;
//! - periodic resync ([`Informer::on_change_with_resync`]);
//! - a watch stream that ends, or a watch task that dies, is opened again.
//!
//! Modules may ask for one kind with different filters ([`Informers::view`]):
//! the store holds the union, and each view (by name) sees, and is told
//! about, only what its own filter keeps. A filter added after the watch
//! started makes the watch relist, so the new view's objects are listed.
//!
//! Stored objects are trimmed to what modules read: `managedFields` and the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation are dropped,
//! and kinds only needed for names, labels or annotations are watched as
//! metadata ([`Informers::metadata`]).

use parking_lot::{Mutex, RwLock};
use std::{any::Any, collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use futures::{StreamExt, future::BoxFuture, stream::BoxStream};
use kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::cache::{Cache, Keep, Transition, Writer};

use crate::compat::api::LAST_APPLIED;

/// Pause before a watch that ended or died is opened again.
const REOPEN_DELAY: Duration = Duration::from_secs(1);

/// A change as one view sees it.
pub enum Change<'a, K> {
    /// New to the view: listed, created, started matching its filter, or
    /// replayed to a handler registered after it was cached.
    Added(&'a K),
    /// Changed (a new resourceVersion).
    Updated {
        /// The version the view held before.
        old: &'a K,
        /// The version it holds now.
        new: &'a K,
    },
    /// Periodic resync of an unchanged object.
    Resync(&'a K),
    /// Gone from the view (deleted, or stopped matching): its last version.
    Deleted(&'a K),
}

impl<K> Change<'_, K> {
    /// The object concerned (for `Updated`, its new version).
    pub fn object(&self) -> &K {
        match self {
            Change::Added(o) | Change::Resync(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }

    /// Whether the object left the view.
    pub fn is_deleted(&self) -> bool {
        matches!(self, Change::Deleted(_))
    }
}

/// What one store transition means to a view with filter `keep` (pure).
fn view_change<'a, K>(keep: &dyn Fn(&K) -> bool, old: Option<&'a K>, new: Option<&'a K>) -> Option<Change<'a, K>> {
    match (old.filter(|o| keep(o)), new.filter(|n| keep(n))) {
        (None, None) => None,
        (None, Some(n)) => Some(Change::Added(n)),
        (Some(o), Some(n)) => Some(Change::Updated { old: o, new: n }),
        (Some(o), None) => Some(Change::Deleted(o)),
    }
}

type Handler<K> = Arc<dyn Fn(&Change<'_, K>) + Send + Sync>;

/// A handler and the scope it serves: once `until` is cancelled (its
/// module stopped, to be restarted with handlers of its own) it is told
/// nothing more and is dropped at the next registration.
struct Subscriber<K> {
    handler: Handler<K>,
    until: CancellationToken,
}

/// One filter's subscribers.
struct View<K> {
    name: String,
    keep: Keep<K>,
    handlers: Vec<Subscriber<K>>,
    synced: watch::Sender<bool>,
}

struct Shared<K: Resource + 'static> {
    store: Cache<K>,
    /// Held for reading while the watch applies and announces one event, and
    /// for writing while a view or handler is added (and replayed to), so
    /// no handler misses or double-counts a change.
    views: RwLock<Vec<View<K>>>,
    /// Set once the watch runs: a new filter then needs a relist.
    started: std::sync::atomic::AtomicBool,
    relist: Notify,
}

impl<K: Resource + 'static> Shared<K> {
    fn views(&self) -> parking_lot::RwLockReadGuard<'_, Vec<View<K>>> {
        self.views.read()
    }

    fn views_mut(&self) -> parking_lot::RwLockWriteGuard<'_, Vec<View<K>>> {
        self.views.write()
    }
}

/// One view of one kind's shared cache.
pub struct Informer<K: Resource + 'static> {
    shared: Arc<Shared<K>>,
    view: usize,
    keep: Keep<K>,
    synced: watch::Receiver<bool>,
}

impl<K: Resource + 'static> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer { shared: self.shared.clone(), view: self.view, keep: self.keep.clone(), synced: self.synced.clone() }
    }
}

impl<K: Resource + 'static> Informer<K> {
    fn new(shared: Arc<Shared<K>>, view: usize, v: &View<K>) -> Self {
        Informer { view, keep: v.keep.clone(), synced: v.synced.subscribe(), shared }
    }

    /// The shared read-only store, seen through this view's filter (safe to
    /// call from a handler: takes no informer lock).
    pub fn store(&self) -> Cache<K> {
        self.shared.store.view(self.keep.clone())
    }

    /// Calls `handler` for every change of this view, in the watch task:
    /// keep it cheap (enqueue a key). Objects already cached are replayed to
    /// it first, as `Added`. Until `until` is cancelled: the scope of the
    /// module instance that registered it.
    pub fn on_change(&self, until: &CancellationToken, handler: impl Fn(&Change<'_, K>) + Send + Sync + 'static) {
        self.add_handler(Arc::new(handler), until);
    }

    fn add_handler(&self, handler: Handler<K>, until: &CancellationToken) {
        let mut views = self.shared.views_mut();
        for o in self.shared.store.state() {
            if (self.keep)(&o) {
                handler(&Change::Added(&o));
            }
        }
        let handlers = &mut views[self.view].handlers;
        handlers.retain(|s| !s.until.is_cancelled());
        handlers.push(Subscriber { handler, until: until.clone() });
    }

    /// Like [`Informer::on_change`], and every `period` (unless zero) the
    /// handler is also called with `Resync` for every object of the view,
    /// until `shutdown`: a change lost anywhere is acted on at the latest
    /// one period later (client-go's resync).
    pub fn on_change_with_resync(
        &self,
        period: Duration,
        shutdown: &CancellationToken,
        handler: impl Fn(&Change<'_, K>) + Send + Sync + 'static,
    ) where
        K: Send + Sync,
    {
        let handler: Handler<K> = Arc::new(handler);
        self.add_handler(handler.clone(), shutdown);
        if period.is_zero() {
            return;
        }
        let (store, shutdown) = (self.store(), shutdown.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                for o in store.state() {
                    handler(&Change::Resync(&o));
                }
            }
        });
    }

    /// Waits until this view's objects are listed into the store.
    pub async fn synced(&self) {
        let mut rx = self.synced.clone();
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

type Starter = Box<dyn FnOnce(Client, Option<Box<dyn Any + Send>>, CancellationToken) -> BoxFuture<'static, ()> + Send>;

struct Entry {
    informer: Arc<dyn Any + Send + Sync>,
    kind: String,
    type_name: &'static str,
    starter: Option<Starter>,
    /// Where the kind is watched: `None` cluster-wide.
    scope: Option<Scope>,
}

/// A watch narrower than cluster-wide: one namespace, objects with these
/// labels (a kind only one module reads in one place, such as the
/// provisioner's CSIStorageCapacities).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The namespace.
    pub namespace: String,
    /// A label selector (`k=v,k2=v2`).
    pub labels: String,
}

/// The registry of shared informers.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    /// Event sources replacing the apiserver for some kinds (tests).
    sources: Arc<Mutex<HashMap<String, Box<dyn Any + Send>>>>,
}

/// The name of the view that sees every object of a kind.
const ALL: &str = "";

impl Informers {
    /// No kinds yet.
    pub fn new(client: Client) -> Self {
        Informers { client, entries: Arc::default(), sources: Arc::default() }
    }

    /// The shared informer of full `K` objects (cluster-wide), unfiltered.
    pub fn get<K>(&self) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.view(ALL, |_: &K| true)
    }

    /// The view `name` of `K`: only the objects `keep` accepts are cached for
    /// it and announced to its handlers (an object that stops matching is
    /// announced as deleted). Views are told apart by name: asking again for
    /// a name returns that view (its first filter); another name adds a
    /// filter, and the store holds what any view keeps.
    pub fn view<K>(&self, name: &str, keep: impl Fn(&K) -> bool + Send + Sync + 'static) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let shared = self.shared::<K>();
        let mut views = shared.views_mut();
        if let Some(i) = views.iter().position(|v| v.name == name) {
            return Informer::new(shared.clone(), i, &views[i]);
        }
        let (synced, _) = watch::channel(false);
        views.push(View { name: name.to_string(), keep: Arc::new(keep), handlers: Vec::new(), synced });
        let view = views.len() - 1;
        let informer = Informer::new(shared.clone(), view, &views[view]);
        drop(views);
        if shared.started.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::info!(kind = %K::kind(&()), view = name, "New cache filter; relisting");
            shared.relist.notify_one();
        }
        informer
    }

    fn shared<K>(&self) -> Arc<Shared<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.shared_in(None, Arc::new(Api::all))
    }

    /// The view `name` of `K` watched only in `scope` (one namespace, a
    /// label selector); `keep` filters further. A kind is watched in one
    /// scope: asking for it in another (or cluster-wide) is a panic, as
    /// two watches of one kind would be.
    pub fn scoped<K>(&self, scope: Scope, name: &str, keep: impl Fn(&K) -> bool + Send + Sync + 'static) -> Informer<K>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let ns = scope.namespace.clone();
        self.shared_in::<K>(Some(scope), Arc::new(move |c| Api::namespaced(c, &ns)));
        self.view(name, keep)
    }

    fn shared_in<K>(&self, scope: Option<Scope>, make_api: MakeApi<K>) -> Arc<Shared<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let kind = kind_key::<K>();
        let mut entries = self.entries.lock();
        if let Some(e) = entries.get(&kind) {
            // A programming error as below: one kind, one watch.
            if scope.is_some() && e.scope != scope {
                panic!("{kind} is already watched in {:?}, not {scope:?}", e.scope);
            }
            match e.informer.clone().downcast::<Shared<K>>() {
                Ok(shared) => return shared,
                // A programming error caught by any test that starts the
                // modules together: two representations of one resource
                // would mean two watches of it.
                Err(_) => panic!("{kind} is already cached as another Rust type; use {}", e.type_name),
            }
        }
        let shared = Arc::new(Shared {
            store: Cache::<K>::default(),
            views: RwLock::default(),
            started: Default::default(),
            relist: Notify::new(),
        });
        let for_task = shared.clone();
        let watched = scope.clone();
        let starter: Starter = Box::new(move |client, injected, shutdown| {
            let source: Source<K> = match injected.and_then(|s| s.downcast::<Source<K>>().ok()) {
                Some(s) => *s,
                None => Arc::new(move || {
                    api_source::<K>(make_api(client.clone()), watched.as_ref().map(|s| s.labels.clone()))
                }),
            };
            Box::pin(supervise::<K>(for_task, source, shutdown))
        });
        let entry = Entry {
            informer: shared.clone(),
            kind: kind.clone(),
            type_name: std::any::type_name::<K>(),
            starter: Some(starter),
            scope,
        };
        entries.insert(kind, entry);
        shared
    }

    /// The shared informer of `K`'s metadata only (names, labels, annotations).
    /// kube's `Api` of `PartialObjectMeta` sends the `PartialObjectMetadata`
    /// Accept header on every list and watch (streaming list and fallback
    /// alike): the apiserver sends metadata, never whole objects (a Node's
    /// status heartbeats are not transferred).
    pub fn metadata<K>(&self) -> Informer<PartialObjectMeta<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.get::<PartialObjectMeta<K>>()
    }

    /// Test hook: `K` is watched from `source` instead of the apiserver
    /// (called before the kind is started).
    #[cfg(test)]
    pub(crate) fn inject_source<K>(&self, source: Source<K>)
    where
        K: Resource<DynamicType = ()> + 'static,
    {
        self.sources.lock().insert(kind_key::<K>(), Box::new(source));
    }

    /// The kinds watched, for tests and logs (`v1/PersistentVolume`, ...).
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<_> = self.entries.lock().values().map(|e| e.kind.clone()).collect();
        k.sort();
        k
    }

    /// Starts one watch per kind requested so far; they run until `shutdown`
    /// (each restarted if it ends or dies). Kinds requested later are
    /// started by a later call.
    pub fn start(&self, shutdown: &CancellationToken) {
        let mut entries = self.entries.lock();
        for e in entries.values_mut() {
            let Some(starter) = e.starter.take() else { continue };
            tracing::info!(kind = %e.kind, "Starting watch");
            let injected = self.sources.lock().remove(&e.kind);
            tokio::spawn(starter(self.client.clone(), injected, shutdown.clone()));
        }
    }
}

fn kind_key<K: Resource<DynamicType = ()>>() -> String {
    format!("{}/{}", K::api_version(&()), K::kind(&()))
}

/// The events of one watch: the apiserver's in production, scripted ones in tests.
type EventStream<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// Opens a watch's event stream (again, when one ends).
pub(crate) type Source<K> = Arc<dyn Fn() -> EventStream<K> + Send + Sync>;

/// How a kind's watch gets its `Api` (cluster-wide, or one namespace).
type MakeApi<K> = Arc<dyn Fn(Client) -> Api<K> + Send + Sync>;

/// The trimmed list-and-watch of all `K` of `api` (with `labels`), with backoff: a
/// streaming list where the apiserver offers it, else a list from its watch
/// cache ([`with_list_fallback`]).
fn api_source<K>(api: Api<K>, labels: Option<String>) -> EventStream<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let select = move |c: watcher::Config| match &labels {
        Some(l) => c.labels(l),
        None => c,
    };
    let (streaming_cfg, list_cfg) = (select(streaming_config()), select(list_config()));
    let streaming = watcher::watcher(api.clone(), streaming_cfg).default_backoff().boxed();
    let listing = move || watcher::watcher(api.clone(), list_cfg).default_backoff().boxed();
    with_list_fallback(streaming, listing, &K::kind(&())).modify(trim::<K>).boxed()
}

/// A streaming list (KEP-3157, `sendInitialEvents=true` on a watch from the
/// watch cache): the initial objects arrive as watch events, each decoded on
/// its own, so no whole list body is ever held (a 10 000-PV list is tens of
/// MB of JSON, whose transient heap glibc keeps), and the whole list costs
/// one request of the budget.
fn streaming_config() -> watcher::Config {
    watcher::Config::default().streaming_lists()
}

/// The fallback: like client-go's reflector, a list from the apiserver's
/// watch cache (`resourceVersion=0`, "not older than"), which answers with the
/// whole list in one response: one request of the budget instead of one per
/// 500 objects. Without a page limit: kube drops `resourceVersion=0` from a
/// list that has one (and would page through a consistent read).
fn list_config() -> watcher::Config {
    watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() }
}

/// Whether the apiserver refused to start a streaming list: one without the
/// WatchList feature rejects `sendInitialEvents` (422 Invalid), one older than
/// 1.27 `resourceVersionMatch` on a watch (400 Bad Request). Other failures
/// (403, 5xx, connection errors) are retried as they are.
pub(crate) fn refuses_streaming_lists(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if matches!(s.code, 400 | 422))
}

/// `streaming` until the apiserver refuses it ([`refuses_streaming_lists`]),
/// then `listing` for good. The refusal comes before any event, so nothing
/// is lost or doubled by the switch.
pub(crate) fn with_list_fallback<K: Send + 'static>(
    streaming: EventStream<K>,
    listing: impl FnOnce() -> EventStream<K> + Send + 'static,
    kind: &str,
) -> EventStream<K> {
    let kind = kind.to_string();
    let refused = streaming
        .take_while(move |item| {
            let refused = match item {
                Err(e @ watcher::Error::WatchStartFailed(kube::Error::Api(status))) if refuses_streaming_lists(e) => {
                    tracing::info!(kind = %kind, code = status.code, answer = %status.message,
                        "The apiserver refuses streaming lists; listing instead");
                    true
                }
                _ => false,
            };
            futures::future::ready(!refused)
        })
        .boxed();
    // Ends only when refused (a watcher stream never ends by itself): then list.
    refused.chain(futures::stream::once(async move { listing() }).flatten()).boxed()
}

/// Runs the watch task, and runs it again if it dies (a panicking handler)
/// before `shutdown`.
async fn supervise<K>(shared: Arc<Shared<K>>, source: Source<K>, shutdown: CancellationToken)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    shared.started.store(true, std::sync::atomic::Ordering::SeqCst);
    let kind = K::kind(&());
    loop {
        let task = tokio::spawn(run_watch::<K>(shared.clone(), source.clone(), shutdown.clone()));
        let outcome = task.await;
        if shutdown.is_cancelled() {
            return;
        }
        match outcome {
            Ok(()) => tracing::error!(kind = %kind, "Watch task ended; starting it again"),
            Err(e) => tracing::error!(kind = %kind, error = %e, "Watch task died; starting it again"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REOPEN_DELAY) => {}
        }
    }
}

/// Why one stream of a watch stopped.
enum StreamEnd {
    Shutdown,
    /// A new filter: list again.
    Relist,
    /// The stream ended by itself.
    Ended,
}

/// Applies the watch's events to the store and announces them, opening the
/// stream again whenever it ends; returns at shutdown.
async fn run_watch<K>(shared: Arc<Shared<K>>, source: Source<K>, shutdown: CancellationToken)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&());
    loop {
        let mut writer = Writer::new(shared.store.clone());
        match drive(&shared, &mut writer, source(), &shutdown).await {
            StreamEnd::Shutdown => return,
            StreamEnd::Relist => continue,
            StreamEnd::Ended => {
                tracing::warn!(kind = %kind, "Watch stream ended; opening it again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(REOPEN_DELAY) => {}
                }
            }
        }
    }
}

async fn drive<K>(
    shared: &Shared<K>,
    writer: &mut Writer<K>,
    stream: EventStream<K>,
    shutdown: &CancellationToken,
) -> StreamEnd
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&());
    let mut stream = stream;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return StreamEnd::Shutdown,
            _ = shared.relist.notified() => return StreamEnd::Relist,
            n = stream.next() => n,
        };
        let Some(event) = next else { return StreamEnd::Ended };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(kind = %kind, error = %e, "Watch failed; retrying with backoff");
                continue;
            }
        };
        let init_done = matches!(event, Event::InitDone);
        let views = shared.views();
        let keep_any = |o: &K| views.iter().any(|v| (v.keep)(o));
        // Stored first, then announced: a handler's reader finds the change.
        let transitions = writer.apply(event, &keep_any);
        announce(&views, &transitions);
        if init_done {
            for v in views.iter() {
                v.synced.send_replace(true);
            }
            tracing::info!(kind = %kind, objects = shared.store.len(), "Watch synced");
        }
    }
}

fn announce<K>(views: &[View<K>], transitions: &[Transition<K>]) {
    for t in transitions {
        for v in views {
            if v.handlers.is_empty() {
                continue;
            }
            let Some(change) = view_change(v.keep.as_ref(), t.old.as_deref(), t.new.as_deref()) else { continue };
            for s in v.handlers.iter().filter(|s| !s.until.is_cancelled()) {
                (s.handler)(&change);
            }
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

    fn start_failed(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() })))
    }

    #[test]
    fn only_a_rejected_request_means_no_streaming_lists() {
        // 422: sendInitialEvents without the WatchList feature; 400: an
        // apiserver older than 1.27 (resourceVersionMatch on a watch).
        for (code, refused) in [(422, true), (400, true), (403, false), (404, false), (410, false), (500, false)] {
            assert_eq!(refuses_streaming_lists(&start_failed(code)), refused, "HTTP {code}");
        }
        assert!(!refuses_streaming_lists(&watcher::Error::NoResourceVersion));
        let list_failed = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(kube::core::Status {
            code: 422,
            ..Default::default()
        })));
        assert!(!refuses_streaming_lists(&list_failed), "only the start of a streaming watch");
    }

    fn names(events: Vec<Result<Event<String>, watcher::Error>>) -> Vec<String> {
        events
            .into_iter()
            .map(|e| match e {
                Ok(Event::InitApply(s) | Event::Apply(s)) => s,
                Ok(Event::Init) => "init".into(),
                Ok(Event::InitDone) => "done".into(),
                Ok(Event::Delete(s)) => format!("-{s}"),
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_refused_streaming_list_falls_back_to_listing_for_good() {
        let streaming = futures::stream::iter(vec![Err(start_failed(422)), Ok(Event::Init)]).boxed();
        let listing = || {
            futures::stream::iter(vec![
                Ok(Event::Init),
                Ok(Event::InitApply("a".to_string())),
                Ok(Event::InitDone),
                Ok(Event::Apply("b".to_string())),
            ])
            .boxed()
        };
        let seen = names(with_list_fallback(streaming, listing, "Thing").collect().await);
        assert_eq!(seen, ["init", "a", "done", "b"], "nothing of the refused stream, all of the list");
    }

    #[tokio::test]
    async fn a_streaming_list_that_works_never_lists() {
        let streaming = futures::stream::iter(vec![
            Err(start_failed(500)),
            Ok(Event::Init),
            Ok(Event::InitApply("a".to_string())),
            Ok(Event::InitDone),
        ])
        .boxed();
        let listed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = listed.clone();
        let listing = move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            futures::stream::empty().boxed()
        };
        let seen = names(with_list_fallback(streaming, listing, "Thing").take(4).collect().await);
        assert_eq!(seen[1..], ["init", "a", "done"], "a 500 is retried by the stream itself: {seen:?}");
        assert!(seen[0].starts_with("error"), "{seen:?}");
        assert!(!listed.load(std::sync::atomic::Ordering::SeqCst), "no list while streaming works");
    }

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
    fn view_change_table() {
        let pvc = |name: &str| PersistentVolumeClaim {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        };
        let mine = |c: &PersistentVolumeClaim| c.metadata.name.as_deref() == Some("mine");
        let (m, o) = (pvc("mine"), pvc("other"));
        let what = |c: Option<Change<'_, PersistentVolumeClaim>>| match c {
            None => "nothing",
            Some(Change::Added(_)) => "added",
            Some(Change::Updated { .. }) => "updated",
            Some(Change::Resync(_)) => "resync",
            Some(Change::Deleted(_)) => "deleted",
        };
        let table = [
            // (old, new, what the view is told)
            (None, Some(&m), "added"),
            (None, Some(&o), "nothing"),
            (Some(&m), Some(&m), "updated"),
            (Some(&m), Some(&o), "deleted"),
            (Some(&o), Some(&m), "added"),
            (Some(&o), Some(&o), "nothing"),
            (Some(&m), None, "deleted"),
            (Some(&o), None, "nothing"),
        ];
        for (old, new, want) in table {
            let name = |x: Option<&PersistentVolumeClaim>| x.and_then(|p| p.metadata.name.clone());
            assert_eq!(what(view_change(&mine, old, new)), want, "{:?} -> {:?}", name(old), name(new));
        }
    }
}

#[cfg(test)]
mod contract_tests {
    //! client-go's informer contract, driven by scripted watch streams.

    use std::time::Duration;

    use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use tokio::sync::mpsc;

    use super::*;

    fn cm(name: &str, rv: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn offline_client() -> Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        Client::try_from(config).expect("client")
    }

    /// Scripted watch streams: each `open` of the watch takes the next
    /// channel's receiver; events are pushed into the current one.
    type Item = Result<Event<ConfigMap>, watcher::Error>;

    struct Script {
        streams: Arc<Mutex<Vec<mpsc::UnboundedReceiver<Item>>>>,
        senders: Vec<mpsc::UnboundedSender<Item>>,
        opened: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Script {
        fn new(streams: usize) -> Script {
            let (senders, receivers): (Vec<_>, Vec<_>) = (0..streams).map(|_| mpsc::unbounded_channel()).unzip();
            Script {
                streams: Arc::new(Mutex::new(receivers.into_iter().rev().collect())),
                senders,
                opened: Arc::default(),
            }
        }

        fn source(&self) -> Source<ConfigMap> {
            let (streams, opened) = (self.streams.clone(), self.opened.clone());
            Arc::new(move || {
                opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match streams.lock().pop() {
                    Some(rx) => tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed(),
                    None => futures::stream::pending().boxed(),
                }
            })
        }

        fn send(&self, stream: usize, events: Vec<Event<ConfigMap>>) {
            for e in events {
                self.senders[stream].send(Ok(e)).expect("watch task alive");
            }
        }

        fn list(&self, stream: usize, objects: &[ConfigMap]) {
            let mut events = vec![Event::Init];
            events.extend(objects.iter().cloned().map(Event::InitApply));
            events.push(Event::InitDone);
            self.send(stream, events);
        }
    }

    /// What a handler saw: ("applied"|"deleted", name, whether the store
    /// held the object at that moment).
    type Seen = Arc<Mutex<Vec<(&'static str, String, bool)>>>;

    fn record(inf: &Informer<ConfigMap>) -> Seen {
        record_until(inf, &CancellationToken::new())
    }

    fn record_until(inf: &Informer<ConfigMap>, until: &CancellationToken) -> Seen {
        let seen: Seen = Arc::default();
        let (log, store) = (seen.clone(), inf.store());
        inf.on_change(until, move |c| {
            let what = if c.is_deleted() { "deleted" } else { "applied" };
            let o = c.object();
            let name = o.metadata.name.clone().unwrap_or_default();
            let held = store.get_named(Some("ns"), &name).is_some();
            log.lock().push((what, name, held));
        });
        seen
    }

    fn take(seen: &Seen) -> Vec<(&'static str, String, bool)> {
        let mut v = std::mem::take(&mut *seen.lock());
        v.sort();
        v
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn setup(script: &Script) -> (Informers, CancellationToken) {
        let informers = Informers::new(offline_client());
        informers.inject_source::<ConfigMap>(script.source());
        (informers, CancellationToken::new())
    }

    #[tokio::test]
    async fn a_relist_announces_every_difference_after_the_store_holds_it() {
        let script = Script::new(1);
        let (informers, stop) = setup(&script);
        let inf = informers.get::<ConfigMap>();
        let seen = record(&inf);
        informers.start(&stop);
        script.list(0, &[cm("kept", "1"), cm("changed", "1"), cm("vanished", "1")]);
        inf.synced().await;
        until("the first list announced", || seen.lock().len() == 3).await;
        take(&seen);
        // A relist (after 410 Gone): one object changed, one created and one
        // deleted while the watch was down.
        script.list(0, &[cm("kept", "1"), cm("changed", "2"), cm("created", "1")]);
        script.send(0, vec![Event::Apply(cm("marker", "1"))]);
        until("the relist announced", || seen.lock().iter().any(|e| e.1 == "marker")).await;
        let got: Vec<_> = take(&seen).into_iter().filter(|e| e.1 != "marker").collect();
        assert_eq!(
            got,
            vec![
                ("applied", "changed".to_string(), true),
                ("applied", "created".to_string(), true),
                ("deleted", "vanished".to_string(), false),
            ],
            "each difference announced once, with the store already holding the new state"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_handler_whose_module_stopped_hears_nothing_more_and_is_dropped() {
        let script = Script::new(1);
        let (informers, stop) = setup(&script);
        let inf = informers.get::<ConfigMap>();
        let first_instance = CancellationToken::new();
        let old = record_until(&inf, &first_instance);
        informers.start(&stop);
        script.list(0, &[cm("a", "1")]);
        inf.synced().await;
        until("a announced", || old.lock().len() == 1).await;
        // The module stops; its restarted instance registers anew (and is
        // replayed the cache), the stopped one's handler is gone.
        first_instance.cancel();
        let new = record(&inf);
        script.send(0, vec![Event::Apply(cm("b", "1"))]);
        until("b announced to the new instance", || new.lock().iter().any(|e| e.1 == "b")).await;
        assert_eq!(take(&old), vec![("applied", "a".to_string(), true)], "nothing after its scope ended");
        assert_eq!(take(&new), vec![("applied", "a".to_string(), true), ("applied", "b".to_string(), true)]);
        let handlers = inf.shared.views()[inf.view].handlers.len();
        assert_eq!(handlers, 1, "the stopped instance's handler was dropped");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_handler_registered_after_the_list_sees_every_existing_object() {
        let script = Script::new(1);
        let (informers, stop) = setup(&script);
        let inf = informers.get::<ConfigMap>();
        informers.start(&stop);
        script.list(0, &[cm("a", "1"), cm("b", "1")]);
        inf.synced().await;
        let late = record(&inf);
        script.send(0, vec![Event::Apply(cm("c", "1"))]);
        until("c announced", || late.lock().iter().any(|e| e.1 == "c")).await;
        assert_eq!(
            take(&late),
            vec![
                ("applied", "a".to_string(), true),
                ("applied", "b".to_string(), true),
                ("applied", "c".to_string(), true)
            ]
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn two_filters_on_one_kind_each_see_only_their_objects() {
        let script = Script::new(2);
        let (informers, stop) = setup(&script);
        let starts_with = |p: char| move |c: &ConfigMap| c.metadata.name.as_deref().is_some_and(|n| n.starts_with(p));
        let starts_a = informers.view::<ConfigMap>("a", starts_with('a'));
        let starts_b = informers.view::<ConfigMap>("b", starts_with('b'));
        let (seen_a, seen_b) = (record(&starts_a), record(&starts_b));
        informers.start(&stop);
        script.list(0, &[cm("a1", "1"), cm("b1", "1"), cm("c1", "1")]);
        starts_a.synced().await;
        starts_b.synced().await;
        until("both views announced", || !seen_a.lock().is_empty() && !seen_b.lock().is_empty()).await;
        assert_eq!(take(&seen_a), vec![("applied", "a1".to_string(), true)]);
        assert_eq!(take(&seen_b).into_iter().map(|e| e.1).collect::<Vec<_>>(), vec!["b1".to_string()]);
        assert!(starts_b.store().get_named(Some("ns"), "b1").is_some(), "b's view holds b1");
        assert!(starts_a.store().get_named(Some("ns"), "b1").is_none(), "a's view does not");
        assert!(starts_a.store().get_named(Some("ns"), "c1").is_none(), "nobody's objects are not cached");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_watch_stream_that_ends_is_opened_again() {
        let script = Script::new(2);
        let (informers, stop) = setup(&script);
        let inf = informers.get::<ConfigMap>();
        informers.start(&stop);
        script.list(0, &[cm("a", "1")]);
        inf.synced().await;
        // The first stream ends (its sender dropped): the watch must open a
        // new one, whose list brings the current state.
        let Script { senders, opened, streams } = script;
        let mut senders = senders.into_iter();
        drop(senders.next());
        let second = senders.next().expect("second stream");
        until("the watch reopened", || opened.load(std::sync::atomic::Ordering::SeqCst) == 2).await;
        for e in [Event::Init, Event::InitApply(cm("b", "1")), Event::InitDone] {
            second.send(Ok(e)).expect("second stream open");
        }
        let store = inf.store();
        until("b cached from the new stream", || store.get_named(Some("ns"), "b").is_some()).await;
        assert!(store.get_named(Some("ns"), "a").is_none(), "the relist replaced the content");
        drop(streams);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn every_object_is_resynced_each_period() {
        let script = Script::new(1);
        let (informers, stop) = setup(&script);
        let inf = informers.get::<ConfigMap>();
        let resyncs: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = resyncs.clone();
        inf.on_change_with_resync(Duration::from_secs(60), &stop, move |c| {
            if let Change::Resync(o) = c {
                log.lock().push(o.metadata.name.clone().unwrap_or_default());
            }
        });
        informers.start(&stop);
        script.list(0, &[cm("a", "1"), cm("b", "1")]);
        inf.synced().await;
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(resyncs.lock().is_empty(), "not before the period");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut got = resyncs.lock().clone();
        got.sort();
        assert_eq!(got, vec!["a", "b"], "each object once per period");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(resyncs.lock().len(), 4, "and again a period later");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_filter_added_after_the_start_relists_for_its_objects() {
        let script = Script::new(2);
        let (informers, stop) = setup(&script);
        let only_a = informers.view::<ConfigMap>("a", |c| c.metadata.name.as_deref() == Some("a"));
        informers.start(&stop);
        script.list(0, &[cm("a", "1"), cm("b", "1")]);
        only_a.synced().await;
        assert_eq!(only_a.store().len(), 1);
        // A second module asks for b after the watch started: the watch
        // must list again (b was never cached), and b's view is synced only
        // then.
        let only_b = informers.view::<ConfigMap>("b", |c| c.metadata.name.as_deref() == Some("b"));
        let seen = record(&only_b);
        let Script { senders, opened, .. } = &script;
        until("the watch relisted", || opened.load(std::sync::atomic::Ordering::SeqCst) == 2).await;
        for e in [Event::Init, Event::InitApply(cm("a", "1")), Event::InitApply(cm("b", "1")), Event::InitDone] {
            senders[1].send(Ok(e)).expect("second stream");
        }
        only_b.synced().await;
        until("b announced", || !seen.lock().is_empty()).await;
        assert_eq!(take(&seen), vec![("applied", "b".to_string(), true)]);
        assert!(only_a.store().get_named(Some("ns"), "b").is_none(), "a's view still sees only a");
        stop.cancel();
    }

    /// Two modules of one process register on one view, one before the
    /// watch lists and one after it synced (the two orders a combined
    /// process can start its modules in): both see every object.
    #[tokio::test]
    async fn two_modules_see_every_object_whichever_starts_first() {
        let script = Script::new(1);
        let (informers, stop) = setup(&script);
        let view = |i: &Informers| i.view::<ConfigMap>("driver=x", |_| true);
        let early = view(&informers);
        let early_seen = record(&early);
        informers.start(&stop);
        script.list(0, &[cm("a", "1"), cm("b", "1")]);
        early.synced().await;
        let late = view(&informers);
        late.synced().await;
        let late_seen = record(&late);
        script.send(0, vec![Event::Apply(cm("c", "1"))]);
        for (who, log) in [("registered before the list", &early_seen), ("registered after it", &late_seen)] {
            until("c announced", || log.lock().iter().any(|e| e.1 == "c")).await;
            let names: Vec<String> = take(log).into_iter().map(|e| e.1).collect();
            assert_eq!(names, vec!["a", "b", "c"], "{who}");
        }
        stop.cancel();
    }
}

#[cfg(test)]
#[path = "informers_metadata_tests.rs"]
mod metadata_tests;
