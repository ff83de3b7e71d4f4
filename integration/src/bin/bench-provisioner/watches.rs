//! Watches of the claims and volumes: when each claim was first annotated,
//! had its PV and was Bound, and the latencies between them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde::de::DeserializeOwned;

use super::ANN_STORAGE_PROVISIONER;

pub struct Watched<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    pub store: reflector::Store<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default + Send + Sync,
{
    /// A reflected watch that calls `on_apply` with each added or changed
    /// object as its event arrives.
    async fn start(api: Api<K>, mut on_apply: impl FnMut(&K) + Send + 'static) -> Result<Self> {
        let (store, writer) = reflector::store();
        let task = tokio::spawn(
            watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer).for_each(move |ev| {
                if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = &ev {
                    on_apply(o);
                }
                futures::future::ready(())
            }),
        );
        tokio::time::timeout(Duration::from_secs(60), store.wait_until_ready())
            .await
            .map_err(|_| anyhow!("watch not ready within 60 s"))??;
        Ok(Watched { store, task })
    }
}

impl<K: Resource + Clone + 'static> Drop for Watched<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When each key was first seen (the arrival of the watch event).
#[derive(Clone, Default)]
pub struct FirstSeen(Arc<Mutex<HashMap<String, Instant>>>);

impl FirstSeen {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn mark(&self, key: &str) {
        let now = Instant::now();
        self.lock().entry(key.to_string()).or_insert(now);
    }
    pub fn len(&self) -> usize {
        self.lock().len()
    }
    pub fn get(&self, key: &str) -> Option<Instant> {
        self.lock().get(key).copied()
    }
    pub fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }
    pub fn snapshot(&self) -> HashMap<String, Instant> {
        self.lock().clone()
    }
}

fn has_provisioner_annotation(c: &PersistentVolumeClaim) -> bool {
    c.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANN_STORAGE_PROVISIONER))
}

fn is_bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// The claim a PV of class `class` is for.
fn claim_of<'a>(pv: &'a PersistentVolume, class: &str) -> Option<&'a str> {
    let spec = pv.spec.as_ref()?;
    (spec.storage_class_name.as_deref() == Some(class)).then_some(())?;
    spec.claim_ref.as_ref()?.name.as_deref()
}

/// A PVC watch of `pvcs` recording the first time each claim carries the
/// provisioner annotation and is Bound.
pub async fn watch_claims(
    pvcs: &Api<PersistentVolumeClaim>,
) -> Result<(Watched<PersistentVolumeClaim>, FirstSeen, FirstSeen)> {
    let (annotated, bound) = (FirstSeen::default(), FirstSeen::default());
    let (a, b) = (annotated.clone(), bound.clone());
    let w = Watched::start(pvcs.clone(), move |c: &PersistentVolumeClaim| {
        let name = c.metadata.name.as_deref().unwrap_or_default();
        if has_provisioner_annotation(c) {
            a.mark(name);
        }
        if is_bound(c) {
            b.mark(name);
        }
    })
    .await?;
    Ok((w, annotated, bound))
}

/// A watch of all PVs recording, per claim, when a PV of `class` for it first appeared.
pub async fn watch_pvs(pvs: &Api<PersistentVolume>, class: &str) -> Result<(Watched<PersistentVolume>, FirstSeen)> {
    let seen = FirstSeen::default();
    let (s, class) = (seen.clone(), class.to_string());
    let w = Watched::start(pvs.clone(), move |pv: &PersistentVolume| {
        if let Some(claim) = claim_of(pv, &class) {
            s.mark(claim);
        }
    })
    .await?;
    Ok((w, seen))
}

/// Seconds from `from[k]` to `to[k]` for every key in both, sorted.
pub fn latencies(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<f64> {
    let mut v: Vec<f64> =
        to.iter().filter_map(|(k, t)| from.get(k).map(|f| t.saturating_duration_since(*f).as_secs_f64())).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// p50, p95 and max of sorted samples.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Default for Spread {
    fn default() -> Self {
        Spread { p50: f64::NAN, p95: f64::NAN, max: f64::NAN }
    }
}

impl Spread {
    pub fn of(sorted: &[f64]) -> Spread {
        Spread { p50: pct(sorted, 0.5), p95: pct(sorted, 0.95), max: sorted.last().copied().unwrap_or(f64::NAN) }
    }
}

pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_to_pv_latency_pairs_each_claim_with_its_own_times() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let from: HashMap<String, Instant> = [("a".into(), at(0)), ("b".into(), at(100)), ("c".into(), at(0))].into();
        let to: HashMap<String, Instant> = [("a".into(), at(500)), ("b".into(), at(300)), ("x".into(), at(1))].into();
        let v = latencies(&from, &to);
        assert_eq!(v, [0.2, 0.5]);
        let s = Spread::of(&v);
        assert_eq!((s.p50, s.max), (0.5, 0.5));
        assert!(Spread::of(&[]).p50.is_nan());
    }
}
