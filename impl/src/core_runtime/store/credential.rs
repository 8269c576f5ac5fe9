//! Daemon credentials ("Ownership and connection" step 1: "Neither a Project API key
//! nor a Core key is a Runtime credential").
//!
//! Core issues daemon credentials as `rcd_<43 characters of URL-safe base64>` (32
//! random bytes) and stores only their SHA-256. A presented credential is compared
//! with every non-revoked hash of the device in constant time. Project keys (`proj_…`)
//! and Core keys (`core_…`) are refused outright, and anything that was not issued (or
//! provisioned) as a daemon credential matches no hash and is refused too.

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Prefix of every daemon credential Core issues.
pub const DAEMON_CREDENTIAL_PREFIX: &str = "rcd_";

/// Prefixes of keys that are never daemon credentials (Project API keys, Core keys).
pub const REFUSED_PREFIXES: [&str; 2] = ["proj_", "core_"];

/// Random bytes in an issued secret.
pub const SECRET_RANDOM_BYTES: usize = 32;

/// Bound on a presented credential's length (bytes); longer ones are refused unhashed.
pub const CREDENTIAL_MAX_BYTES: usize = 512;

/// Shortest secret Core accepts as a daemon credential (bytes): a listing shows
/// [`LISTED_PREFIX_CHARS`] of it, so a secret must be far longer than that, and a short
/// one is guessable. Issued secrets have 47.
pub const CREDENTIAL_MIN_BYTES: usize = 24;

/// Characters of the secret kept in listings (prefix plus four).
pub const LISTED_PREFIX_CHARS: usize = 8;

/// Generates a fresh daemon credential secret (`rcd_…`).
pub fn generate_secret() -> String {
    let mut bytes = [0u8; SECRET_RANDOM_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{DAEMON_CREDENTIAL_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Generates a credential ID (`cred_` + 16 hex characters); not secret.
pub fn generate_credential_id() -> String {
    let mut bytes = [0u8; 8];
    rand::rng().fill_bytes(&mut bytes);
    format!("cred_{}", hex::encode(bytes))
}

/// SHA-256 of a secret.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether `secret` may be used as a daemon credential at all: non-empty, bounded,
/// visible ASCII (it travels in a header), and not a Project/Core key.
pub fn acceptable_shape(secret: &str) -> bool {
    secret.len() >= CREDENTIAL_MIN_BYTES
        && secret.len() <= CREDENTIAL_MAX_BYTES
        && secret.bytes().all(|b| b.is_ascii_graphic())
        && !REFUSED_PREFIXES.iter().any(|p| secret.starts_with(p))
}

/// Constant-time equality of two digests (no early exit on the first difference).
pub fn digest_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The listed prefix of a secret.
pub fn listed_prefix(secret: &str) -> String {
    secret.chars().take(LISTED_PREFIX_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_secrets_have_the_prefix_and_differ() {
        let a = generate_secret();
        let b = generate_secret();
        assert!(a.starts_with(DAEMON_CREDENTIAL_PREFIX));
        assert_ne!(a, b);
        assert!(acceptable_shape(&a));
        assert_eq!(a.len(), 4 + 43);
    }

    #[test]
    fn project_and_core_keys_are_refused() {
        assert!(!acceptable_shape("proj_abc"));
        assert!(!acceptable_shape("core_abc"));
        assert!(!acceptable_shape(""));
        assert!(!acceptable_shape("has space"));
        assert!(!acceptable_shape(&"x".repeat(CREDENTIAL_MAX_BYTES + 1)));
    }

    #[test]
    fn digests_compare_exactly() {
        let h = hash_secret("rcd_x");
        assert!(digest_eq(&h, &hash_secret("rcd_x")));
        assert!(!digest_eq(&h, &hash_secret("rcd_y")));
        assert!(!digest_eq(&h, &h[..31]));
    }
}
