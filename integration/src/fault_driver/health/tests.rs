use std::time::Duration;

use csi_sidecar::csi::{Connection, DriverInfo, HealthCapabilities, VolumeHealth};

use super::*;
use crate::fault_driver::Transport;

const T: Duration = Duration::from_secs(10);

fn cond(status: HealthStatus, reason: &str, message: &str) -> HealthCondition {
    HealthCondition { status, reason: reason.into(), message: message.into() }
}

#[test]
fn pages_follow_the_token() {
    let items: Vec<u32> = (0..5).collect();
    assert_eq!(page(&items, 0, "").expect("all"), (items.clone(), String::new()));
    assert_eq!(page(&items, 2, "").expect("first"), (vec![0, 1], "2".to_string()));
    assert_eq!(page(&items, 2, "2").expect("second"), (vec![2, 3], "4".to_string()));
    assert_eq!(page(&items, 2, "4").expect("last"), (vec![4], String::new()));
    assert_eq!(page(&items, 9, "5").expect("past the end"), (vec![], String::new()));
    assert_eq!(page(&items, 1, "x").expect_err("garbage").code(), tonic::Code::Aborted);
    assert_eq!(page(&items, 1, "6").expect_err("beyond").code(), tonic::Code::Aborted);
    assert_eq!(page(&items, -1, "").expect_err("negative").code(), tonic::Code::InvalidArgument);
}

#[test]
fn the_legacy_condition_is_the_first_message() {
    assert_eq!(legacy_condition(&[]), LegacyCondition { abnormal: false, message: String::new() });
    let two = [cond(HealthStatus::Degraded, "Slow", "one path left"), cond(HealthStatus::DataLoss, "Gone", "lost")];
    assert_eq!(legacy_condition(&two), LegacyCondition { abnormal: true, message: "one path left".into() });
}

#[test]
fn each_form_adds_its_capabilities_once() {
    use csi::controller_service_capability::rpc::Type;
    let (list, get) = (Type::ListVolumes as i32, Type::GetVolume as i32);
    let (list_h, get_h) = (Type::ListVolumeHealth as i32, Type::GetVolumeHealth as i32);
    let cases: [(HealthForms, Vec<i32>); 5] = [
        (HealthForms::NONE, vec![list]),
        (HealthForms::LEGACY, vec![list, LEGACY_VOLUME_CONDITION, get]),
        (HealthForms { legacy_get: true, ..HealthForms::NONE }, vec![list, LEGACY_VOLUME_CONDITION, get]),
        (HealthForms::V1_13, vec![list, list_h, get_h]),
        (HealthForms::BOTH, vec![list, LEGACY_VOLUME_CONDITION, get, list_h, get_h]),
    ];
    for (forms, want) in cases {
        let mut rpcs = vec![list];
        forms.add_capabilities(&mut rpcs);
        assert_eq!(rpcs, want, "{forms:?}");
    }
}

/// A driver on a fresh socket and a csi-sidecar connection to it.
fn driver(dir: &tempfile::TempDir, health: HealthForms) -> (FaultDriver, Connection) {
    let socket = dir.path().join("csi.sock");
    let script = Script { controller: true, health, ..Script::default() };
    let driver = FaultDriver::start(&socket, Transport::Grpc, script);
    let conn = Connection::new(&socket.display().to_string()).expect("address");
    (driver, conn)
}

async fn health_capabilities(conn: &Connection) -> HealthCapabilities {
    let plugin = conn.get_plugin_capabilities(T).await.expect("plugin capabilities");
    let controller = conn.controller_get_capabilities(T).await.expect("controller capabilities");
    let info = DriverInfo {
        name: "fault".into(),
        vendor_version: String::new(),
        plugin_capabilities: plugin.capabilities,
        controller_capabilities: controller.capabilities,
    };
    info.health_capabilities()
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::SeqCst)
}

#[tokio::test]
async fn the_legacy_form_answers_conditions_in_list_and_get() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, conn) = driver(&dir, HealthForms::LEGACY);
    let caps = health_capabilities(&conn).await;
    assert!(caps.legacy() && !caps.v1_13(), "{caps:?}");
    driver.set_volume_health("vol-a", vec![cond(HealthStatus::Inaccessible, "NoPath", "no path to the volume")]);
    driver.set_volume_health("vol-b", vec![]);
    driver.published.lock().expect("published").insert("vol-c".into(), vec!["node-1".into()]);

    let (entries, next) = conn.list_volumes_with_condition(T, 0, String::new()).await.expect("list");
    assert_eq!(next, "");
    let abnormal = |m: &str| Some(LegacyCondition { abnormal: true, message: m.into() });
    let healthy = Some(LegacyCondition::default());
    assert_eq!(
        entries,
        [
            ("vol-a".to_string(), abnormal("no path to the volume")),
            ("vol-b".to_string(), healthy.clone()),
            ("vol-c".to_string(), healthy.clone()),
        ]
    );
    // The v1.13 decoding of the same answer (the attacher's call) still works.
    let spec = conn.list_volumes(T, csi::ListVolumesRequest::default()).await.expect("v1.13 list");
    let status = spec.entries[2].status.as_ref().expect("status");
    assert_eq!(status.published_node_ids, ["node-1"]);

    assert_eq!(
        conn.controller_get_volume_with_condition(T, "vol-a".into()).await.expect("get"),
        abnormal("no path to the volume")
    );
    assert_eq!(conn.controller_get_volume_with_condition(T, "vol-c".into()).await.expect("get"), healthy);
    let missing = conn.controller_get_volume_with_condition(T, "nope".into()).await.expect_err("unknown volume");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // The v1.13 calls are not served in this form.
    let err = conn.controller_list_volume_health(T, 0, String::new()).await.expect_err("not advertised");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    // Recovery shows in the next answer.
    driver.set_volume_health("vol-a", vec![]);
    assert_eq!(conn.controller_get_volume_with_condition(T, "vol-a".into()).await.expect("get"), healthy);

    assert_eq!(count(&driver.counters.list_volumes), 2);
    assert_eq!(count(&driver.counters.controller_get_volumes), 4);
    assert_eq!(count(&driver.counters.list_volume_healths), 1);
    assert_eq!(count(&driver.counters.get_volume_healths), 0);
}

#[tokio::test]
async fn the_v1_13_form_answers_health_lists_and_gets_and_switches_at_run_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, conn) = driver(&dir, HealthForms::V1_13);
    let caps = health_capabilities(&conn).await;
    assert!(!caps.legacy() && caps.v1_13() && caps.list_volume_health && caps.get_volume_health, "{caps:?}");
    let degraded =
        vec![cond(HealthStatus::Degraded, "OnePathLeft", "1 of 2 paths"), cond(HealthStatus::DataLoss, "Lost", "")];
    driver.set_volume_health("vol-1", degraded.clone());
    driver.set_volume_health("vol-2", vec![cond(HealthStatus::Inaccessible, "Down", "array down")]);
    driver.set_volume_health("vol-3", vec![]);

    // Only the abnormal volumes, in pages of one.
    let (first, token) = conn.controller_list_volume_health(T, 1, String::new()).await.expect("page 1");
    assert_eq!(first, [VolumeHealth { volume_id: "vol-1".into(), conditions: degraded.clone() }]);
    let (second, token) = conn.controller_list_volume_health(T, 1, token).await.expect("page 2");
    assert_eq!(second.iter().map(|h| h.volume_id.as_str()).collect::<Vec<_>>(), ["vol-2"]);
    assert_eq!(token, "");
    // Healthy ones too when the script says so.
    driver.update(|s| s.health.list_healthy = true);
    let (all, _) = conn.controller_list_volume_health(T, 0, String::new()).await.expect("all");
    assert_eq!(
        all.iter().map(|h| (h.volume_id.as_str(), h.is_healthy())).collect::<Vec<_>>(),
        [("vol-1", false), ("vol-2", false), ("vol-3", true)]
    );

    let got = conn.controller_get_volume_health(T, "vol-1".into()).await.expect("get");
    assert_eq!(got, VolumeHealth { volume_id: "vol-1".into(), conditions: degraded });
    let missing = conn.controller_get_volume_health(T, "nope".into()).await.expect_err("unknown");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // No legacy condition in this form: the same RPCs answer without one.
    let (entries, _) = conn.list_volumes_with_condition(T, 0, String::new()).await.expect("list");
    assert!(entries.is_empty(), "only published volumes without the legacy list form: {entries:?}");
    let err = conn.controller_get_volume_with_condition(T, "vol-1".into()).await.expect_err("not advertised");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    // Both forms, switched while running.
    driver.set_health_forms(HealthForms::BOTH);
    let caps = health_capabilities(&conn).await;
    assert!(caps.legacy() && caps.v1_13(), "{caps:?}");
    let legacy = conn.controller_get_volume_with_condition(T, "vol-2".into()).await.expect("legacy get");
    assert_eq!(legacy, Some(LegacyCondition { abnormal: true, message: "array down".into() }));
    driver.set_health_forms(HealthForms::NONE);
    let caps = health_capabilities(&conn).await;
    assert!(!caps.legacy() && !caps.v1_13(), "{caps:?}");
    let err = conn.controller_get_volume_health(T, "vol-1".into()).await.expect_err("off");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    assert_eq!(count(&driver.counters.list_volume_healths), 3);
    assert_eq!(count(&driver.counters.get_volume_healths), 3);
    assert_eq!(count(&driver.counters.list_volumes), 1);
    assert_eq!(count(&driver.counters.controller_get_volumes), 2);
}

#[tokio::test]
async fn other_controller_calls_still_reach_the_generated_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, conn) = driver(&dir, HealthForms::BOTH);
    let req = csi::CreateVolumeRequest { name: "pvc-1".into(), ..Default::default() };
    let created = conn.create_volume(T, req).await.expect("create").volume.expect("volume");
    assert_eq!(driver.creates(), 1);
    // A created volume exists for the health calls, healthy.
    let got = conn.controller_get_volume_health(T, created.volume_id.clone()).await.expect("get");
    assert!(got.is_healthy() && got.volume_id == created.volume_id, "{got:?}");
    let (entries, _) = conn.list_volumes_with_condition(T, 0, String::new()).await.expect("list");
    assert_eq!(entries, [(created.volume_id, Some(LegacyCondition::default()))]);
}
