//! Deploys that drop nothing, from outside: new code through the admin
//! address, `weir deploy` and `SIGHUP`, under load, with broken components,
//! actor classes and WebSockets.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::apps::*;
use common::websocket::close_of;
use common::*;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_deploys_under_full_load_drop_no_request() {
    let (v1, v2) = (
        std::fs::read(guest("hello")).unwrap(),
        std::fs::read(guest("hello_next")).unwrap(),
    );
    let file = config_file(
        "zero-drop",
        &app_section(
            "site",
            &guest("hello"),
            &["/"],
            "[apps.site.limits]\nmax_concurrent = 4",
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let load = Load::start(weir.addr, 8, "/");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut latencies = Vec::new();
    for round in 0..20 {
        let (bytes, expect, label) = if round % 2 == 0 {
            (&v2, V2, format!("next-{round}"))
        } else {
            (&v1, V1, format!("first-{round}"))
        };
        let started = Instant::now();
        let done = deploy(&weir, "site", bytes, &format!("?label={label}")).await;
        assert_eq!(done.status, 200, "{}", done.text());
        assert_eq!(done.json()["deployed"][0]["version"], label.as_str());
        // The first request after the deploy answered is the new version's.
        let seen = weir.get("/").await;
        assert_eq!(seen.text(), expect, "round {round}");
        latencies.push(started.elapsed());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (answers, errors) = load.finish().await;
    assert!(errors.is_empty(), "transport errors: {errors:?}");
    let bad: Vec<_> = answers
        .iter()
        .filter(|(status, body)| *status != 200 || (body != V1 && body != V2))
        .collect();
    assert!(
        bad.is_empty(),
        "{} bad answers: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    let v2_count = answers.iter().filter(|(_, b)| b == V2).count();
    assert!(
        v2_count > 0 && v2_count < answers.len(),
        "both versions answered"
    );
    latencies.sort();
    eprintln!(
        "zero-drop: {} answers, 0 errors; deploy to first response of the new version: median {:?}, max {:?}",
        answers.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    // Each version's receipts name it; the replaced ones drained.
    weir.receipt_where(|r| r["version"] == "first-19").await;
    let apps = wait_for("the replaced versions to drain", || async {
        let apps = weir.admin_get("/apps").await.json();
        match apps["apps"][0]["draining"].as_array() {
            Some(d) if d.is_empty() => Ok(apps),
            _ => Err(apps.to_string()),
        }
    })
    .await;
    assert_eq!(apps["apps"][0]["number"], 21);
    assert_eq!(apps["apps"][0]["previous"]["version"], "next-18");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_does_not_compile_or_link_is_refused_and_the_old_version_serves_on() {
    let file = config_file("broken", &app_section("site", &guest("hello"), &["/"], ""));
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let load = Load::start(weir.addr, 4, "/");
    let refused = deploy(&weir, "site", b"\0asm not really", "").await;
    refused.assert_weir_error(422, "component_refused");
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("does not compile"),
        "{}",
        refused.text()
    );
    // A command component compiles but does not serve HTTP.
    let command = std::fs::read(guest("cmdprobe")).unwrap();
    let refused = deploy(&weir, "site", &command, "").await;
    refused.assert_weir_error(422, "component_refused");
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("wasi:http/incoming-handler"),
        "{}",
        refused.text()
    );
    deploy(&weir, "nope", &command, "")
        .await
        .assert_weir_error(404, "app_unknown");
    deploy(&weir, "site", &command, "?label=no%20spaces")
        .await
        .assert_weir_error(400, "bad_request");
    let admin = weir.admin.unwrap();
    let rolled = rollback(&weir, "site").await;
    rolled.assert_weir_error(409, "no_previous_version");
    let (answers, errors) = load.finish().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!answers.is_empty());
    assert!(
        answers.iter().all(|(s, b)| *s == 200 && b == V1),
        "the first version answered every request"
    );
    let apps = weir.admin_get("/apps").await.json();
    assert_eq!(apps["apps"][0]["number"], 1, "nothing was installed");
    // Without the token, nothing about apps is answered.
    let anonymous = send_to(
        admin,
        Request::get("/apps")
            .header("host", admin.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_returns_to_the_previous_version_the_same_way() {
    let file = config_file(
        "rollback",
        &app_section("site", &guest("hello"), &["/"], ""),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let next = std::fs::read(guest("hello_next")).unwrap();
    assert_eq!(deploy(&weir, "site", &next, "?label=v2").await.status, 200);
    assert_eq!(weir.get("/").await.text(), V2);
    let admin = weir.admin.unwrap();
    let token = [("WEIR_ADMIN_TOKEN", weir.token.as_deref().unwrap())];
    let exited = run_weir_with_env(
        &[
            "deploy",
            "--admin",
            &admin.to_string(),
            "--rollback",
            "site",
        ],
        &token,
    );
    assert_eq!(exited.code, Some(0), "{}", exited.stderr);
    let done: Value = serde_json::from_str(&exited.stdout).unwrap();
    assert_eq!(done["deployed"][0]["previous"], "v2");
    assert_eq!(weir.get("/").await.text(), V1);
    // `weir deploy` of a component file, and `weir apps list`.
    let exited = run_weir_with_env(
        &[
            "deploy",
            "--admin",
            &admin.to_string(),
            "site",
            guest("hello_next").to_str().unwrap(),
            "--label",
            // A `+` of its own, which a query string would read as a space
            // unless the CLI encodes it.
            "v3+build.7",
        ],
        &token,
    );
    assert_eq!(exited.code, Some(0), "{}", exited.stderr);
    assert_eq!(weir.get("/").await.text(), V2);
    let admin_text = admin.to_string();
    let list = |more: &[&str]| {
        let mut args = vec!["apps", "list", "--admin", &admin_text];
        args.extend_from_slice(more);
        run_weir_with_env(&args, &token)
    };
    let listed: Value = serde_json::from_str(&list(&["--json"]).stdout).unwrap();
    assert_eq!(listed["apps"][0]["version"], "v3+build.7");
    assert_eq!(listed["apps"][0]["number"], 4);
    let table = list(&[]).stdout;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..3], ["APP", "VERSION", "DEPLOYED"], "{table}");
    assert_eq!(rows[1][..3], ["site", "#4", "v3+build.7"], "{table}");
    assert_eq!(rows.len(), 2, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_deploy_under_a_stream_of_calls_loses_no_write_and_the_next_incarnation_runs_the_new_code()
 {
    let file = config_file(
        "class",
        &app_section(
            "counter",
            &guest("hello"),
            &["/"],
            &format!(
                "[apps.counter.limits]\nevent_limit_ms = 5000\nactor_idle_ms = 200\n\
                 [apps.counter.actors.probe]\ncomponent = {}\nroute = \"/probe\"",
                toml_path(&guest("actor_probe"))
            ),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    // The deploy under test must end while `slow`'s 2.5 s turn still
    // runs, and compiling the new code can take longer than that on a
    // loaded machine. So it is compiled once first (deployed and replaced
    // by the old code again): the code cache is keyed by the component's
    // bytes, and the deploy under test only loads it.
    let next = std::fs::read(guest("actor_probe_next")).unwrap();
    let old = std::fs::read(guest("actor_probe")).unwrap();
    for (component, label) in [(&next, "warm"), (&old, "probe-1")] {
        let warm = deploy(
            &weir,
            "counter",
            component,
            &format!("?class=probe&label={label}"),
        )
        .await;
        assert_eq!(warm.status, 200, "{}", warm.text());
    }
    let before = weir.get("/probe/a/whoami").await.json();
    assert_eq!(before["build"], "actor-probe");
    // `sleeper` hibernates before the deploy; `slow` is in a long turn
    // across it.
    assert_eq!(weir.get("/probe/sleeper/whoami").await.status, 200);
    wait_for("sleeper to hibernate", || async {
        let listed = weir.admin_get("/actors/probe").await.json();
        let hibernated = listed["actors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "sleeper" && a["live"] == false);
        if hibernated {
            Ok(())
        } else {
            Err(listed.to_string())
        }
    })
    .await;
    let slow = {
        let addr = weir.addr;
        tokio::spawn(async move {
            send_to(
                addr,
                Request::post("/probe/slow/sleep?ms=2500")
                    .header("host", "x")
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            let addr = weir.addr;
            tokio::spawn(async move {
                let mut acked = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = send_to(
                        addr,
                        Request::post("/probe/a/incr")
                            .header("host", "x")
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    acked.push(r.text().parse::<u64>().unwrap());
                }
                acked
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let just_before = weir.get("/probe/a/whoami").await.json();
    let done = deploy(&weir, "counter", &next, "?class=probe&label=probe-2").await;
    assert_eq!(done.status, 200, "{}", done.text());
    let deployed_at = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for caller in callers {
        acked.extend(caller.await.unwrap());
    }
    // Every acknowledged increment is there, each exactly once.
    acked.sort();
    let n = acked.len() as u64;
    assert!(n > 10, "calls ran through the deploy");
    assert_eq!(acked, (1..=n).collect::<Vec<_>>());
    let stored = weir.get("/probe/a/get").await.text();
    assert_eq!(stored, n.to_string());
    // The long turn finished on the code it started with, after the
    // deploy; the hibernated actor woke on the new code.
    let slept = slow.await.unwrap();
    assert_eq!(slept.status, 200, "{}", slept.text());
    let turn = weir
        .actor_receipt_where(|r| r["name"] == "slow" && r["status"] == 200)
        .await;
    assert_eq!(turn["version"], "probe-1", "the old code's version: {turn}");
    let ended = humantime::parse_rfc3339(turn["timestamp"].as_str().unwrap()).unwrap();
    assert!(ended > deployed_at, "it ended after the deploy: {turn}");
    assert_eq!(
        weir.get("/probe/sleeper/whoami").await.json()["build"],
        "actor-probe-next"
    );
    assert_eq!(
        weir.get("/probe/slow/whoami").await.json()["build"],
        "actor-probe-next"
    );
    let after = weir.get("/probe/a/whoami").await.json();
    assert_eq!(after["build"], "actor-probe-next");
    assert_eq!(just_before["build"], "actor-probe");
    assert!(
        after["incarnation"].as_u64().unwrap() > just_before["incarnation"].as_u64().unwrap(),
        "{just_before} then {after}"
    );
    // The worker was not replaced by a class deploy; the class's turns
    // name its new version.
    let apps = weir.admin_get("/apps").await.json();
    assert_eq!(apps["apps"][0]["classes"][0]["version"], "probe-2");
    assert_eq!(apps["apps"][0]["generations"]["created"], 1);
    // The first turn on the new code started a fresh incarnation.
    let turn = weir
        .actor_receipt_where(|r| r["version"] == "probe-2")
        .await;
    assert_eq!(turn["app"], "counter");
    assert_eq!(turn["woke"], true, "{turn}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_weir_toml_whole_and_an_invalid_one_changes_nothing() {
    let hello = guest("hello");
    let write = |file: &Path, text: String| std::fs::write(file, text).unwrap();
    let two = |site: &Path, site_routes: &[&str], api_routes: &[&str]| {
        format!(
            "{}{}",
            app_section("site", site, site_routes, ""),
            app_section("api", &probe(), api_routes, "")
        )
    };
    let file = config_file("sighup", &two(&hello, &["/"], &["/status"]));
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let applied = |n: usize| {
        let weir = &weir;
        async move {
            wait_for("the SIGHUP to be handled", || async {
                let lines = weir.log().matches("weir: SIGHUP: ").count();
                if lines >= n {
                    Ok(weir.log())
                } else {
                    Err(format!("{lines} handled"))
                }
            })
            .await
        }
    };
    // Not TOML that Weir accepts: refused, logged, nothing changed.
    write(
        &file,
        format!("{}bogus = 1\n", two(&hello, &["/"], &["/status"])),
    );
    weir.signal("HUP");
    let log = applied(1).await;
    assert!(
        log.contains("weir: SIGHUP: configuration refused, nothing changed: config "),
        "{log}"
    );
    // Valid TOML, but two apps on one route: refused whole.
    write(
        &file,
        two(&guest("hello_next"), &["/", "/status"], &["/status"]),
    );
    weir.signal("HUP");
    let log = applied(2).await;
    assert!(
        log.contains("route `/status` is declared by both `api` and `site`"),
        "{log}"
    );
    assert_eq!(weir.get("/").await.text(), V1, "site was not deployed");
    assert_eq!(
        weir.get("/status?code=203").await.status,
        203,
        "the probe serves /status"
    );
    // A valid change: new code for one app and a new route for the other.
    write(
        &file,
        two(&guest("hello_next"), &["/"], &["/status", "/hello"]),
    );
    weir.signal("HUP");
    let log = applied(3).await;
    assert!(log.contains("weir: SIGHUP: configuration applied"), "{log}");
    assert_eq!(weir.get("/").await.text(), V2);
    assert_eq!(weir.get("/hello").await.text(), V1, "the probe's /hello");
    let apps = weir.admin_get("/apps").await.json();
    let api = &apps["apps"][0];
    assert_eq!(api["name"], "api");
    assert_eq!(
        api["generations"]["created"], 1,
        "a route change keeps the worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_closes_the_replaced_codes_sockets_with_1012_and_the_new_version_takes_new_ones() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let sockets = guest("sockets");
    let file = config_file(
        "sockets",
        &app_section(
            "live",
            &sockets,
            &["/"],
            &format!(
                "[apps.live.actors.room]\ncomponent = {}\nroute = \"/rooms\"",
                toml_path(&guest("chat_room"))
            ),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let url = |path: &str| format!("ws://{}{path}", weir.addr);
    let (mut worker, _) = tokio_tungstenite::connect_async(url("/echo"))
        .await
        .unwrap();
    let (mut member, _) = tokio_tungstenite::connect_async(url("/rooms/r/?user=ada"))
        .await
        .unwrap();
    worker.send(Message::text("before")).await.unwrap();
    assert_eq!(
        worker.next().await.unwrap().unwrap(),
        Message::text("before")
    );
    // A deploy of the worker (the same bytes under a label: a new version)
    // closes the worker's socket, not the room's.
    let bytes = std::fs::read(&sockets).unwrap();
    assert_eq!(deploy(&weir, "live", &bytes, "?label=w2").await.status, 200);
    assert_eq!(
        close_of(&mut worker).await,
        Ok((1012, "the code was updated".into()))
    );
    let (mut again, _) = tokio_tungstenite::connect_async(url("/echo"))
        .await
        .unwrap();
    again.send(Message::text("after")).await.unwrap();
    assert_eq!(again.next().await.unwrap().unwrap(), Message::text("after"));
    // Rolled back to the first version, which serves again: the w2 socket
    // closes, and new sockets on the first version stay open.
    let rolled = rollback(&weir, "live").await;
    assert_eq!(rolled.status, 200, "{}", rolled.text());
    assert_eq!(close_of(&mut again).await.map(|c| c.0), Ok(1012));
    let (mut back, _) = tokio_tungstenite::connect_async(url("/echo"))
        .await
        .unwrap();
    back.send(Message::text("back")).await.unwrap();
    assert_eq!(back.next().await.unwrap().unwrap(), Message::text("back"));
    // A class deploy closes the class's sockets; the worker's stay.
    let room = std::fs::read(guest("chat_room")).unwrap();
    assert_eq!(
        deploy(&weir, "live", &room, "?class=room&label=r2")
            .await
            .status,
        200
    );
    assert_eq!(
        close_of(&mut member).await,
        Ok((1012, "the code was updated".into()))
    );
    back.send(Message::text("still")).await.unwrap();
    assert_eq!(back.next().await.unwrap().unwrap(), Message::text("still"));
    let r = weir
        .first_logged("weir::socket", |r| {
            r["close_code"] == 1012 && r["app"] == "live/actor:room"
        })
        .await;
    assert_eq!(r["closed_by"], "weir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_only_a_restart_can_change_is_refused_by_name_and_nothing_changes() {
    let hello = guest("hello");
    let file = config_file(
        "restart",
        &app_section(
            "site",
            &hello,
            &["/"],
            "[apps.site.limits]\nmax_concurrent = 2",
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let next = guest("hello_next");
    let cases = [
        (
            format!(
                "{}{}",
                app_section("site", &next, &["/"], ""),
                app_section("more", &hello, &["/more"], "")
            ),
            "adding or removing an app needs a restart",
        ),
        (
            app_section(
                "site",
                &next,
                &["/"],
                "[apps.site.keyvalue]\nstores = [\"s\"]",
            ),
            "app `site`: its kv stores changed: that needs a restart",
        ),
        (
            format!(
                "[limits]\nmax_connections = 77\n{}",
                app_section("site", &next, &["/"], "")
            ),
            "the server-wide limit `max_connections` changed: that needs a restart",
        ),
        (
            app_section(
                "site",
                &next,
                &["/"],
                "[apps.site.limits]\nmax_concurrent = 5",
            ),
            "every app's max_concurrent together would be 5, over the 2 this server reserved instance slots for at start",
        ),
    ];
    for (n, (text, why)) in cases.iter().enumerate() {
        std::fs::write(&file, text).unwrap();
        weir.signal("HUP");
        let log = wait_for("the SIGHUP to be handled", || async {
            let log = weir.log();
            if log.matches("weir: SIGHUP: ").count() > n {
                Ok(log)
            } else {
                Err(log)
            }
        })
        .await;
        let last = log
            .lines()
            .rfind(|l| l.starts_with("weir: SIGHUP: "))
            .unwrap();
        assert!(
            last.starts_with("weir: SIGHUP: configuration refused, nothing changed: ")
                && last.contains(why),
            "{last}"
        );
        assert_eq!(weir.get("/").await.text(), V1, "case {n}: nothing changed");
    }
    // A deploy of a class the app does not declare, and a component over
    // the limit, are refused too.
    let bytes = std::fs::read(&next).unwrap();
    deploy(&weir, "site", &bytes, "?class=nope")
        .await
        .assert_weir_error(404, "class_unknown");
    let huge = vec![0u8; weir_http::admin_apps::MAX_DEPLOY_COMPONENT_BYTES + 1];
    deploy(&weir, "site", &huge, "")
        .await
        .assert_weir_error(413, "component_too_large");
    assert_eq!(weir.get("/").await.text(), V1);
    assert_eq!(weir.admin_get("/apps").await.json()["apps"][0]["number"], 1);
}
