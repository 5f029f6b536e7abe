//! What a guest makes the host hold through its handles: header maps, and
//! the requests and responses it builds with their unsent bodies, live in
//! host memory, where the limit on its linear memory does not see them. A
//! guest that kept making header maps of 100 KiB had one `weir serve` at
//! 800 MiB within one event, and one that kept writing 64 KiB into bodies
//! of responses it never sent at 224 MiB before its handles ran out, its
//! own memory limited to 32 MiB (measured).
//!
//! Invariants owned here:
//! - a store's resource table holds at most [`MAX_GUEST_HANDLES`] entries;
//!   one more is refused (the host call traps, naming the full table);
//! - what the guest's handles hold counts, with its linear memory, against
//!   `memory_limit_bytes`: the bytes of their header names and values,
//!   each value also at the entry the host's map keeps for it
//!   ([`HEADER_ENTRY_BYTES`]), and for each request or response not yet
//!   sent that has a body, the body's buffer (one chunk of
//!   `max_response_chunk_bytes`, the most it can hold whatever the guest
//!   writes); the bytes of internal calls' responses handed to the guest
//!   and not yet taken by its streams (`HeldResponses`), and for each
//!   input stream the one chunk it buffers (an internal response reaches
//!   the guest in frames of one chunk). It is counted at each epoch tick
//!   the guest runs through: past the limit the guest traps and its call
//!   ends `memory_limit_exceeded`. Between two ticks it can add no more
//!   than it can copy in one ([`crate::epoch_ticker::EPOCH_TICK`]).
//!
//! The count walks every entry the guest holds, so its cost at a tick
//! grows with what the guest holds, and the limit bounds both: at most
//! `memory_limit_bytes / HEADER_ENTRY_BYTES` values.

use std::collections::HashSet;
use std::convert::Infallible;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use rustc_hash::FxHasher;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::DynInputStream;
use wasmtime_wasi_http::FieldMap;
use wasmtime_wasi_http::p2::types::{HostOutgoingRequest, HostOutgoingResponse};

/// Handles one store may hold at once. A request needs tens (its request,
/// headers, body, streams and pollables); a guest fanning out to a hundred
/// outbound requests about a thousand. Every entry is host memory, and
/// `held_bytes` walks them all at each tick, so the bound is what keeps
/// both small (wasmtime's own default is a million).
pub const MAX_GUEST_HANDLES: usize = 10_000;

/// What the host spends on each header value beyond its bytes: the entry
/// its map keeps for it (a value handle of 40 bytes with two links, 72 in
/// all; a name's first value sits in a bucket of about 104 with its hash
/// index), and the slack of the vectors those entries grow in. Measured:
/// 2,000 maps of 3,000 empty values each made the host hold 76 bytes per
/// value. Counting every value at 128 bounds any shape of map a guest can
/// build, so that a guest cannot hold host memory in values of no bytes.
pub const HEADER_ENTRY_BYTES: usize = 128;

/// The bytes the handles in `table` hold: header names and values, each
/// value also at [`HEADER_ENTRY_BYTES`] (a map shared by several handles,
/// a request's headers asked for twice, counted once), and
/// `body_buffer_bytes` for each unsent request or response with a body
/// and for each input stream.
pub(crate) fn held_bytes(table: &mut ResourceTable, body_buffer_bytes: usize) -> usize {
    // Map addresses, hashed by Fx: at the handle bound the walk's cost was
    // mostly SipHash's (0.86 ms for 10,000 maps of one header against
    // 0.39 ms).
    let mut seen: HashSet<usize, BuildHasherDefault<FxHasher>> = HashSet::default();
    let mut total = 0;
    // An unsent request's or response's body holds one buffer.
    let buffer = |has_body: bool| usize::from(has_body) * body_buffer_bytes;
    for entry in table.iter_mut() {
        let map: &HeaderMap = if let Some(f) = entry.downcast_ref::<FieldMap>() {
            f
        } else if let Some(r) = entry.downcast_ref::<HostOutgoingResponse>() {
            total += buffer(r.body.is_some());
            &r.headers
        } else if let Some(r) = entry.downcast_ref::<HostOutgoingRequest>() {
            total += buffer(r.body.is_some());
            &r.headers
        } else if entry.downcast_ref::<DynInputStream>().is_some() {
            total += body_buffer_bytes;
            continue;
        } else {
            continue;
        };
        if map.is_empty() || !seen.insert(map as *const HeaderMap as usize) {
            continue;
        }
        total += map.keys().map(|k| k.as_str().len()).sum::<usize>()
            + map.values().map(|v| v.len()).sum::<usize>()
            + map.len() * HEADER_ENTRY_BYTES;
    }
    total
}

/// The bytes of internal calls' responses a guest was handed and has not
/// taken yet: they are whole in host memory (an actor's response is
/// buffered), however little the guest reads. Before they were counted, a
/// guest limited to 32 MiB that kept 200 responses of 4 MiB unread made
/// the host hold 868 MB in one request (measured). One per store, shared
/// with the bodies it counts.
#[derive(Clone, Default)]
pub(crate) struct HeldResponses(Arc<AtomicUsize>);

impl HeldResponses {
    pub(crate) fn bytes(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// `body` as the guest gets it: frames of at most `chunk` bytes, the
    /// rest counted here until the guest's stream takes it or the body is
    /// dropped.
    pub(crate) fn hold(&self, body: Bytes, chunk: usize) -> HeldBody {
        self.0.fetch_add(body.len(), Ordering::Relaxed);
        HeldBody {
            left: body,
            chunk: chunk.max(1),
            held: self.clone(),
        }
    }
}

/// An internal response's body, counted in its store's [`HeldResponses`]
/// until taken.
pub(crate) struct HeldBody {
    left: Bytes,
    chunk: usize,
    held: HeldResponses,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.left.is_empty() {
            return Poll::Ready(None);
        }
        let frame = this.left.split_to(this.left.len().min(this.chunk));
        this.held.0.fetch_sub(frame.len(), Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.left.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left.len() as u64)
    }
}

impl Drop for HeldBody {
    fn drop(&mut self) {
        self.held.0.fetch_sub(self.left.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi_http::default_hooks;
    use wasmtime_wasi_http::p2::body::{HostOutgoingBody, StreamContext};

    #[test]
    fn held_bytes_count_each_map_once_and_each_unsent_body_and_stream_at_its_buffer() {
        const E: usize = HEADER_ENTRY_BYTES;
        let mut table = ResourceTable::new();
        assert_eq!(held_bytes(&mut table, 0), 0);
        let mut built = FieldMap::new_mutable(1 << 20);
        built
            .append(default_hooks(), "x-fill".into(), vec![b'x'; 1000])
            .unwrap();
        table.push(built).unwrap();
        table.push(FieldMap::new_mutable(1 << 20)).unwrap();
        table.push(42u64).unwrap();
        assert_eq!(held_bytes(&mut table, 0), 6 + 1000 + E);
        // Two handles to one host map (a request's headers asked for
        // twice) hold its bytes once.
        let mut shared = http::HeaderMap::new();
        shared.insert("x-a", http::HeaderValue::from_static("abcd"));
        let once = FieldMap::new_immutable(default_hooks(), shared);
        table.push(once.clone()).unwrap();
        table.push(once).unwrap();
        assert_eq!(held_bytes(&mut table, 0), 6 + 1000 + E + 3 + 4 + E);
        // A response with a body holds the body's buffer; one without, none.
        let (_writer, body) = HostOutgoingBody::new(StreamContext::Response, None, 1, 64);
        for body in [Some(body), None] {
            table
                .push(HostOutgoingResponse {
                    status: http::StatusCode::OK,
                    headers: FieldMap::new_mutable(1 << 20),
                    body,
                })
                .unwrap();
        }
        assert_eq!(held_bytes(&mut table, 64), 6 + 1000 + E + 3 + 4 + E + 64);
        // An input stream holds the one chunk it buffers.
        let stream: DynInputStream = Box::new(wasmtime_wasi::p2::pipe::MemoryInputPipe::new("x"));
        table.push(stream).unwrap();
        assert_eq!(
            held_bytes(&mut table, 64),
            6 + 1000 + E + 3 + 4 + E + 64 + 64
        );
    }

    #[tokio::test]
    async fn a_held_body_counts_what_its_guest_has_not_taken() {
        use http_body_util::BodyExt;
        let held = HeldResponses::default();
        let mut body = held.hold(Bytes::from(vec![b'x'; 10]), 4);
        let kept = held.hold(Bytes::from(vec![b'y'; 7]), 4);
        assert_eq!(held.bytes(), 17);
        let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(frame.len(), 4, "one chunk at a time");
        assert_eq!(held.bytes(), 13);
        drop(body);
        assert_eq!(held.bytes(), 7, "a dropped body holds nothing");
        assert_eq!(kept.collect().await.unwrap().to_bytes().len(), 7);
        assert_eq!(held.bytes(), 0);
    }
}
