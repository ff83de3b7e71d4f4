use super::*;

fn offer(spec: &str) -> HealthCapabilities {
    let has = |w: &str| spec.split_whitespace().any(|x| x == w);
    HealthCapabilities {
        controller_service: !has("no-controller"),
        list_volumes: has("list"),
        get_volume: has("get"),
        volume_condition: has("condition"),
        list_volume_health: has("list-health"),
        get_volume_health: has("get-health"),
    }
}

#[test]
fn the_capabilities_choose_form_and_mode_or_name_what_is_missing() {
    let ok = |form, mode, confirm_missing| Ok(Plan { form, mode, confirm_missing });
    let cases: &[(&str, Result<Plan, &str>)] = &[
        ("list get condition", ok(Form::Condition, Mode::List, false)),
        ("get condition", ok(Form::Condition, Mode::Get, false)),
        ("list condition", ok(Form::Condition, Mode::List, false)),
        ("list-health get-health", ok(Form::Health, Mode::List, true)),
        ("list-health", ok(Form::Health, Mode::List, false)),
        ("get-health", ok(Form::Health, Mode::Get, false)),
        ("list get condition list-health get-health", ok(Form::Health, Mode::List, true)),
        ("list get", Err("lacks VOLUME_CONDITION (CSI <= 1.12)")),
        ("condition", Err("lacks LIST_VOLUMES or GET_VOLUME (CSI <= 1.12)")),
        ("", Err("lacks LIST_VOLUMES or GET_VOLUME and VOLUME_CONDITION")),
        ("no-controller list get condition", Err("CONTROLLER_SERVICE")),
    ];
    for (spec, want) in cases {
        match (plan(offer(spec)), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, *want, "{spec}"),
            (Err(got), Err(part)) => {
                assert!(got.contains(part), "{spec}: {got}");
                if !spec.contains("no-controller") {
                    assert!(got.contains("LIST_VOLUME_HEALTH or GET_VOLUME_HEALTH"), "{spec}: {got}");
                }
            }
            (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
        }
    }
}

fn cond(status: &str, reason: &str, message: &str) -> Condition {
    Condition { status: status.into(), reason: reason.into(), message: message.into() }
}

#[test]
fn reasons_become_what_the_api_accepts() {
    let cases = [
        ("NoPath", "NoPath"),
        ("no path", "NoPath"),
        ("disk-full (95%)", "DiskFull95"),
        ("9lives", "Lives"),
        ("a_b,c:", "A_b,c"),
        ("", "Degraded"),
        ("!!!", "Degraded"),
    ];
    for (raw, want) in cases {
        assert_eq!(condition_reason(raw, "Degraded"), want, "{raw:?}");
    }
    assert_eq!(condition_reason(&"x".repeat(2000), "Degraded").len(), 1024);
}

#[test]
fn answers_become_observations() {
    assert_eq!(from_condition(None, "x"), None, "no condition: nothing said");
    assert_eq!(from_condition(Some(false), "fine"), Some(Observed::Healthy));
    let Some(Observed::Abnormal { conditions, message }) = from_condition(Some(true), "The source path is gone") else {
        panic!("abnormal expected")
    };
    assert_eq!(message, "The source path is gone", "the event carries the driver's message alone");
    assert_eq!(conditions, vec![cond("Degraded", "", "The source path is gone")]);

    assert_eq!(from_health(vec![]), Observed::Healthy);
    let Observed::Abnormal { conditions, message } =
        from_health(vec![cond("Inaccessible", "NoPath", "no path"), cond("Degraded", "", "slow")])
    else {
        panic!("abnormal expected")
    };
    assert_eq!(conditions[0].status, "Degraded", "sorted");
    assert_eq!(conditions[0].reason, "Degraded", "no reason: the status");
    assert_eq!(message, "Degraded: slow; Inaccessible (NoPath): no path");
    let many = (0..40).map(|i| cond("Degraded", &format!("r{i:02}"), "m"));
    let Observed::Abnormal { conditions, .. } = from_health(many) else { panic!() };
    assert_eq!(conditions.len(), upstream::MAX_HEALTH_CONDITIONS, "the API keeps at most 16");
    let dup = from_health(vec![cond("Degraded", "a", "one"), cond("Degraded", "a", "two")]);
    assert!(matches!(dup, Observed::Abnormal { conditions, .. } if conditions.len() == 1), "keyed by status+reason");
}

fn abnormal(message: &str) -> Observed {
    Observed::Abnormal { conditions: vec![cond("Degraded", "", message)], message: message.into() }
}

/// (last reported, observed, the event's (reason, warning), reported after).
type EventCase<'a> = (Option<&'a Reported>, Observed, Option<(&'a str, bool)>, Reported);

#[test]
fn events_only_on_change() {
    let gone = Reported::Abnormal("gone".into());
    let cases: &[EventCase] = &[
        (None, Observed::Healthy, None, Reported::Healthy),
        (Some(&Reported::Healthy), Observed::Healthy, None, Reported::Healthy),
        (None, abnormal("gone"), Some((upstream::REASON_ABNORMAL, true)), gone.clone()),
        (Some(&Reported::Healthy), abnormal("gone"), Some((upstream::REASON_ABNORMAL, true)), gone.clone()),
        (Some(&gone), abnormal("gone"), None, gone.clone()),
        (Some(&gone), abnormal("worse"), Some((upstream::REASON_ABNORMAL, true)), Reported::Abnormal("worse".into())),
        (Some(&gone), Observed::Healthy, Some((upstream::REASON_NORMAL, false)), Reported::Healthy),
    ];
    for (prev, observed, want, next) in cases {
        let (event, after) = event_for(*prev, observed);
        assert_eq!(event.as_ref().map(|e| (e.reason, e.warning)), *want, "{prev:?} {observed:?}");
        assert_eq!(&after, next, "{prev:?} {observed:?}");
        if let Some(e) = event {
            let text = if e.warning { "gone worse" } else { upstream::MESSAGE_NORMAL };
            assert!(text.contains(&e.message), "{e:?}");
        }
    }
}

#[test]
fn the_latest_own_event_per_claim_is_what_was_reported() {
    let ev = |uid: &str, reason: &str, message: &str, at: &str| PastEvent {
        claim_uid: uid.into(),
        reason: reason.into(),
        message: message.into(),
        last_seen: at.into(),
    };
    let events = vec![
        ev("a", upstream::REASON_ABNORMAL, "gone", "2026-12-01T10:00:00Z"),
        ev("a", upstream::REASON_NORMAL, upstream::MESSAGE_NORMAL, "2026-12-01T10:05:00Z"),
        ev("b", upstream::REASON_NORMAL, upstream::MESSAGE_NORMAL, "2026-12-01T09:00:00Z"),
        ev("b", upstream::REASON_ABNORMAL, "slow", "2026-12-01T11:00:00Z"),
        ev("c", "NodeFailed", "other", "2026-12-01T12:00:00Z"),
    ];
    let r = recall(&events);
    assert_eq!(r.get("a"), Some(&Reported::Healthy));
    assert_eq!(r.get("b"), Some(&Reported::Abnormal("slow".into())));
    assert_eq!(r.get("c"), None, "other reasons say nothing about health");
}

#[test]
fn the_status_is_written_on_change_only_and_keeps_its_transition_time() {
    let now = "2026-12-05T10:00:00Z";
    let was = |conds: Vec<Condition>, t: &str| HealthStatus {
        health_conditions: conds,
        last_transition_time: Some(t.into()),
    };
    let t0 = "2026-12-01T00:00:00Z";
    let obs = from_health(vec![cond("Inaccessible", "NoPath", "no path")]);

    assert_eq!(status_patch(None, &Observed::Healthy, now), None, "healthy and nothing written: nothing");
    let empty = HealthStatus::default();
    assert_eq!(status_patch(Some(&empty), &Observed::Healthy, now), None);
    let cur = was(vec![cond("Inaccessible", "NoPath", "no path")], t0);
    assert_eq!(status_patch(Some(&cur), &obs, now), None, "unchanged: nothing");
    assert_eq!(
        status_patch(Some(&cur), &Observed::Healthy, now),
        Some(json!({"status": {"healthStatus": null}})),
        "healthy again: cleared"
    );
    let p = status_patch(None, &obs, now).unwrap();
    assert_eq!(p["status"]["healthStatus"]["lastTransitionTime"], now);
    assert_eq!(p["status"]["healthStatus"]["healthConditions"][0]["status"], "Inaccessible");

    let new_message = from_health(vec![cond("Inaccessible", "NoPath", "still no path")]);
    let p = status_patch(Some(&cur), &new_message, now).unwrap();
    assert_eq!(p["status"]["healthStatus"]["lastTransitionTime"], t0, "same set: time kept");
    assert_eq!(p["status"]["healthStatus"]["healthConditions"][0]["message"], "still no path");

    let more = from_health(vec![cond("Inaccessible", "NoPath", "no path"), cond("DataLoss", "", "lost")]);
    let p = status_patch(Some(&cur), &more, now).unwrap();
    assert_eq!(p["status"]["healthStatus"]["lastTransitionTime"], now, "the set changed: time moves");
}
