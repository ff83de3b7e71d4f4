//! The nodes world: kube-scheduler with hollow kubelets, and the real node
//! (containerd, runc and the kubelet; one per host, so `real_node` runs alone).
//!
//! One binary per world; integration/scripts/run-tests.py runs each module in
//! a process of its own (`<binary> --exact <its tests>`).

mod kubelet_registration;
mod node_workflow;
mod provisioner_node_deployment;
mod real_node;
