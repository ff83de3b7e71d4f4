//! The configuration files of a real node, as pure functions of its
//! directories and ports: containerd's `config.toml`, the loopback-only CNI
//! network (and its `lo-eth0` plugin), and the kubelet's
//! `KubeletConfiguration`.

use std::path::{Path, PathBuf};

/// containerd's sandbox (pause) image: imported before the kubelet starts,
/// never pulled.
pub const PAUSE_IMAGE: &str = "localhost/pause:local";

/// Where one real node keeps everything it creates. Everything but the
/// cgroup root lives under [`NodeDirs::base`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDirs {
    /// The node's own directory (short: unix socket paths live inside).
    pub base: PathBuf,
}

impl NodeDirs {
    /// containerd's gRPC socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.base.join("c.sock")
    }
    /// containerd's `config.toml`.
    pub fn containerd_config(&self) -> PathBuf {
        self.base.join("containerd.toml")
    }
    /// containerd's root (images, snapshots).
    pub fn containerd_root(&self) -> PathBuf {
        self.base.join("croot")
    }
    /// containerd's state (tasks, rootfs mounts, sandbox network namespaces).
    pub fn containerd_state(&self) -> PathBuf {
        self.base.join("cstate")
    }
    /// The CNI configuration directory (the loopback-only network).
    pub fn cni_conf(&self) -> PathBuf {
        self.base.join("cni")
    }
    /// The CNI plugins containerd runs: Debian's `loopback` (a link) and
    /// [`CNI_LO_ETH0_PLUGIN`].
    pub fn cni_bin(&self) -> PathBuf {
        self.base.join("cni-bin")
    }
    /// The kubelet's `--root-dir`.
    pub fn kubelet_root(&self) -> PathBuf {
        self.base.join("kubelet")
    }
    /// The kubelet's `KubeletConfiguration` file.
    pub fn kubelet_config(&self) -> PathBuf {
        self.base.join("kubelet.yaml")
    }
    /// The containers' log files (`podLogsDir`).
    pub fn pod_logs(&self) -> PathBuf {
        self.base.join("pod-logs")
    }
}

/// containerd's configuration: its own root, state, sockets, runc root and
/// CNI configuration; the CRI plugin as the issue's experiments found it
/// working on this kind of host (no CAP_SYS_RESOURCE, PID 1 not systemd, no
/// network but loopback).
pub fn containerd_toml(dirs: &NodeDirs) -> String {
    let d = |p: PathBuf| p.display().to_string();
    let sock = d(dirs.containerd_socket());
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = d(dirs.containerd_root()),
        state = d(dirs.containerd_state()),
        opt = d(dirs.base.join("copt")),
        runc = d(dirs.base.join("runc")),
        cni_bin = d(dirs.cni_bin()),
        cni_conf = d(dirs.cni_conf()),
    )
}

/// Debian's containernetworking-plugins (`loopback` is linked from here).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The only network: loopback, and `lo-eth0` after it. A pod of its own
/// network namespace gets only its own `lo`; nothing may get an address
/// outside 127.0.0.0/8.
pub const CNI_LOOPBACK_CONFLIST: &str =
    r#"{"cniVersion":"1.0.0","name":"loopback-only","plugins":[{"type":"loopback"},{"type":"lo-eth0"}]}"#;

/// The `lo-eth0` CNI plugin: it reports an `eth0` with 127.0.0.1/8 and
/// creates no device and no address. containerd 1.6 refuses a sandbox whose
/// network result has no address on `eth0` ("failed to find network info
/// for sandbox"); with this, pods that are not `hostNetwork` run, each in
/// a network namespace with nothing but its own loopback (reached through
/// the kubelet: logs, exec, port-forward, shared volumes). Their pod IP is
/// 127.0.0.1, as a host-network pod's.
pub const CNI_LO_ETH0_PLUGIN: &str = r#"#!/bin/sh
# lo-eth0: reports eth0 as 127.0.0.1/8; creates no device, no address.
cat >/dev/null
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"interface":0,"address":"127.0.0.1/8"}]}\n' "${CNI_IFNAME:-eth0}" "$CNI_NETNS" ;;
DEL | CHECK | GC | STATUS) ;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}\n' ;;
*)
	printf '{"cniVersion":"1.0.0","code":4,"msg":"unknown CNI_COMMAND %s"}\n' "$CNI_COMMAND"
	exit 4
	;;
esac
"#;

/// What the kubelet's configuration depends on besides the directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletSettings {
    /// The kubelet's HTTPS port (on 127.0.0.1).
    pub port: u16,
    /// Its `/healthz` port (on 127.0.0.1).
    pub healthz_port: u16,
    /// The CA of client certificates it accepts.
    pub client_ca: PathBuf,
    /// Its serving certificate and key (for 127.0.0.1, signed by the
    /// cluster's server CA, which the apiserver verifies it with).
    pub serving: (PathBuf, PathBuf),
    /// The cgroup (cgroupfs form, `/name`) the pods' cgroups go under.
    pub cgroup_root: String,
}

/// The kubelet's `KubeletConfiguration`: every listener on 127.0.0.1, the
/// runtime through the node's containerd, cgroup v1 with the cgroupfs
/// driver under its own cgroup root, every directory it writes inside the
/// node's directory, no image garbage collection (the pause image is not
/// pinned by containerd 1.6) and eviction thresholds a shared test machine
/// does not trip.
pub fn kubelet_yaml(dirs: &NodeDirs, s: &KubeletSettings) -> String {
    let d = |p: &Path| p.display().to_string();
    let endpoint = format!("unix://{}", d(&dirs.containerd_socket()));
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: AlwaysAllow
tlsCertFile: {tls_cert}
tlsPrivateKeyFile: {tls_key}
containerRuntimeEndpoint: {endpoint}
imageServiceEndpoint: {endpoint}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
podLogsDir: {pod_logs}
volumePluginDir: {flex}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
resolvConf: ""
serializeImagePulls: false
shutdownGracePeriod: 0s
"#,
        port = s.port,
        healthz = s.healthz_port,
        client_ca = d(&s.client_ca),
        tls_cert = d(&s.serving.0),
        tls_key = d(&s.serving.1),
        cgroup_root = s.cgroup_root,
        pod_logs = d(&dirs.pod_logs()),
        flex = d(&dirs.base.join("flexvolume")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> NodeDirs {
        NodeDirs { base: PathBuf::from("/tmp/csn-1/r1") }
    }

    fn settings() -> KubeletSettings {
        KubeletSettings {
            port: 20250,
            healthz_port: 20248,
            client_ca: PathBuf::from("/x/client-ca.crt"),
            serving: (PathBuf::from("/x/kubelet.crt"), PathBuf::from("/x/kubelet.key")),
            cgroup_root: "/csn-1-r1".into(),
        }
    }

    /// Every address either configuration names is 127.0.0.1 or a path:
    /// nothing listens on, or sends to, another address.
    #[test]
    fn the_configurations_name_no_address_but_loopback() {
        let text = format!("{}\n{}", containerd_toml(&dirs()), kubelet_yaml(&dirs(), &settings()));
        let ipv4 = regex_lite_ipv4(&text);
        assert!(!ipv4.is_empty(), "the configurations name no address at all");
        for ip in ipv4 {
            assert_eq!(ip, "127.0.0.1", "a non-loopback address in:\n{text}");
        }
        assert!(!text.contains("0.0.0.0"));
    }

    /// Every path the two configurations give the runtime and the kubelet to
    /// write lies inside the node's directory (clean-up removes exactly it).
    #[test]
    fn every_written_path_is_inside_the_node_directory() {
        let toml = containerd_toml(&dirs());
        let yaml = kubelet_yaml(&dirs(), &settings());
        for line in toml.lines().chain(yaml.lines()) {
            let Some(path) = line.split(['"', ' ']).find(|w| w.starts_with('/') || w.starts_with("unix:///")) else {
                continue;
            };
            let path = path.trim_start_matches("unix://");
            let read_only = ["client-ca.crt", "kubelet.crt", "kubelet.key"].iter().any(|f| path.ends_with(f))
                || path.starts_with("/csn-");
            assert!(read_only || path.starts_with("/tmp/csn-1/r1/"), "{path} (line `{line}`) is outside the node");
        }
        assert!(yaml.contains("cgroupRoot: /csn-1-r1"));
    }

    fn regex_lite_ipv4(text: &str) -> Vec<String> {
        text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|w| w.split('.').count() == 4 && w.split('.').all(|p| !p.is_empty() && p.parse::<u8>().is_ok()))
            .map(str::to_string)
            .collect()
    }
}
