//! VolumeAttributesClass in provisioning (upstream `prepareProvision`): a
//! claim naming a class gets the class's parameters as CreateVolume's
//! `mutable_parameters`, from a driver that can modify volumes, with a class
//! of that driver. Pure; the executor reads the class (a live GET, as
//! upstream: its role has `get` on the kind, no watch).

use std::collections::HashMap;

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::VolumeAttributesClass};

use crate::csi::{DriverInfo, proto::csi::v1::controller_service_capability::rpc::Type as Rpc};

/// The feature gate.
pub const GATE: &str = "VolumeAttributesClass";

/// Why a claim's class cannot be used (upstream's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VacError {
    /// The driver does not advertise MODIFY_VOLUME.
    #[error("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported")]
    NoModifyCapability,
    /// The class belongs to another driver.
    #[error("VAC {class} referenced in PVC is for driver {class_driver} which does not match driver name {driver}")]
    OtherDriver {
        /// The class.
        class: String,
        /// Its `driverName`.
        class_driver: String,
        /// This provisioner's driver.
        driver: String,
    },
}

/// Whether the gate is on: an explicit `--feature-gates` value wins, else on
/// when the apiserver serves the API (upstream turns the default off for a
/// cluster without it). `explicit`: the gate's value if given.
pub fn gate(explicit: Option<bool>, api_served: bool) -> bool {
    explicit.unwrap_or(api_served)
}

/// The class a claim asks for, with the gate on (`None`: none, or empty).
pub fn class_name(pvc: &PersistentVolumeClaim, gate_on: bool) -> Option<&str> {
    if !gate_on {
        return None;
    }
    pvc.spec.as_ref().and_then(|s| s.volume_attributes_class_name.as_deref()).filter(|n| !n.is_empty())
}

/// The capability check upstream makes before anything else when a claim names a class.
pub fn check_driver(driver: &DriverInfo) -> Result<(), VacError> {
    if driver.has_controller_capability(Rpc::ModifyVolume) { Ok(()) } else { Err(VacError::NoModifyCapability) }
}

/// CreateVolume's `mutable_parameters` from the class the claim names.
pub fn mutable_parameters(class: &VolumeAttributesClass, driver: &str) -> Result<HashMap<String, String>, VacError> {
    if class.driver_name != driver {
        return Err(VacError::OtherDriver {
            class: class.metadata.name.clone().unwrap_or_default(),
            class_driver: class.driver_name.clone(),
            driver: driver.to_string(),
        });
    }
    Ok(class.parameters.clone().unwrap_or_default().into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{api::core::v1::PersistentVolumeClaimSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    fn claim(class: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                volume_attributes_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn class(name: &str, driver: &str, params: &[(&str, &str)]) -> VolumeAttributesClass {
        VolumeAttributesClass {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            driver_name: driver.into(),
            parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        }
    }

    fn driver(modify: bool) -> DriverInfo {
        let rpcs: &[Rpc] =
            if modify { &[Rpc::CreateDeleteVolume, Rpc::ModifyVolume] } else { &[Rpc::CreateDeleteVolume] };
        DriverInfo::with_capabilities("d.csi", &[], rpcs)
    }

    #[test]
    fn the_gate_follows_the_flag_else_the_api() {
        for (explicit, served, on) in
            [(None, true, true), (None, false, false), (Some(true), false, true), (Some(false), true, false)]
        {
            assert_eq!(gate(explicit, served), on, "{explicit:?} {served}");
        }
    }

    #[test]
    fn class_name_only_with_the_gate_and_a_name() {
        let rows: [(Option<&str>, bool, Option<&str>); 4] = [
            (Some("gold"), true, Some("gold")),
            (Some("gold"), false, None),
            (Some(""), true, None),
            (None, true, None),
        ];
        for (name, gate_on, want) in rows {
            assert_eq!(class_name(&claim(name), gate_on), want, "{name:?} gate {gate_on}");
        }
    }

    #[test]
    fn the_driver_must_modify_volumes() {
        assert_eq!(check_driver(&driver(true)), Ok(()));
        assert_eq!(
            check_driver(&driver(false)).unwrap_err().to_string(),
            "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
        );
    }

    #[test]
    fn the_class_parameters_become_mutable_parameters_of_its_driver_only() {
        let got = mutable_parameters(&class("gold", "d.csi", &[("iops", "3000")]), "d.csi").unwrap();
        assert_eq!(got, HashMap::from([("iops".to_string(), "3000".to_string())]));
        assert_eq!(mutable_parameters(&class("empty", "d.csi", &[]), "d.csi").unwrap(), HashMap::new());
        assert_eq!(
            mutable_parameters(&class("gold", "other.csi", &[("iops", "1")]), "d.csi").unwrap_err().to_string(),
            "VAC gold referenced in PVC is for driver other.csi which does not match driver name d.csi"
        );
    }
}
