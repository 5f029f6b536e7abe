//! An image's name: the SHA-256 of its bytes, with one spelling.
//!
//! Invariant owned here: one image has one name. `sha256:` and 64
//! lower-case hex digits (the bare hex is accepted too); upper case or
//! any other length is not a digest, so no two file names hold the same
//! bytes and no name reaches outside the store.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::image_store::ImageError;

/// The SHA-256 of an image's bytes. Written `sha256:<64 hex digits>`; the
/// bare hex is accepted too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// What `hasher`, fed an image's bytes, says their digest is.
    pub(crate) fn finished(hasher: Sha256) -> Digest {
        Digest(hasher.finalize().into())
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for Digest {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Digest, ImageError> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        let invalid = || ImageError::InvalidDigest(s.chars().take(80).collect());
        // One spelling: 64 lower-case hex digits, nothing else (upper case
        // would name the same bytes under a second file name, and a sign
        // is not a digit).
        if hex.len() != 64 || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(invalid());
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => c - b'0',
            _ => c - b'a' + 10,
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            *byte = nibble(pair[0]) << 4 | nibble(pair[1]);
        }
        Ok(Digest(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_digest_reads_back_as_written(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let digest = Digest::of(&bytes);
            prop_assert_eq!(digest.to_string().parse::<Digest>().unwrap(), digest);
            prop_assert_eq!(digest.hex().parse::<Digest>().unwrap(), digest);
        }

        #[test]
        fn anything_else_is_not_a_digest(s in "\\PC{0,80}") {
            prop_assume!(!(s.len() == 64 || s.len() == 71));
            prop_assert!(s.parse::<Digest>().is_err());
        }
    }

    #[test]
    fn one_image_has_one_spelling() {
        let digest = Digest::of(b"x");
        assert!(digest.hex().to_uppercase().parse::<Digest>().is_err());
        assert!(
            format!("sha512:{}", digest.hex())
                .parse::<Digest>()
                .is_err()
        );
        assert!(format!("{}0", digest.hex()).parse::<Digest>().is_err());
        // A sign is not a digit, though `from_str_radix` takes one.
        assert!(
            format!("sha256:{}", "+0".repeat(32))
                .parse::<Digest>()
                .is_err()
        );
        assert!("+0".repeat(32).parse::<Digest>().is_err());
        assert!(
            format!("sha256:{}", " 0".repeat(32))
                .parse::<Digest>()
                .is_err()
        );
    }
}
