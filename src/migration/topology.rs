//! Topology rewriting between the in-tree zone/region keys and a CSI
//! driver's keys, on a PV's `nodeAffinity`, its labels and a class's
//! `allowedTopologies` (csi-translation-lib's rules, reimplemented).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, TopologySelectorLabelRequirement,
    TopologySelectorTerm, VolumeNodeAffinity,
};

use super::TranslateError;

pub use crate::compat::translation::{REGION_BETA, REGION_GA, ZONE_BETA, ZONE_GA};
/// Separator of several zones in one label value.
pub const MULTI_ZONE_DELIMITER: &str = "__";

/// A function from the zones of a term to its region.
pub type RegionParser = fn(&[String]) -> Result<String, TranslateError>;

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    let terms = &mut pv.spec.as_mut()?.node_affinity.as_mut()?.required.as_mut()?.node_selector_terms;
    (!terms.is_empty()).then_some(terms)
}

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
}

/// Whether any term of the affinity has a requirement on `key`.
pub fn key_exists(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv).iter().flat_map(|t| t.match_expressions.iter().flatten()).any(|r| r.key == key)
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a String> {
    pv.metadata.labels.as_ref()?.get(key)
}

/// Renames `old` to `new` in every requirement of every term.
pub fn replace_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    for t in terms_mut(pv).into_iter().flatten() {
        for r in t.match_expressions.iter_mut().flatten() {
            if r.key == old {
                r.key = new.to_string();
            }
        }
    }
}

/// The distinct values of `key` across all terms, sorted.
pub fn values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let set: BTreeSet<&String> = terms(pv)
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten())
        .collect();
    set.into_iter().cloned().collect()
}

/// Adds `key In zones` (trimmed, non-empty, sorted, distinct) to every term,
/// creating one term if there is none. Nothing happens without a zone.
pub fn add(pv: &mut PersistentVolume, key: &str, zones: &[String]) {
    let zones: BTreeSet<String> = zones.iter().map(|z| z.trim()).filter(|z| !z.is_empty()).map(String::from).collect();
    if zones.is_empty() {
        return;
    }
    let spec = pv.spec.get_or_insert_with(Default::default);
    let affinity = spec.node_affinity.get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    let req = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".into(),
        values: Some(zones.into_iter().collect()),
    };
    for t in &mut required.node_selector_terms {
        t.match_expressions.get_or_insert_with(Vec::new).push(req.clone());
    }
}

/// Which zone and region keys a PV uses: GA unless only the beta ones are
/// present (in the affinity first, then in the labels).
pub fn labels_in_use(pv: &PersistentVolume) -> (&'static str, &'static str) {
    if key_exists(pv, ZONE_GA) {
        return (ZONE_GA, REGION_GA);
    }
    if key_exists(pv, ZONE_BETA) {
        return (ZONE_BETA, REGION_BETA);
    }
    if label(pv, ZONE_GA).is_some() {
        return (ZONE_GA, REGION_GA);
    }
    if label(pv, ZONE_BETA).is_some() {
        return (ZONE_BETA, REGION_BETA);
    }
    (ZONE_GA, REGION_GA)
}

fn set_label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata.labels.get_or_insert_with(BTreeMap::new).entry(key.to_string()).or_insert(value);
}

/// In-tree → CSI: the zone requirement (or the zone label) becomes
/// `csi_key`; a beta region requirement becomes the GA one.
pub fn in_tree_to_csi(pv: &mut PersistentVolume, csi_key: &str) {
    let (zone, region) = labels_in_use(pv);
    if !values(pv, zone).is_empty() {
        replace_key(pv, zone, csi_key);
    } else if let Some(l) = label(pv, zone).cloned() {
        let zones: Vec<String> = l.split(MULTI_ZONE_DELIMITER).map(String::from).collect();
        add(pv, csi_key, &zones);
    }
    if region == REGION_BETA && !values(pv, region).is_empty() {
        replace_key(pv, region, REGION_GA);
    }
}

/// CSI → in-tree: `csi_key` becomes the zone key in use, each term gets a
/// region from its zones (if a parser is given), and the zone (and a single
/// region) labels are set unless present.
pub fn csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_parser: Option<RegionParser>,
) -> Result<(), TranslateError> {
    let (zone, _) = labels_in_use(pv);
    replace_key(pv, csi_key, zone);
    if let Some(parser) = region_parser {
        add_regions(pv, parser)?;
    }
    let zones = values(pv, zone);
    if !zones.is_empty() {
        set_label_if_absent(pv, zone, zones.join(MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

fn add_regions(pv: &mut PersistentVolume, parser: RegionParser) -> Result<(), TranslateError> {
    let (zone, region) = labels_in_use(pv);
    let Some(terms) = terms_mut(pv) else { return Ok(()) };
    for t in terms.iter_mut() {
        let reqs = t.match_expressions.get_or_insert_with(Vec::new);
        let mut zones = Vec::new();
        let mut has_region = false;
        for r in reqs.iter() {
            if r.key == region {
                has_region = true;
                break;
            }
            if r.key == zone {
                zones.extend(r.values.iter().flatten().cloned());
            }
        }
        if has_region {
            continue;
        }
        let value = parser(&zones)?;
        reqs.push(NodeSelectorRequirement {
            key: region.to_string(),
            operator: "In".into(),
            values: Some(vec![value]),
        });
    }
    let regions = values(pv, region);
    if regions.len() == 1 {
        set_label_if_absent(pv, region, regions[0].clone());
    }
    Ok(())
}

/// vSphere's in-tree → CSI: zone and region each become the driver's key,
/// from the affinity or else from the (whole) label.
pub fn vsphere_in_tree_to_csi(pv: &mut PersistentVolume, zone_key: &str, region_key: &str) {
    let (zone, region) = labels_in_use(pv);
    for (old, new) in [(zone, zone_key), (region, region_key)] {
        if !values(pv, old).is_empty() {
            replace_key(pv, old, new);
        } else if let Some(l) = label(pv, old).filter(|l| !l.is_empty()).cloned() {
            add(pv, new, &[l]);
        }
    }
}

/// vSphere's CSI → in-tree: the driver's keys become the zone and region
/// keys in use; their first values become labels unless present.
pub fn vsphere_csi_to_in_tree(pv: &mut PersistentVolume, zone_key: &str, region_key: &str) {
    let (zone, region) = labels_in_use(pv);
    replace_key(pv, zone_key, zone);
    replace_key(pv, region_key, region);
    for key in [zone, region] {
        if let Some(first) = values(pv, key).into_iter().next() {
            set_label_if_absent(pv, key, first);
        }
    }
}

/// One term `key In values`.
pub fn selector(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement { key: key.to_string(), values }]),
    }]
}

/// A class's `allowedTopologies` with the zone keys (GA and beta) renamed to `key`.
pub fn allowed_topologies(terms: &[TopologySelectorTerm], key: &str) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|t| TopologySelectorTerm {
            match_label_expressions: t.match_label_expressions.as_ref().map(|exps| {
                exps.iter()
                    .map(|e| {
                        if e.key == ZONE_BETA || e.key == ZONE_GA {
                            TopologySelectorLabelRequirement { key: key.to_string(), values: e.values.clone() }
                        } else {
                            e.clone()
                        }
                    })
                    .collect()
            }),
        })
        .collect()
}

/// An AWS zone's region: `us-east-1a` → `us-east-1`, local and wavelength
/// zones (5 or 7 parts) → their first three parts; all zones must agree.
pub fn aws_region(zones: &[String]) -> Result<String, TranslateError> {
    if zones.is_empty() {
        return Err(TranslateError::Topology("no zones specified".into()));
    }
    let mut regions = BTreeSet::new();
    for z in zones {
        let mut parts: Vec<&str> = z.split('-').collect();
        let n = parts.len();
        if (n == 3 || n == 4) && parts[n - 1].len() == 2 {
            let last = parts[n - 1];
            // Two bytes; the region keeps the first (a char boundary for ASCII zones).
            let cut = last.char_indices().nth(1).map_or(last.len(), |(i, _)| i);
            parts[n - 1] = &last[..cut];
            regions.insert(parts.join("-"));
        } else if n == 5 || n == 7 {
            regions.insert(parts[..3].join("-"));
        } else {
            return Err(TranslateError::Topology(format!("Unexpected zone format: {z} is not a valid AWS zone")));
        }
    }
    single_region(regions)
}

/// A GCE zone's region: `us-central1-a` → `us-central1`; all zones must agree.
pub fn gce_region(zones: &[String]) -> Result<String, TranslateError> {
    if zones.is_empty() {
        return Err(TranslateError::Topology("no zones specified".into()));
    }
    let mut regions = BTreeSet::new();
    for z in zones {
        let parts: Vec<&str> = z.split('-').collect();
        if parts.len() != 3 {
            return Err(TranslateError::Topology(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {z}"
            )));
        }
        regions.insert(parts[..2].join("-"));
    }
    single_region(regions)
}

fn single_region(regions: BTreeSet<String>) -> Result<String, TranslateError> {
    if regions.len() != 1 {
        let list: Vec<_> = regions.into_iter().collect();
        return Err(TranslateError::Topology(format!("multiple or no regions gotten from zones, got: {list:?}")));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}
