//! Measuring a request head the way the limit is stated.
//!
//! Invariant owned here: the head size is counted in UTF-8 bytes over the
//! method, the request target exactly as received (a trailing `?` included),
//! and every header line as `name: value` plus its line break — the same
//! count whatever the client's spacing, so the limit means one thing.

use http::Request;

/// Bytes of `": "` between a header's name and value.
const HEADER_SEPARATOR_BYTES: usize = 2;
/// Bytes of the line break ending a header line.
const LINE_BREAK_BYTES: usize = 2;
/// The space between method and target.
const REQUEST_LINE_SPACE_BYTES: usize = 1;

/// The size of a request's head, as compared with `max_request_head_bytes`.
pub fn head_bytes<B>(request: &Request<B>) -> usize {
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().len())
        .unwrap_or(1);
    let mut total = request.method().as_str().len() + REQUEST_LINE_SPACE_BYTES + target;
    for (name, value) in request.headers() {
        total += name.as_str().len()
            + HEADER_SEPARATOR_BYTES
            + value.as_bytes().len()
            + LINE_BREAK_BYTES;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_method_target_and_header_lines() {
        let req = Request::builder()
            .method("GET")
            .uri("/a?")
            .header("x-a", "é")
            .body(())
            .unwrap();
        // "GET /a?" = 7; "x-a: é\r\n" = 3 + 2 + 2 + 2 = 9
        assert_eq!(head_bytes(&req), 16);
    }
}
