//! `csi_sidecar_volume_health_abnormal`: one series per abnormal claim and
//! condition status, so alerts need no event scraping
//! (external-health-monitor#72). Bounded by the abnormal claims: a claim
//! that is healthy again, or gone, has no series.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{Arc, Mutex},
};

/// The metric's name.
pub const METRIC: &str = "csi_sidecar_volume_health_abnormal";

/// Abnormal claims: (namespace, name) → their conditions' statuses.
pub struct Gauges {
    driver: String,
    abnormal: Mutex<BTreeMap<(String, String), Vec<String>>>,
}

impl Gauges {
    /// A set for `driver`, rendered with the process's metrics.
    pub fn install(driver: &str) -> Arc<Gauges> {
        let g = Arc::new(Gauges { driver: driver.to_string(), abnormal: Mutex::default() });
        let weak = Arc::downgrade(&g);
        crate::metrics::add_text_source(Arc::new(move |out: &mut String| {
            if let Some(g) = weak.upgrade() {
                g.render(out);
            }
        }));
        g
    }

    /// Records the statuses of an abnormal claim (empty: healthy or gone).
    pub fn set(&self, namespace: &str, name: &str, mut statuses: Vec<String>) {
        statuses.sort();
        statuses.dedup();
        let mut map = self.abnormal.lock().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_string(), name.to_string());
        if statuses.is_empty() {
            map.remove(&key);
        } else {
            map.insert(key, statuses);
        }
    }

    /// Forgets the claims not in `live` (`namespace/name`): deleted, or no
    /// longer bound to a volume of the driver.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        let mut map = self.abnormal.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|(ns, name), _| live.contains(&format!("{ns}/{name}")));
    }

    fn render(&self, out: &mut String) {
        let map = self.abnormal.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "# HELP {METRIC} 1 for each claim whose volume the CSI driver reports abnormal, per condition status.\n\
             # TYPE {METRIC} gauge"
        );
        for ((ns, name), statuses) in map.iter() {
            for s in statuses {
                let _ = writeln!(
                    out,
                    "{METRIC}{{driver_name=\"{}\",namespace=\"{}\",persistentvolumeclaim=\"{}\",condition=\"{}\"}} 1",
                    escape(&self.driver),
                    escape(ns),
                    escape(name),
                    escape(s)
                );
            }
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_per_abnormal_claim_and_status_and_none_once_healthy() {
        let g = Gauges { driver: "d".into(), abnormal: Mutex::default() };
        g.set("ns", "a", vec!["Inaccessible".into(), "Degraded".into(), "Degraded".into()]);
        g.set("ns", "b\"x", vec!["DataLoss".into()]);
        let mut out = String::new();
        g.render(&mut out);
        let series: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(series.len(), 3, "{out}");
        assert!(series[0].contains("persistentvolumeclaim=\"a\",condition=\"Degraded\"} 1"), "{out}");
        assert!(out.contains("persistentvolumeclaim=\"b\\\"x\""), "escaped: {out}");
        g.set("ns", "a", vec![]);
        g.set("ns", "b\"x", vec![]);
        let mut out = String::new();
        g.render(&mut out);
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 0, "{out}");
    }
}
