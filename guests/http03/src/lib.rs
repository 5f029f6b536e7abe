//! A WASI 0.3 HTTP component (it exports `wasi:http/handler@0.3.0`, as
//! spin-sdk 7 guests do). This build of Weir serves WASI 0.2 components;
//! the tests check that this one is refused at start with a message that
//! names the interface, not with whatever the compiler trips over.

use wasip3::http::types::{ErrorCode, Fields, Request, Response};
use wasip3::wit_future;

wasip3::http::service::export!(Hello);

struct Hello;

impl wasip3::exports::http::handler::Guest for Hello {
    async fn handle(_request: Request) -> Result<Response, ErrorCode> {
        let (trailers_tx, trailers_rx) = wit_future::new(|| Ok(None));
        let (response, _sent) = Response::new(Fields::new(), None, trailers_rx);
        drop(trailers_tx);
        Ok(response)
    }
}
