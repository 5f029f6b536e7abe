//! Outbound HTTP policy for guests (`wasi:http/outgoing-handler`).
//!
//! Invariant owned here: a guest reaches no network unless configured to.
//! Until outbound hosts can be granted, every outgoing request fails in the
//! guest with the standard `HTTP-request-denied` error and nothing is sent.

use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The per-generation outbound policy handed to `wasmtime-wasi-http`.
pub struct OutboundPolicy {
    chunk_bytes: usize,
}

impl OutboundPolicy {
    pub fn new(chunk_bytes: usize) -> Self {
        OutboundPolicy { chunk_bytes }
    }
}

type SendFuture = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for OutboundPolicy {
    fn send_request(
        &mut self,
        _request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> SendFuture {
        Box::new(async { Err(Error::HttpRequestDenied) })
    }

    /// The guest may write at most one client chunk at a time, so a response
    /// body never needs re-chunking on its way out.
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        self.chunk_bytes
    }
}
