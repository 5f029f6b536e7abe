//! `http://<pid>.process.internal/…`: how an owner reaches its resident
//! processes, through its own ordinary outgoing requests (an internal
//! route of the runtime: it never touches the network).
//!
//! Invariant owned here: a process answers only its owner. The router
//! knows the caller from the runtime (the identity the actor layer gave
//! its generation); a request from anyone else — another actor, a worker —
//! is answered exactly as one to a pid that does not exist
//! (`process_not_found`), so a process's existence does not leak. The
//! authority must be exactly `<pid>.process.internal`: no port, no user
//! information, no trailing dot, the pid in plain decimal.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use weir_actors::bindings::ActorIdentity;
use weir_runtime::error_code::error_response;
use weir_runtime::extension::{Caller, InternalRouter};

use crate::error_code::ProgramErrorCode;
use crate::process_table::{Owner, ProcessTable};

/// The domain of process addresses.
pub const PROCESS_HOST_SUFFIX: &str = ".process.internal";

/// The pid an authority names, if it is exactly `<pid>.process.internal`.
pub fn parse_pid(authority: &str) -> Option<u64> {
    let digits = authority.strip_suffix(PROCESS_HOST_SUFFIX)?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

/// The router of the process domain.
pub struct ProcessRouter {
    pub table: Arc<ProcessTable>,
}

impl InternalRouter for ProcessRouter {
    fn handles(&self, host: &str) -> bool {
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        host.trim_end_matches('.').ends_with(PROCESS_HOST_SUFFIX)
    }

    fn call(
        self: Arc<Self>,
        request: http::Request<Bytes>,
        caller: Option<Caller>,
    ) -> Pin<Box<dyn Future<Output = http::Response<Bytes>> + Send>> {
        Box::pin(async move {
            let authority = request.uri().authority().map(|a| a.as_str()).unwrap_or("");
            let Some(pid) = parse_pid(authority) else {
                return error_response(ProgramErrorCode::ProcessAddressInvalid);
            };
            let owner = caller
                .as_ref()
                .and_then(|c| c.downcast_ref::<ActorIdentity>())
                .map(|id| Owner {
                    class: id.class.clone(),
                    name: id.name.clone(),
                });
            let Some(owner) = owner else {
                return error_response(ProgramErrorCode::ProcessNotFound);
            };
            match self.table.get(&owner, pid) {
                Some(resident) => resident.request(request).await,
                None => match self.table.ended_how(&owner, pid) {
                    Some(why) => ended_response(pid, &why),
                    None => error_response(ProgramErrorCode::ProcessNotFound),
                },
            }
        })
    }
}

/// 410 `process_ended`, with the pid and how it ended.
pub fn ended_response(pid: u64, why: &str) -> http::Response<Bytes> {
    let mut response = error_response(ProgramErrorCode::ProcessEnded);
    *response.body_mut() = Bytes::from(
        serde_json::json!({ "error": "process_ended", "pid": pid, "ended": why }).to_string(),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_address_names_a_pid() {
        assert_eq!(parse_pid("1000001.process.internal"), Some(1_000_001));
        for bad in [
            "1000001.process.internal:80",
            "x@1000001.process.internal",
            "1000001.process.internal.",
            "01.process.internal",
            "+1.process.internal",
            ".process.internal",
            "1.2.process.internal",
            "99999999999999999999999.process.internal",
            "1000001.PROCESS.internal",
            "1000001.actor.internal",
        ] {
            assert_eq!(parse_pid(bad), None, "{bad}");
        }
    }
}
