//! Reading CSI secrets. Values never reach a log.

use std::collections::HashMap;

use ::kube::{Api, Client};
use k8s_openapi::api::core::v1::Secret;

/// The data of Secret `namespace/name` as strings (upstream's error text on failure).
pub async fn secret_data(client: &Client, name: &str, namespace: &str) -> Result<HashMap<String, String>, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("error getting secret {name} in namespace {namespace}: {}", super::error_text(&e)))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}
