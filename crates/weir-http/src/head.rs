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

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// The count is the length of the head as a client writes it
            /// (`METHOD target`, then `name: value\r\n` per header), for
            /// any method, target and headers, repeated names included.
            #[test]
            fn the_count_is_the_written_heads_length(
                method in "[A-Z]{1,10}",
                target in "/[a-zA-Z0-9/?&=._~%-]{0,200}",
                headers in proptest::collection::vec(("[a-z][a-z0-9-]{0,30}", "[ -~]{0,100}"), 0..40),
            ) {
                let mut builder = Request::builder().method(method.as_str()).uri(target.as_str());
                let mut written = format!("{method} {target}");
                for (name, value) in &headers {
                    let value = value.trim();
                    builder = builder.header(name.as_str(), value);
                    written.push_str(&format!("{name}: {value}\r\n"));
                }
                let request = builder.body(()).unwrap();
                prop_assert_eq!(head_bytes(&request), written.len());
            }
        }
    }
}
