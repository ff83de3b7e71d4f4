//! The names csi-translation-lib (CSI migration) defines: the in-tree
//! volume plugins' names, the zone and region labels it rewrites, and the
//! class parameters it writes.

/// `kubernetes.io/aws-ebs`.
pub const AWS_EBS: &str = "kubernetes.io/aws-ebs";
/// `kubernetes.io/gce-pd`.
pub const GCE_PD: &str = "kubernetes.io/gce-pd";
/// `kubernetes.io/azure-disk`.
pub const AZURE_DISK: &str = "kubernetes.io/azure-disk";
/// `kubernetes.io/azure-file`.
pub const AZURE_FILE: &str = "kubernetes.io/azure-file";
/// `kubernetes.io/cinder`.
pub const CINDER: &str = "kubernetes.io/cinder";
/// `kubernetes.io/vsphere-volume`.
pub const VSPHERE: &str = "kubernetes.io/vsphere-volume";
/// `kubernetes.io/portworx-volume`.
pub const PORTWORX: &str = "kubernetes.io/portworx-volume";

/// The PV annotation of an Azure File volume's resource group.
pub const AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";

/// `topology.kubernetes.io/zone`.
pub const ZONE_GA: &str = "topology.kubernetes.io/zone";
/// `topology.kubernetes.io/region`.
pub const REGION_GA: &str = "topology.kubernetes.io/region";
/// `failure-domain.beta.kubernetes.io/zone`.
pub const ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// `failure-domain.beta.kubernetes.io/region`.
pub const REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
