//! Calls between actors, from outside: chains of actors each waiting on
//! the next (the `hostile` guest's `/relay`), a call back into its own
//! chain refused at once, and chains cut at their depth.

mod common;

use serde_json::json;

use common::hostile::*;

#[tokio::test]
async fn an_actor_calling_back_into_its_own_chain_is_refused_at_once_and_chains_end_at_their_depth()
{
    // A deadline of a minute: a call that waited on its own caller would
    // hold both turns for that long, and the answer would be 503.
    let dir = data_dir("call-chain");
    let weir = start(&dir, &["--limit", "event_limit_ms=60000"]);
    let relay = |path: String| {
        let weir = &weir;
        async move {
            let r = weir.get(&path).await;
            assert_eq!(r.status, 200, "{path}: {:?}", r.body);
            innermost(r.json())
        }
    };
    // Distinct actors, one calling the next: answered to the end.
    assert_eq!(
        relay("/h/a/relay?via=b,c".into()).await,
        (200, json!("end"), 2)
    );
    // Back into the chain: itself, its caller, a caller two hops back.
    let cycle = (508, json!({ "error": "actor_call_cycle" }));
    for (path, hops) in [
        ("/h/a/relay?via=a", 0),
        ("/h/a/relay?via=b,a", 1),
        ("/h/x/relay?via=y,z,y", 2),
        ("/h/x/relay?via=y,z,x", 2),
    ] {
        let (status, body, answered) = relay(path.into()).await;
        assert_eq!(
            (status, body, answered),
            (cycle.0, cycle.1.clone(), hops),
            "{path}"
        );
    }
    // Sixteen actors may wait on each other; a seventeenth is refused.
    let names = |n: usize| {
        (1..=n)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(
        relay(format!("/h/d0/relay?via={}", names(15))).await,
        (200, json!("end"), 15)
    );
    assert_eq!(
        relay(format!("/h/d0/relay?via={}", names(16))).await,
        (508, json!({ "error": "actor_call_depth_exceeded" }), 15)
    );
    // Nothing waits: every actor of the chains answers its next call.
    for name in ["a", "b", "c", "x", "y", "z", "d0", "d15"] {
        assert_eq!(
            weir.get(&format!("/h/{name}/hello")).await.json(),
            json!("still here"),
            "{name}"
        );
    }
    // A chain starts again with each call: the worker, a client and a
    // timer are not actors waiting on anything.
    assert_eq!(
        relay("/h/b/relay?via=a,c".into()).await,
        (200, json!("end"), 2)
    );
}
