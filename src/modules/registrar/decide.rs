//! Pure decisions of the registrar.

use std::time::Duration;

use crate::{compat::registrar as upstream, csi::proto::pluginregistration::PluginInfo, healthz::HealthReport};

/// `GetInfo` answer for the kubelet.
pub fn plugin_info(driver: &str, kubelet_registration_path: &str) -> PluginInfo {
    PluginInfo {
        r#type: upstream::PLUGIN_TYPE_CSI.to_string(),
        name: driver.to_string(),
        endpoint: kubelet_registration_path.to_string(),
        supported_versions: upstream::SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }
}

/// What the kubelet told us.
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// `plugin_registered: true`.
    Accepted,
    /// `plugin_registered: false`, with the kubelet's error.
    Rejected(String),
}

/// Interprets `NotifyRegistrationStatus`.
pub fn registration(plugin_registered: bool, error: &str) -> Registration {
    if plugin_registered { Registration::Accepted } else { Registration::Rejected(error.to_string()) }
}

/// What is at the registration socket path.
#[derive(Debug, PartialEq, Eq)]
pub enum SocketState {
    /// Nothing.
    Missing,
    /// A file that is not a socket.
    NotASocket,
    /// `stat` failed.
    StatError(String),
    /// A socket: the self-check decides.
    Present,
}

/// The `/healthz` answer before dialling the socket; `None` means: dial it.
pub fn socket_health(state: &SocketState, path: &str) -> Option<HealthReport> {
    match state {
        SocketState::Missing => Some(HealthReport::failed(404, upstream::BODY_SOCKET_MISSING)),
        SocketState::NotASocket => Some(HealthReport::failed(500, format!("{path} is not a unix domain socket"))),
        SocketState::StatError(e) => Some(HealthReport::failed(500, e.clone())),
        SocketState::Present => None,
    }
}

/// The `/healthz` answer from the self-check's `GetInfo`.
pub fn self_check_health(answered_name: &str, driver: &str) -> HealthReport {
    if answered_name == driver {
        HealthReport::ok()
    } else {
        HealthReport::failed(500, upstream::body_wrong_name(answered_name))
    }
}

/// Delay before the socket is recreated after the kubelet rejected the
/// registration: 1 s doubling to 5 min (the kubelet retries on socket
/// creation, so this bounds how hard a broken registration is retried).
pub fn recreate_delay(consecutive_rejections: u32) -> Duration {
    let exp = consecutive_rejections.saturating_sub(1).min(16);
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_info_matches_upstream() {
        let info = plugin_info("hostpath.csi.k8s.io", "/var/lib/kubelet/plugins/csi-hostpath/csi.sock");
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "hostpath.csi.k8s.io");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/csi-hostpath/csi.sock");
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
    }

    #[test]
    fn registration_status() {
        assert_eq!(registration(true, ""), Registration::Accepted);
        assert_eq!(registration(false, "bad version"), Registration::Rejected("bad version".into()));
    }

    #[test]
    fn health_before_dialling() {
        let table = [
            (SocketState::Missing, Some((404, "registration socket does not exist".to_string()))),
            (SocketState::NotASocket, Some((500, "/r/x-reg.sock is not a unix domain socket".to_string()))),
            (SocketState::StatError("permission denied".into()), Some((500, "permission denied".to_string()))),
            (SocketState::Present, None),
        ];
        for (state, want) in table {
            let got = socket_health(&state, "/r/x-reg.sock").map(|r| (r.status, r.body));
            assert_eq!(got, want, "{state:?}");
        }
    }

    #[test]
    fn health_from_self_check() {
        assert_eq!(self_check_health("d", "d"), HealthReport::ok());
        assert_eq!(self_check_health("other", "d"), HealthReport::failed(500, "invalid driver name other"));
    }

    #[test]
    fn recreate_backoff() {
        let got: Vec<u64> = (1..=12).map(|n| recreate_delay(n).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(recreate_delay(u32::MAX).as_secs(), 300);
    }
}
