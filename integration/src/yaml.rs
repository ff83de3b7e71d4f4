//! The YAML files of `manifests/`, read as JSON values (tests of the
//! manifests and of the RBAC).

use std::path::Path;

use serde_json::Value;

/// The YAML documents of a file (empty documents dropped); panics naming the
/// file if it cannot be read or parsed.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// A document's `kind` ("" if none).
pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}
