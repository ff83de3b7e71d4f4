//! Reading CSI secrets. Values never reach a log.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

/// The data of Secret `namespace/name` as strings (upstream's error text on failure).
pub async fn secret_data(client: &Client, name: &str, namespace: &str) -> Result<HashMap<String, String>, String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("error getting secret {name} in namespace {namespace}: {}", super::error_text(&e)))?;
    secret_strings(name, namespace, secret.data.unwrap_or_default())
}

/// The values as strings. CSI secrets are proto `string`s: a value that is
/// not UTF-8 is refused naming the Secret and the key (never the value), where
/// a lossy conversion would hand the driver a silently altered credential.
pub fn secret_strings(
    name: &str,
    namespace: &str,
    data: std::collections::BTreeMap<String, k8s_openapi::ByteString>,
) -> Result<HashMap<String, String>, String> {
    data.into_iter()
        .map(|(k, v)| match String::from_utf8(v.0) {
            Ok(text) => Ok((k, text)),
            Err(_) => Err(format!(
                "secret {name} in namespace {namespace}: the value of key {k:?} is not valid UTF-8 text, which a CSI secret must be"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn values_must_be_utf8_and_the_error_names_secret_and_key_only() {
        let data = |v: &[u8]| [("password".to_string(), ByteString(v.to_vec()))].into();
        let ok = secret_strings("creds", "ns", data("hunter2 é".as_bytes())).expect("utf-8");
        assert_eq!(ok["password"], "hunter2 é");
        let err = secret_strings("creds", "ns", data(b"hunter\xff2")).expect_err("not utf-8");
        assert_eq!(
            err,
            "secret creds in namespace ns: the value of key \"password\" is not valid UTF-8 text, which a CSI secret must be"
        );
        assert!(secret_strings("creds", "ns", Default::default()).expect("empty").is_empty());
    }
}
