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
        self.has_controller_capability_value(rpc as i32)
    }
}

/// The raw value of the controller capability `VOLUME_CONDITION` of CSI
/// v1.12, which v1.13 removed (and reserved): prost keeps it as an `i32`.
pub const LEGACY_VOLUME_CONDITION: i32 = 11;

/// What the controller offers for volume health, in both forms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthCapabilities {
    /// The plugin service CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// LIST_VOLUMES.
    pub list_volumes: bool,
    /// GET_VOLUME.
    pub get_volume: bool,
    /// v1.12's VOLUME_CONDITION ([`LEGACY_VOLUME_CONDITION`]).
    pub volume_condition: bool,
    /// v1.13's LIST_VOLUME_HEALTH.
    pub list_volume_health: bool,
    /// v1.13's GET_VOLUME_HEALTH.
    pub get_volume_health: bool,
}

impl HealthCapabilities {
    /// The v1.12 form: conditions in `ListVolumes` or `ControllerGetVolume`.
    pub fn legacy(&self) -> bool {
        self.controller_service && self.volume_condition && (self.list_volumes || self.get_volume)
    }

    /// The v1.13 form: `ControllerListVolumeHealth` or `ControllerGetVolumeHealth`.
    pub fn v1_13(&self) -> bool {
        self.controller_service && (self.list_volume_health || self.get_volume_health)
    }
}

impl DriverInfo {
    /// Whether the driver advertises the controller RPC capability of raw
    /// value `value` (also one this build's spec does not name).
    pub fn has_controller_capability_value(&self, value: i32) -> bool {
        self.controller_capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(controller_service_capability::Type::Rpc(r)) if r.r#type == value))
    }

    /// What the driver offers for volume health.
    pub fn health_capabilities(&self) -> HealthCapabilities {
        use controller_service_capability::rpc::Type;
        HealthCapabilities {
            controller_service: self.has_plugin_service(plugin_capability::service::Type::ControllerService),
            list_volumes: self.has_controller_capability(Type::ListVolumes),
            get_volume: self.has_controller_capability(Type::GetVolume),
            volume_condition: self.has_controller_capability_value(LEGACY_VOLUME_CONDITION),
            list_volume_health: self.has_controller_capability(Type::ListVolumeHealth),
            get_volume_health: self.has_controller_capability(Type::GetVolumeHealth),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use controller_service_capability::rpc::Type as Rpc;
    use plugin_capability::service::Type as Svc;

    /// A driver advertising the controller service (or not) and these raw
    /// controller capabilities.
    fn driver(controller: bool, rpcs: &[i32]) -> DriverInfo {
        let services: &[Svc] = if controller { &[Svc::ControllerService] } else { &[] };
        let mut d = DriverInfo::with_capabilities("d", services, &[]);
        d.controller_capabilities = rpcs
            .iter()
            .map(|r| ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(controller_service_capability::Rpc {
                    r#type: *r,
                })),
            })
            .collect();
        d
    }

    #[test]
    fn health_capabilities_in_both_forms() {
        let (list, get, cond) = (Rpc::ListVolumes as i32, Rpc::GetVolume as i32, LEGACY_VOLUME_CONDITION);
        let (list_h, get_h) = (Rpc::ListVolumeHealth as i32, Rpc::GetVolumeHealth as i32);
        // (controller service, capabilities, legacy form, v1.13 form)
        let cases: &[(bool, &[i32], bool, bool)] = &[
            (true, &[], false, false),
            (true, &[list, cond], true, false),
            (true, &[get, cond], true, false),
            (true, &[list, get], false, false),
            (true, &[cond], false, false),
            (true, &[list_h], false, true),
            (true, &[get_h], false, true),
            (true, &[list, cond, list_h, get_h], true, true),
            (false, &[list, cond, list_h, get_h], false, false),
        ];
        for (controller, rpcs, legacy, v1_13) in cases {
            let caps = driver(*controller, rpcs).health_capabilities();
            assert_eq!((caps.legacy(), caps.v1_13()), (*legacy, *v1_13), "{controller} {rpcs:?}: {caps:?}");
        }
        let all = driver(true, &[list, get, cond, list_h, get_h]).health_capabilities();
        assert_eq!(
            all,
            HealthCapabilities {
                controller_service: true,
                list_volumes: true,
                get_volume: true,
                volume_condition: true,
                list_volume_health: true,
                get_volume_health: true,
            }
        );
        // v1.13 reserves 11: no value of this build's enum is the legacy one.
        assert!(Rpc::try_from(LEGACY_VOLUME_CONDITION).is_err());
    }
}
