//! csi-sidecar's CSI migration translation (`csi_sidecar::migration`)
//! against the real `k8s.io/csi-translation-lib` (v0.36.3, the version the
//! pinned control plane uses): `csi-translate` (integration/go/kube/cmd)
//! runs the library over `integration/testdata/migration-corpus.json` and
//! every case's result must be the same here (the PV, class and inline
//! translations, and the volume-handle repair): the same object, or an error
//! on both sides. Objects are compared after dropping what Go's `omitempty`
//! drops (null, false, 0, "", empty maps and lists), so an absent field and its
//! zero value count as equal, as they do on the wire.

use std::{collections::BTreeSet, io::Write, process::Stdio};

use csi_sidecar::migration::{self, Plugin};
use csi_sidecar_integration::{component_bin, workspace_root};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, Volume},
    storage::v1::StorageClass,
};
use serde_json::Value;

/// The value with Go's omitempty zero values removed, recursively.
fn normalized(v: &Value) -> Option<Value> {
    match v {
        Value::Null | Value::Bool(false) => None,
        Value::String(s) if s.is_empty() => None,
        Value::Number(n) if n.as_f64() == Some(0.0) => None,
        Value::Array(a) => {
            let items: Vec<Value> = a.iter().map(|x| normalized(x).unwrap_or(Value::Null)).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(m) => {
            let m: serde_json::Map<String, Value> =
                m.iter().filter_map(|(k, v)| normalized(v).map(|v| (k.clone(), v))).collect();
            (!m.is_empty()).then_some(Value::Object(m))
        }
        other => Some(other.clone()),
    }
}

/// Our result as JSON, without the type fields k8s-openapi always writes
/// (the library's objects leave them empty).
fn ours<T: serde::Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Result<Value, String> {
    r.map(|v| {
        let mut v = serde_json::to_value(v).expect("serialize");
        if let Some(m) = v.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
        }
        v
    })
    .map_err(|e| e.to_string())
}

#[test]
fn translation_equals_csi_translation_lib_for_every_case() {
    let corpus_path = workspace_root().join("integration/testdata/migration-corpus.json");
    let corpus_text = std::fs::read_to_string(&corpus_path).expect("read the corpus");
    let corpus: Value = serde_json::from_str(&corpus_text).expect("corpus JSON");

    let mut child = std::process::Command::new(component_bin("csi-translate"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start csi-translate");
    child.stdin.take().expect("stdin").write_all(corpus_text.as_bytes()).expect("write the corpus");
    let out = child.wait_with_output().expect("csi-translate");
    assert!(out.status.success(), "csi-translate failed");
    let theirs: Value = serde_json::from_slice(&out.stdout).expect("csi-translate output");

    let mut failures = Vec::new();
    let mut plugins_seen = BTreeSet::new();
    let mut count = 0;
    for (section, cases) in corpus.as_object().expect("corpus object") {
        for case in cases.as_array().expect("section list") {
            let name = case["name"].as_str().expect("case name");
            let mine = match section.as_str() {
                "pvs" => {
                    let pv: PersistentVolume = serde_json::from_value(case["pv"].clone()).expect("pv");
                    if let Some(p) = pv.spec.as_ref().and_then(Plugin::of_spec) {
                        plugins_seen.insert(format!("pv:{p:?}"));
                    }
                    ours(migration::in_tree_pv_to_csi(&pv))
                }
                "csiPvs" => {
                    let pv: PersistentVolume = serde_json::from_value(case["pv"].clone()).expect("pv");
                    if let Some(p) =
                        pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| Plugin::for_driver(&c.driver))
                    {
                        plugins_seen.insert(format!("csi:{p:?}"));
                    }
                    ours(migration::csi_pv_to_in_tree(&pv))
                }
                "classes" => {
                    let sc: StorageClass = serde_json::from_value(case["class"].clone()).expect("class");
                    let plugin = case["plugin"].as_str().expect("plugin");
                    if let Some(p) = Plugin::for_in_tree_name(plugin) {
                        plugins_seen.insert(format!("class:{p:?}"));
                    }
                    ours(migration::in_tree_class_to_csi(plugin, &sc))
                }
                "inline" => {
                    let v: Volume = serde_json::from_value(case["volume"].clone()).expect("volume");
                    if let Some(p) = Plugin::of_volume(&v) {
                        plugins_seen.insert(format!("inline:{p:?}"));
                    }
                    ours(migration::inline_volume_to_csi(&v, case["podNamespace"].as_str().unwrap_or_default()))
                }
                "repair" => {
                    let driver = case["driver"].as_str().expect("driver");
                    if let Some(p) = Plugin::for_driver(driver) {
                        plugins_seen.insert(format!("repair:{p:?}"));
                    }
                    let (handle, node) = (case["volumeHandle"].as_str(), case["nodeId"].as_str());
                    ours(migration::repair_volume_handle(driver, handle.expect("volumeHandle"), node.expect("nodeId")))
                }
                other => panic!("unknown corpus section {other}"),
            };
            count += 1;
            let want = &theirs[section][name];
            match (want.get("error"), &mine) {
                (Some(e), Ok(got)) => failures.push(format!("{section}/{name}: library failed ({e}), we gave {got}")),
                (Some(_), Err(_)) => {}
                (None, Err(e)) => {
                    failures.push(format!("{section}/{name}: we failed ({e}), library gave {}", want["result"]))
                }
                (None, Ok(got)) => {
                    let (w, g) = (normalized(&want["result"]), normalized(got));
                    if w != g {
                        failures.push(format!(
                            "{section}/{name}:\n  library: {}\n  ours:    {}",
                            w.unwrap_or_default(),
                            g.unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {count} cases differ:\n{}", failures.len(), failures.join("\n"));
    // Every GA plugin in every direction.
    for kind in ["pv", "csi", "class", "inline", "repair"] {
        for p in Plugin::ALL {
            assert!(plugins_seen.contains(&format!("{kind}:{p:?}")), "the corpus has no {kind} case for {p:?}");
        }
    }
    eprintln!("{count} cases equal to csi-translation-lib");
}
