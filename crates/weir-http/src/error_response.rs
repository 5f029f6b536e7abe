//! The responses Weir itself sends: JSON, never cached, never sniffed.
//!
//! Invariant owned here: every response Weir answers on a guest's behalf
//! carries `{"error":"<code>"}`, `content-type: application/json`,
//! `cache-control: no-store` and `x-content-type-options: nosniff`.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use weir_runtime::ErrorCode;

use crate::response_body::ServeBody;

/// Weir's own answer for `code`.
pub fn error_response(code: ErrorCode) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::full(Bytes::from(code.body())));
    *response.status_mut() =
        StatusCode::from_u16(code.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}
