//! A Node as cached for the health monitor's node watcher: its name and
//! its `Ready` condition, nothing else (a Node's status carries its image
//! list and much more).

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Resource;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;

use super::cached::resource_as;

/// The `Ready` condition of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReady {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// RFC 3339, as the apiserver wrote it.
    pub last_transition_time: Option<String>,
}

/// Name, UID and resourceVersion, and the `Ready` condition.
#[derive(Clone, Debug, Default)]
pub struct CachedNode {
    pub metadata: ObjectMeta,
    pub ready: Option<NodeReady>,
}

resource_as!(CachedNode, Node);

impl<'de> Deserialize<'de> for CachedNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Condition {
            #[serde(rename = "type")]
            type_: String,
            status: String,
            last_transition_time: Option<String>,
        }
        #[derive(Deserialize)]
        struct Status {
            #[serde(default)]
            conditions: Option<Vec<Condition>>,
        }
        #[derive(Deserialize)]
        struct Wire {
            metadata: Option<Meta>,
            status: Option<Status>,
        }
        let w = Wire::deserialize(d)?;
        let m = w.metadata.unwrap_or(Meta { name: None, uid: None, resource_version: None });
        let ready = w
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| NodeReady { status: c.status, last_transition_time: c.last_transition_time });
        Ok(CachedNode {
            metadata: ObjectMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                ..Default::default()
            },
            ready,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_its_name_and_ready_condition_only() {
        let n: CachedNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"}},
            "status": {
                "images": [{"names": ["x"], "sizeBytes": 1}],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-05T10:00:00Z"}
                ]
            }
        }))
        .unwrap();
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert!(n.metadata.labels.is_none());
        let r = n.ready.unwrap();
        assert_eq!((r.status.as_str(), r.last_transition_time.as_deref()), ("False", Some("2026-12-05T10:00:00Z")));
        let bare: CachedNode = serde_json::from_value(serde_json::json!({"metadata": {"name": "n2"}})).unwrap();
        assert!(bare.ready.is_none());
    }
}
