//! The smallest useful `wasi:http/proxy` component: answers every request
//! with a fixed greeting. The example app of the README and the benchmark's
//! workload. Built a second time as `hello-next` (the same source), which
//! greets differently: the two versions deploys alternate between.

use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

const GREETING: &[u8] = b"hello from weir\n";

/// What `hello-next` answers instead.
const NEXT_GREETING: &[u8] = b"hello from weir, next version\n";

fn greeting() -> &'static [u8] {
    if env!("CARGO_PKG_NAME") == "hello" {
        GREETING
    } else {
        NEXT_GREETING
    }
}

impl wasi::exports::http::incoming_handler::Guest for Hello {
    fn handle(_request: IncomingRequest, out: ResponseOutparam) {
        let headers = Fields::from_list(&[(
            "content-type".to_string(),
            b"text/plain; charset=utf-8".to_vec(),
        )])
        .expect("static header is valid");
        let response = OutgoingResponse::new(headers);
        let body = response.body().expect("body is taken once");
        ResponseOutparam::set(out, Ok(response));
        let stream = body.write().expect("stream is taken once");
        stream
            .blocking_write_and_flush(greeting())
            .expect("client accepts the greeting");
        drop(stream);
        OutgoingBody::finish(body, None).expect("body is complete");
    }
}

wasi::http::proxy::export!(Hello);
