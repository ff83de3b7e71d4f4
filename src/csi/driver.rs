//! What the driver said about itself: name, version, capabilities.

use std::sync::Arc;

use super::proto::csi::v1::{
    self as csi, ControllerServiceCapability, PluginCapability, controller_service_capability, plugin_capability,
};

/// Discovered once per connection and shared by every module.
#[derive(Clone, Debug, PartialEq)]
pub struct DriverInfo {
    /// `GetPluginInfo.name`.
    pub name: Arc<str>,
    /// `GetPluginInfo.vendor_version`.
    pub vendor_version: String,
    /// `GetPluginCapabilities`.
    pub plugin_capabilities: Vec<PluginCapability>,
    /// `ControllerGetCapabilities`, empty without the controller service.
    pub controller_capabilities: Vec<ControllerServiceCapability>,
}

impl DriverInfo {
    /// A driver with these capabilities (for tests and tools).
    pub fn with_capabilities(
        name: &str,
        services: &[plugin_capability::service::Type],
        rpcs: &[controller_service_capability::rpc::Type],
    ) -> DriverInfo {
        DriverInfo {
            name: Arc::from(name),
            vendor_version: String::new(),
            plugin_capabilities: services
                .iter()
                .map(|s| PluginCapability {
                    r#type: Some(plugin_capability::Type::Service(plugin_capability::Service { r#type: *s as i32 })),
                })
                .collect(),
            controller_capabilities: rpcs
                .iter()
                .map(|r| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(controller_service_capability::Rpc {
                        r#type: *r as i32,
                    })),
                })
                .collect(),
        }
    }

    /// Whether the driver advertises the plugin service `svc`.
    pub fn has_plugin_service(&self, svc: plugin_capability::service::Type) -> bool {
        self.plugin_capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(plugin_capability::Type::Service(s)) if s.r#type == svc as i32))
    }

    /// Whether the driver advertises the controller RPC capability `rpc`.
    pub fn has_controller_capability(&self, rpc: controller_service_capability::rpc::Type) -> bool {
        self.controller_capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(controller_service_capability::Type::Rpc(r)) if r.r#type == rpc as i32))
    }
}

/// The driver answered something that cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriverInfoError {
    /// Upstream's wording.
    #[error("driver name is empty")]
    EmptyName,
}

/// Checks a `GetPluginInfo` answer.
pub fn validate_plugin_info(resp: &csi::GetPluginInfoResponse) -> Result<(), DriverInfoError> {
    if resp.name.trim().is_empty() { Err(DriverInfoError::EmptyName) } else { Ok(()) }
}
