//! The errors Weir reports for programs and images, each with one stable
//! code and the HTTP status the admin endpoints answer it with.
//!
//! Invariant owned here: no program code is also a runtime or actor code;
//! the README's error table lists them all.

use weir_runtime::WeirError;

/// A failure of an image or a run that Weir reports itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramErrorCode {
    /// 400: the text is not `sha256:<64 lower-case hex digits>`.
    ImageDigestInvalid,
    /// 404: no image with that digest is stored.
    ImageNotFound,
    /// 500: the stored bytes do not hash to their digest (flipped, cut).
    ImageCorrupt,
    /// 413: the image is over `max_image_bytes`.
    ImageTooLarge,
    /// 409: a run or a process holds the image.
    ImageInUse,
    /// 500: the store's directory could not be read or written.
    ImageStoreFailed,
    /// 503: cluster mode: the images the nodes share (in PostgreSQL) could
    /// not be reached, so an image this node lacks could not be fetched,
    /// or a push could not be shared.
    ImagesUnavailable,
    /// 422: the component does not load as a command (`wasi:cli/run`).
    NotACommand,
    /// 502: the program trapped (a panic, an unreachable, a stack overflow).
    RunTrapped,
    /// 504: the run passed `run_time_limit_ms`.
    RunTimeLimitExceeded,
    /// 502: the run wrote more than `max_run_output_bytes`.
    RunOutputTooLarge,
    /// 404: no running process with that pid belongs to the caller.
    ProcessNotFound,
    /// 410: the process ended (killed, or failed); the body says how.
    ProcessEnded,
    /// 503: `MAX_PROCESS_QUEUED` requests already wait for that process.
    ProcessOverloaded,
    /// 400: the host is in the process domain but is not `<pid>.process.internal`.
    ProcessAddressInvalid,
    /// 409: the process is a `lifetime` command: it serves no requests
    /// (its owner reaches it through its stdin, output and exit).
    ProcessNotServing,
}

impl ProgramErrorCode {
    pub const ALL: &'static [ProgramErrorCode] = &[
        ProgramErrorCode::ImageDigestInvalid,
        ProgramErrorCode::ImageNotFound,
        ProgramErrorCode::ImageCorrupt,
        ProgramErrorCode::ImageTooLarge,
        ProgramErrorCode::ImageInUse,
        ProgramErrorCode::ImageStoreFailed,
        ProgramErrorCode::ImagesUnavailable,
        ProgramErrorCode::NotACommand,
        ProgramErrorCode::RunTrapped,
        ProgramErrorCode::RunTimeLimitExceeded,
        ProgramErrorCode::RunOutputTooLarge,
        ProgramErrorCode::ProcessNotFound,
        ProgramErrorCode::ProcessEnded,
        ProgramErrorCode::ProcessOverloaded,
        ProgramErrorCode::ProcessAddressInvalid,
        ProgramErrorCode::ProcessNotServing,
    ];
}

impl WeirError for ProgramErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            ProgramErrorCode::ImageDigestInvalid => "image_digest_invalid",
            ProgramErrorCode::ImageNotFound => "image_not_found",
            ProgramErrorCode::ImageCorrupt => "image_corrupt",
            ProgramErrorCode::ImageTooLarge => "image_too_large",
            ProgramErrorCode::ImageInUse => "image_in_use",
            ProgramErrorCode::ImageStoreFailed => "image_store_failed",
            ProgramErrorCode::ImagesUnavailable => "images_unavailable",
            ProgramErrorCode::NotACommand => "not_a_command",
            ProgramErrorCode::RunTrapped => "run_trapped",
            ProgramErrorCode::RunTimeLimitExceeded => "run_time_limit_exceeded",
            ProgramErrorCode::RunOutputTooLarge => "run_output_too_large",
            ProgramErrorCode::ProcessNotFound => "process_not_found",
            ProgramErrorCode::ProcessEnded => "process_ended",
            ProgramErrorCode::ProcessOverloaded => "process_overloaded",
            ProgramErrorCode::ProcessAddressInvalid => "process_address_invalid",
            ProgramErrorCode::ProcessNotServing => "process_not_serving",
        }
    }

    fn status(self) -> u16 {
        match self {
            ProgramErrorCode::ImageDigestInvalid => 400,
            ProgramErrorCode::ImageNotFound => 404,
            ProgramErrorCode::ImageCorrupt | ProgramErrorCode::ImageStoreFailed => 500,
            ProgramErrorCode::ImageTooLarge => 413,
            ProgramErrorCode::ImageInUse => 409,
            ProgramErrorCode::NotACommand => 422,
            ProgramErrorCode::RunTimeLimitExceeded => 504,
            ProgramErrorCode::RunTrapped | ProgramErrorCode::RunOutputTooLarge => 502,
            ProgramErrorCode::ProcessNotFound => 404,
            ProgramErrorCode::ProcessEnded => 410,
            ProgramErrorCode::ProcessOverloaded | ProgramErrorCode::ImagesUnavailable => 503,
            ProgramErrorCode::ProcessAddressInvalid => 400,
            ProgramErrorCode::ProcessNotServing => 409,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_program_code_is_a_runtime_code_and_the_readme_lists_each() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        for code in ProgramErrorCode::ALL {
            assert!(
                weir_runtime::ErrorCode::ALL
                    .iter()
                    .all(|r| r.as_str() != code.as_str()),
                "{}",
                code.as_str()
            );
            let row = format!("| {} | `{}` |", code.status(), code.as_str());
            assert!(readme.contains(&row), "README lacks the row `{row}`");
        }
    }
}
