use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, LazyLock},
};

use argh::{ArgsInfo, FromArgs};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::modules::{Module, ModuleDesc, Needs, parse_flags};

#[test]
fn what_follows_an_instances_end() {
    let s = Duration::from_secs;
    let failed = Ended::Failed("boom".into());
    let cases: &[(&str, Ended, Duration, u32, Next, u32)] = &[
        ("finished by itself", Ended::Finished, s(1), 0, Next::Done, 0),
        ("bad flags exit", Ended::Config("bad".into()), s(1), 0, Next::Exit("bad".into()), 0),
        ("a lost Lease: at once", Ended::LostLease("held by b".into()), s(1), 2, Next::Restart(Duration::ZERO), 2),
        ("first failure: 1 s", failed.clone(), s(1), 0, Next::Restart(s(1)), 1),
        ("third failure: 4 s", failed.clone(), s(1), 2, Next::Restart(s(4)), 3),
        ("a panic counts as a failure", Ended::Panicked("oops".into()), s(1), 1, Next::Restart(s(2)), 2),
        ("after 10 min of running the backoff resets", failed.clone(), HEALTHY_RESET, 7, Next::Restart(s(1)), 1),
        ("just short of it, it does not", failed, HEALTHY_RESET - s(1), 7, Next::Restart(s(128)), 8),
    ];
    for (what, ended, ran_for, before, want, after) in cases {
        let mut failures = *before;
        assert_eq!(next(ended, *ran_for, &mut failures), *want, "{what}");
        assert_eq!(failures, *after, "{what}: failures");
    }
}

#[test]
fn the_backoff_doubles_from_one_second_to_five_minutes() {
    let got: Vec<u64> = (1..=12).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    assert_eq!(backoff(u32::MAX), MAX_DELAY, "no overflow");
}

#[test]
fn a_module_is_unhealthy_while_down_or_crash_looping() {
    let now = Instant::now();
    let running = |ago: Duration, failures| State::Running { since: now - ago, failures };
    let s = Duration::from_secs;
    let cases = [
        ("down", State::Down { why: "x".into() }, false),
        ("running, never failed", running(s(0), 0), true),
        ("running after two failures", running(s(0), 2), true),
        ("running after three in a row", running(s(5), CRASH_LOOP), false),
        ("...until it ran 10 min", running(HEALTHY_RESET, CRASH_LOOP), true),
    ];
    for (what, state, want) in cases {
        assert_eq!(healthy(&state, now).is_ok(), want, "{what}");
    }
}

/// What each instance of a test module does, in order (the last repeats).
#[derive(Clone, Copy, Debug)]
enum Act {
    Fail,
    Panic,
    LoseLease,
    BadConfig,
    RunUntilStopped,
}

#[derive(Default)]
struct Script {
    acts: Mutex<VecDeque<Act>>,
    /// When each instance started, and whether its scope was cancelled.
    starts: Mutex<Vec<(TokioInstant, CancellationToken)>>,
}

static SCRIPTS: LazyLock<Mutex<HashMap<String, Arc<Script>>>> = LazyLock::new(Mutex::default);

/// A module of this test only: its own row, its own flags.
#[derive(FromArgs, ArgsInfo, Debug, Clone, PartialEq)]
/// A scripted module.
struct ScriptedFlags {
    /// the script's name
    #[argh(option)]
    script: String,
}

impl Module for ScriptedFlags {
    fn validate(&self) -> Result<(), ModuleError> {
        Ok(())
    }

    fn discovery_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn run(&self, ctx: ModuleContext) -> BoxFuture<'static, Result<(), ModuleError>> {
        let script = SCRIPTS.lock().get(&self.script).cloned().expect("script");
        Box::pin(async move {
            script.starts.lock().push((TokioInstant::now(), ctx.shutdown.clone()));
            let act = {
                let mut acts = script.acts.lock();
                if acts.len() > 1 { acts.pop_front() } else { acts.front().copied() }
            };
            let module = "scripted";
            match act.expect("an act") {
                Act::Fail => Err(ModuleError::Fatal { module, message: "broken".into() }),
                Act::Panic => panic!("scripted panic"),
                Act::LoseLease => Err(ModuleError::LostLease { module, message: "held by b".into() }),
                Act::BadConfig => Err(ModuleError::Config { module, message: "no such mode".into() }),
                Act::RunUntilStopped => {
                    ctx.shutdown.cancelled().await;
                    Ok(())
                }
            }
        })
    }
}

static SCRIPTED: ModuleDesc = ModuleDesc {
    name: "scripted",
    binary_names: &[],
    replaces: "nothing",
    summary: "a test module",
    info: ScriptedFlags::get_args_info,
    parse: parse_flags::<ScriptedFlags>,
    shared: &[],
    feature_gates: &[],
    kep_names: &[],
    needs: Needs {
        kube: true,
        kubeconfig_env: false,
        default_health_port: false,
        registration_dir: false,
        listener: false,
    },
    kinds: &[],
    cluster_rules: &[],
    chart: crate::modules::ChartRow {
        values_key: "scripted",
        pods: crate::modules::Pods { controller: false, node: false },
        container: "scripted",
        port_name: "scripted",
        port: 0,
        value_rules: &[],
    },
    tool: None,
};

fn scripted(name: &str, acts: &[Act]) -> (ModuleConfig, Arc<Script>) {
    let script = Arc::new(Script { acts: Mutex::new(acts.iter().copied().collect()), ..Script::default() });
    SCRIPTS.lock().insert(name.to_string(), script.clone());
    let config = SCRIPTED.configure(&["--script", name]).expect("flags");
    (config, script)
}

fn context(process: &CancellationToken) -> ModuleContext {
    ModuleContext {
        csi: crate::csi::Connection::new("/nonexistent/csi.sock").expect("address"),
        health: crate::http::HealthRegistry::default(),
        shutdown: process.clone(),
        process: process.clone(),
        grace: Duration::from_secs(5),
        kube: None,
        debug: crate::debug::Registry::default(),
        listener: None,
    }
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = TokioInstant::now() + Duration::from_secs(3600);
    while !cond() {
        assert!(TokioInstant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A module that fails, panics and loses its Lease is started again each
/// time, after 1 s, 2 s and at once; the module beside it runs on in its
/// first instance, its scope never cancelled.
#[tokio::test(start_paused = true)]
async fn a_failing_module_restarts_alone_with_backoff() {
    let process = CancellationToken::new();
    let (flaky, flaky_script) = scripted("flaky", &[Act::Fail, Act::Panic, Act::LoseLease, Act::RunUntilStopped]);
    let (steady, steady_script) = scripted("steady", &[Act::RunUntilStopped]);
    let base = context(&process);
    let health = base.health.clone();
    let runs = [tokio::spawn(supervise(flaky, base.clone())), tokio::spawn(supervise(steady, base))];
    until("the fourth instance", || flaky_script.starts.lock().len() == 4).await;
    let starts: Vec<TokioInstant> = flaky_script.starts.lock().iter().map(|(at, _)| *at).collect();
    let gaps: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]).as_millis() as u64).collect();
    assert_eq!(gaps, [1000, 2000, 0], "1 s after the failure, 2 s after the panic, at once after the lost Lease");
    assert!(flaky_script.starts.lock()[..3].iter().all(|(_, scope)| scope.is_cancelled()), "each ended scope stopped");
    let steady_starts = steady_script.starts.lock().clone();
    assert_eq!(steady_starts.len(), 1, "the other module was never restarted");
    assert!(!steady_starts[0].1.is_cancelled(), "nor stopped");
    let report = health.check_one("scripted").await.expect("registered");
    assert!(report.is_healthy(), "running again, two failures: {report:?}");
    process.cancel();
    for r in runs {
        assert_eq!(r.await.expect("supervisor"), Ok(()));
    }
}

/// Three failures in a row: the module's health check fails while it is
/// down and once it runs again crash-looping; bad flags end the process.
#[tokio::test(start_paused = true)]
async fn a_crash_looping_module_fails_its_health_check_and_bad_flags_exit() {
    let process = CancellationToken::new();
    let (looping, script) = scripted("looping", &[Act::Fail, Act::Fail, Act::Fail, Act::RunUntilStopped]);
    let base = context(&process);
    let health = base.health.clone();
    let run = tokio::spawn(supervise(looping, base.clone()));
    until("the second instance", || script.starts.lock().len() == 2).await;
    until("the second failure", || script.starts.lock()[1].1.is_cancelled()).await;
    let down = health.check_one("scripted").await.expect("registered");
    assert_eq!(down.status, 500, "down between instances: {down:?}");
    until("the fourth instance", || script.starts.lock().len() == 4).await;
    let looping = health.check_one("scripted").await.expect("registered");
    assert_eq!(looping.status, 500, "crash-looping: {looping:?}");
    assert!(looping.body.contains("3 failures"), "{looping:?}");
    process.cancel();
    assert_eq!(run.await.expect("supervisor"), Ok(()));

    let (bad, script) = scripted("bad", &[Act::BadConfig]);
    let ended = supervise(bad, context(&CancellationToken::new())).await;
    assert_eq!(ended, Err("scripted: no such mode".to_string()), "the process exits");
    assert_eq!(script.starts.lock().len(), 1, "not restarted");
}
