//! Many apps on one server, from outside: a real `weir serve` of a
//! `weir.toml` with `[apps.NAME]` sections, routed by host and path, each
//! app's capacity, stores and actors its own.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::apps::*;
use common::*;
use http::Request;
use http_body_util::Full;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_are_routed_by_host_then_longest_prefix_and_the_rest_is_no_route() {
    let file = config_file(
        "routes",
        &format!(
            "{}{}",
            app_section(
                "front",
                &guest("hello"),
                &["front.test/", "/front", "/status/front"],
                ""
            ),
            app_section("back", &probe(), &["*.back.test/", "/status"], ""),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    // By host: exact, then a wildcard of any depth; the port is ignored.
    let front = get_with_host(&weir, "front.test:8080", "/anything").await;
    assert_eq!((front.status.as_u16(), front.text()), (200, V1.into()));
    let back = get_with_host(&weir, "a.b.back.test", "/hello").await;
    assert_eq!((back.status.as_u16(), back.text()), (200, V1.into()));
    let echoed = get_with_host(&weir, "x.back.test", "/status?code=207").await;
    assert_eq!(echoed.status.as_u16(), 207, "the probe answered");
    // By path on any host: the longest prefix wins, whole segments only;
    // the app sees the whole path.
    let by_path = get_with_host(&weir, "elsewhere", "/status?code=208").await;
    assert_eq!(by_path.status.as_u16(), 208, "/status is the probe's");
    let longer = get_with_host(&weir, "elsewhere", "/status/front/x").await;
    assert_eq!(longer.text(), V1, "/status/front is longer than /status");
    for (host, path) in [
        ("elsewhere", "/"),
        ("elsewhere", "/frontier"),
        ("elsewhere", "/statusx"),
        ("back.test", "/"),
    ] {
        get_with_host(&weir, host, path)
            .await
            .assert_weir_error(404, "no_route");
    }
    // Each receipt names its app and version; the metrics count each app.
    let receipt = weir.receipt_where(|r| r["app"] == "back").await;
    let digest = receipt["version"].as_str().unwrap();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    let metrics = weir.admin_get("/metrics").await.text();
    for app in ["front", "back"] {
        assert!(
            metrics.contains(&format!(
                "weir_events_total{{app=\"{app}\",outcome=\"ok\"}}"
            )),
            "{app} is counted on its own"
        );
    }
    let apps = weir.admin_get("/apps").await.json();
    let names: Vec<&str> = apps["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["back", "front"]);
    assert_eq!(apps["apps"][1]["routes"][0], "front.test/");
    assert_eq!(apps["apps"][0]["version"], digest);
}

#[test]
fn overlapping_routes_are_refused_at_start_naming_both_apps() {
    let hello = guest("hello");
    let file = config_file(
        "overlap",
        &format!(
            "{}{}",
            app_section("one", &hello, &["/", "/api"], ""),
            app_section("two", &hello, &["/api/"], ""),
        ),
    );
    let exited = run_weir(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        fresh_data_dir().to_str().unwrap(),
    ]);
    assert_eq!(exited.code, Some(2), "{}", exited.stderr);
    assert!(
        exited
            .stderr
            .contains("route `/api` is declared by both `one` and `two`"),
        "{}",
        exited.stderr
    );
}

#[test]
fn what_belongs_to_one_app_is_refused_outside_its_section() {
    let hello = guest("hello");
    let file = config_file(
        "mixed",
        &format!(
            "[keyvalue]\nstores = [\"s\"]\n{}",
            app_section("one", &hello, &["/"], "")
        ),
    );
    let exited = run_weir(&["serve", "--config", file.to_str().unwrap()]);
    assert_eq!(exited.code, Some(2), "{}", exited.stderr);
    assert!(
        exited.stderr.contains(
            "[keyvalue] stores belongs to one app: with [apps.NAME] sections, say it in the app's section"
        ),
        "{}",
        exited.stderr
    );
    let file = config_file(
        "serverwide",
        &app_section(
            "one",
            &hello,
            &["/"],
            "[apps.one.limits]\nmax_connections = 5",
        ),
    );
    let exited = run_weir(&["serve", "--config", file.to_str().unwrap()]);
    assert_eq!(exited.code, Some(2), "{}", exited.stderr);
    assert!(
        exited.stderr.contains(
            "app `one`: `max_connections` is a server-wide limit: set it in the top-level [limits]"
        ),
        "{}",
        exited.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_in_a_trap_loop_and_at_capacity_leaves_the_other_app_whole() {
    let file = config_file(
        "isolation",
        &format!(
            "{}{}",
            app_section(
                "bad",
                &probe(),
                &["bad.test/"],
                "[apps.bad.limits]\nmax_concurrent = 1\nmax_queued = 1"
            ),
            app_section("good", &guest("hello"), &["/"], ""),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let stop = Arc::new(AtomicBool::new(false));
    // The bad app: its one lane held by sleepers and trapping in a loop.
    let attackers: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            let addr = weir.addr;
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let path = if i % 2 == 0 { "/trap" } else { "/sleep?ms=200" };
                    let r = send_to(
                        addr,
                        Request::get(path)
                            .header("host", "bad.test")
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                    .await;
                    statuses.push(r.status.as_u16());
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let load = Load::start(weir.addr, 4, "/");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (answers, errors) = load.finish().await;
    stop.store(true, Ordering::Relaxed);
    let mut statuses = Vec::new();
    for a in attackers {
        statuses.extend(a.await.unwrap());
    }
    assert!(errors.is_empty(), "{errors:?}");
    assert!(answers.len() > 100, "{} answers", answers.len());
    assert!(
        answers.iter().all(|(s, b)| *s == 200 && b == V1),
        "every request of the good app succeeded"
    );
    // The bad app did trap and did refuse for capacity.
    assert!(statuses.contains(&503), "{statuses:?}");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_events_total{app=\"bad\",outcome=\"trap\"}"),
        "the bad app trapped"
    );
    assert!(
        !metrics.contains("weir_events_total{app=\"good\",outcome=\"trap\"}")
            || metrics.contains("weir_events_total{app=\"good\",outcome=\"trap\"} 0"),
        "the good app did not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_cannot_reach_another_apps_stores_or_actors() {
    let kv = guest("kv");
    let file = config_file(
        "tenants",
        &format!(
            "{}{}{}",
            app_section(
                "one",
                &kv,
                &["one.test/"],
                "[apps.one.keyvalue]\nstores = [\"s\"]"
            ),
            app_section(
                "two",
                &kv,
                &["two.test/"],
                "[apps.two.keyvalue]\nstores = [\"s\"]"
            ),
            // A worker that calls actor class `bucket`, which only `owner`
            // declares.
            app_section("caller", &guest("ratelimit"), &["/"], "")
                + &app_section(
                    "owner",
                    &guest("ratelimit"),
                    &["owner.test/"],
                    &format!(
                        "[apps.owner.actors.bucket]\ncomponent = {}",
                        toml_path(&guest("ratelimit_bucket"))
                    )
                ),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let put = weir
        .send(
            Request::put("/kv/set?store=s&key=k")
                .header("host", "one.test")
                .body(Full::new(Bytes::from_static(b"one's")))
                .unwrap(),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.text());
    let own = get_with_host(&weir, "one.test", "/kv/get?store=s&key=k").await;
    assert_eq!((own.status.as_u16(), own.text()), (200, "one's".into()));
    let other = get_with_host(&weir, "two.test", "/kv/get?store=s&key=k").await;
    assert_eq!(
        other.status,
        404,
        "two's store `s` is its own: {}",
        other.text()
    );
    // The owner's worker reaches its own class; the caller's cannot.
    let owned = get_with_host(&weir, "owner.test", "/").await;
    assert_eq!(owned.status, 200, "{}", owned.text());
    let refused = get_with_host(&weir, "elsewhere", "/").await;
    assert_eq!(refused.status, 502, "{}", refused.text());
    assert!(
        refused.text().starts_with("rate limiter unreachable"),
        "{}",
        refused.text()
    );
    // Only the owner's call ran a turn (one more would fail the count).
    let turns = weir.actor_receipts_where(1, |_| true).await;
    assert_eq!(turns[0]["app"], "owner");
    let status = weir.admin_get("/status").await.json();
    assert!(status["tenants"]["owner"]["actors"].is_object(), "{status}");
    assert!(
        status["tenants"]["caller"].get("actors").is_none(),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_apps_of_actors_the_operator_names_the_app() {
    let hello = guest("hello");
    let class = |app: &str| {
        format!(
            "[apps.{app}.actors.probe]\ncomponent = {}\nroute = \"/probe\"",
            toml_path(&guest("actor_probe"))
        )
    };
    let file = config_file(
        "operators",
        &format!(
            "{}{}",
            app_section("one", &hello, &["one.test/"], &class("one")),
            app_section("two", &hello, &["two.test/"], &class("two")),
        ),
    );
    let weir = Weir::start_with(&["--config", file.to_str().unwrap()]);
    let call = get_with_host(&weir, "one.test", "/probe/ada/incr").await;
    assert_eq!(call.status, 200, "{}", call.text());
    weir.admin_get("/actors")
        .await
        .assert_weir_error(400, "app_required");
    let one = weir.admin_get("/actors?app=one").await.json();
    assert_eq!(one["actors"][0]["name"], "ada");
    let two = weir.admin_get("/actors?app=two").await.json();
    assert_eq!(two["actors"].as_array().unwrap().len(), 0, "{two}");
    weir.admin_get("/actors?app=three")
        .await
        .assert_weir_error(404, "app_unknown");
    weir.admin_get("/processes")
        .await
        .assert_weir_error(400, "app_required");
}

/// The slices of `app` in the compute share, and its computations waiting.
fn seat(status: &serde_json::Value, app: &str) -> (u64, u64) {
    let seat = &status["compute_share"]["apps"][app];
    (
        seat["slices_granted"].as_u64().unwrap_or(0),
        seat["waiting"].as_u64().unwrap_or(0),
    )
}

/// Long computations take turns at the share app by app: twelve of one
/// app and one of another, all computing until their deadline, and the
/// one gets half the slices, not a thirteenth.
#[tokio::test]
async fn an_app_with_many_long_computations_takes_no_more_of_the_share_than_an_app_with_one() {
    let file = config_file(
        "share",
        &format!(
            "[limits]\nevent_limit_ms = 8000\n{}{}",
            app_section("busy", &probe(), &["busy.test/"], ""),
            app_section("calm", &probe(), &["/"], ""),
        ),
    );
    let weir = Weir::start_with_env(
        &["--config", file.to_str().unwrap()],
        &[("TOKIO_WORKER_THREADS", "2")],
    );
    assert_eq!(
        get_with_host(&weir, "busy.test", "/hello").await.status,
        200
    );
    let computing = |host: &'static str| {
        let addr = weir.addr;
        tokio::spawn(async move {
            let req = Request::get("/loop")
                .header("host", host)
                .body(Full::new(Bytes::new()))
                .unwrap();
            send_to(addr, req).await
        })
    };
    let mut long: Vec<_> = (0..12).map(|_| computing("busy.test")).collect();
    long.push(computing("calm.test"));
    // Both apps' computations wait for slices.
    wait_for("both apps waiting for slices", || async {
        let status = weir.status().await;
        if seat(&status, "busy").1 >= 2 && seat(&status, "calm").0 >= 1 {
            Ok(())
        } else {
            Err(status["compute_share"].to_string())
        }
    })
    .await;
    let before = weir.status().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = weir.status().await;
    let busy = seat(&after, "busy").0 - seat(&before, "busy").0;
    let calm = seat(&after, "calm").0 - seat(&before, "calm").0;
    assert_eq!(after["compute_share"]["slices_per_tick"], 1);
    // Slice by slice, first come first served, the one computation of
    // `calm` would get one slice in thirteen; app by app, one in two
    // (measured: 181 against 185).
    assert!(
        busy > 0 && calm * 2 >= busy,
        "calm got {calm} slices while busy got {busy}: {}",
        after["compute_share"]
    );
    for call in long {
        call.await
            .unwrap()
            .assert_weir_error(503, "event_deadline_exceeded");
    }
    let status = weir.status().await;
    assert_eq!(seat(&status, "busy").1 + seat(&status, "calm").1, 0);
}
