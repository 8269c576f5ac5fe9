//! The plugin wire's rules, shared by the host and the SDK: the launch environment, the
//! handshake line, the launch-secret proof, the bounds and the grammar of names and
//! identifiers (`plugin-protocol.md`, "Identity and launch", "Initial tool API").
//!
//! The spec fixes the facts (a single-use secret, a proof in `Initialize`, bounded
//! definitions and payloads) and leaves their encoding free; every encoding and every
//! number here is this implementation's reading, documented in
//! `docs/plugin-launch-contract.md` and marked `reference` in the requirement catalog.
//!
//! This module only defines and validates; it never opens a socket or a file.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Environment variable naming the Unix socket the plugin serves on ("Identity and
/// launch": the host chooses it, in a 0700 directory of its own).
pub const SOCKET_ENV: &str = "RUNTIME_PLUGIN_SOCKET";

/// Environment variable carrying the launch secret ("a random single-use handshake
/// secret"): 64 lowercase hexadecimal characters. A plugin must not pass it on to the
/// processes it starts ([`crate::plugin::sdk::command`] builds such a command).
pub const SECRET_ENV: &str = "RUNTIME_PLUGIN_SECRET";

/// Environment variable naming the protocol the host speaks (`plugin.v1`).
pub const PROTOCOL_ENV: &str = "RUNTIME_PLUGIN_PROTOCOL";

/// The value of [`PROTOCOL_ENV`] ("Initial package: `plugin/v1`").
pub const PROTOCOL: &str = "plugin.v1";

/// The one line a plugin writes on stdout, once its socket accepts connections. Nothing
/// may precede it, and nothing may follow it ("stdout protocol contamination fail\[s\]
/// the candidate or call according to phase").
pub const HANDSHAKE_LINE: &str = "plugin.v1 ready";

/// The protocol major version of `plugin.v1`.
pub const PROTOCOL_MAJOR: u32 = 1;

/// The highest protocol minor version this implementation speaks.
pub const PROTOCOL_MINOR: u32 = 0;

/// Length of the launch secret and of a challenge, in hexadecimal characters (32 bytes).
pub const SECRET_HEX_LEN: usize = 64;

/// The domain of the plugin's proof: `HMAC-SHA256(secret, PROOF_DOMAIN + challenge)`.
pub const PROOF_DOMAIN: &str = "plugin.v1 initialize ";

/// The domain of the host's proof on every call: `HMAC-SHA256(secret, HOST_DOMAIN)`.
pub const HOST_DOMAIN: &str = "plugin.v1 host";

/// The metadata entry carrying the host's proof (`Bearer <hex>`).
pub const AUTH_METADATA: &str = "authorization";

/// Most tools one plugin may define ("ListTools returns immutable **bounded**
/// definitions").
pub const MAX_TOOLS: usize = 64;

/// Longest tool name, in bytes ("bounded definitions").
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// Longest tool or manifest description, in bytes ("bounded definitions").
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

/// Largest input schema of one tool, in bytes of JSON text ("oversized schemas ... fail
/// the candidate").
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;

/// Most capabilities one tool or plugin may list.
pub const MAX_CAPABILITIES: usize = 16;

/// Largest arguments or output JSON text of one call, in bytes, unless the host's
/// limits say less ("oversized ... payloads ... fail the ... call").
pub const MAX_PAYLOAD_BYTES: u64 = 256 * 1024;

/// Most progress messages of one call ("streams **bounded** progress").
pub const MAX_PROGRESS_MESSAGES: u32 = 1000;

/// Longest progress message text, in bytes.
pub const MAX_PROGRESS_TEXT_BYTES: usize = 1024;

/// Most calls in flight at once in one process.
pub const MAX_CONCURRENT_CALLS: u32 = 16;

/// Longest call ID or progress token, in bytes.
pub const MAX_CALL_ID_BYTES: usize = 128;

/// Longest failure message, in bytes.
pub const MAX_FAILURE_TEXT_BYTES: usize = 4096;

/// Largest gRPC message either side accepts, in bytes: the payload bound plus room for
/// the envelope (`malformed/oversized traffic`).
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024;

/// Longest drain a host may ask for, in milliseconds ("bounded drain").
pub const MAX_DRAIN_TIMEOUT_MS: u64 = 600_000;

/// The capabilities a plugin may declare. "Capability declarations are mandatory
/// metadata but not security theater": this host enforces none of them (see
/// [`capability_enforcement`]).
pub const KNOWN_CAPABILITIES: &[&str] = &[
    "filesystem.read",
    "filesystem.write",
    "network.connect",
    "process.spawn",
];

/// Whether an enforcing decorator exists for `capability` in this host ("help/status
/// must state whether an enforcing decorator exists"): none does; the process runs with
/// the daemon user's privileges ("Trust model").
pub fn capability_enforcement(capability: &str) -> &'static str {
    if KNOWN_CAPABILITIES.contains(&capability) {
        "declared, not enforced: no enforcing decorator exists; the plugin runs with the host user's privileges"
    } else {
        "unknown capability"
    }
}

/// Hex HMAC-SHA256 of `message` under `secret` (the secret's text as the key).
fn mac_hex(secret: &str, message: &[u8]) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

/// The plugin's launch-secret proof for `challenge` (`InitializeResponse.secret_proof`).
pub fn secret_proof(secret: &str, challenge: &str) -> String {
    mac_hex(secret, format!("{PROOF_DOMAIN}{challenge}").as_bytes())
}

/// The host's proof on every call: the value of [`AUTH_METADATA`] is `Bearer ` and this.
pub fn host_proof(secret: &str) -> String {
    mac_hex(secret, HOST_DOMAIN.as_bytes())
}

/// Compares two proofs in constant time.
pub fn proofs_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A fresh random value of [`SECRET_HEX_LEN`] lowercase hexadecimal characters (a launch
/// secret or a challenge).
pub fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Whether `s` is [`SECRET_HEX_LEN`] lowercase hexadecimal characters.
pub fn is_secret_shaped(s: &str) -> bool {
    s.len() == SECRET_HEX_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a name or identifier is refused (`invalid_tool_name`, `invalid_call_id`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct InvalidName {
    /// Stable code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

/// Checks a tool name: 1 to [`MAX_TOOL_NAME_BYTES`] of `a-z 0-9 _ . -`, starting with a
/// letter.
///
/// # Errors
/// `invalid_tool_name`, naming the rule broken.
pub fn check_tool_name(name: &str) -> Result<(), InvalidName> {
    let bad = |m: String| InvalidName {
        code: "invalid_tool_name",
        message: m,
    };
    if name.is_empty() || name.len() > MAX_TOOL_NAME_BYTES {
        return Err(bad(format!(
            "a tool name is 1 to {MAX_TOOL_NAME_BYTES} bytes, not {}",
            name.len()
        )));
    }
    if !name.as_bytes()[0].is_ascii_lowercase() {
        return Err(bad(format!("tool name {name:?} must start with a-z")));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '.' | '-'))
    {
        return Err(bad(format!("tool name {name:?} holds {c:?}")));
    }
    Ok(())
}

/// Checks a call ID or progress token: 1 to [`MAX_CALL_ID_BYTES`] of
/// `A-Z a-z 0-9 _ . : -`.
///
/// # Errors
/// `invalid_call_id`, naming the field and the rule broken.
pub fn check_call_id(field: &str, id: &str) -> Result<(), InvalidName> {
    let bad = |m: String| InvalidName {
        code: "invalid_call_id",
        message: m,
    };
    if id.is_empty() || id.len() > MAX_CALL_ID_BYTES {
        return Err(bad(format!(
            "{field} is 1 to {MAX_CALL_ID_BYTES} bytes, not {}",
            id.len()
        )));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
    {
        return Err(bad(format!("{field} holds {c:?}")));
    }
    Ok(())
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character
/// boundary (bounded failure and progress texts).
pub use crate::wire::bounded::utf8_prefix as clip;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_are_bound_to_the_secret_and_the_challenge() {
        let s1 = random_hex();
        let s2 = random_hex();
        let c = random_hex();
        assert!(is_secret_shaped(&s1) && is_secret_shaped(&c));
        assert_eq!(secret_proof(&s1, &c), secret_proof(&s1, &c));
        assert_ne!(secret_proof(&s1, &c), secret_proof(&s2, &c));
        assert_ne!(secret_proof(&s1, &c), secret_proof(&s1, &random_hex()));
        assert_ne!(secret_proof(&s1, &c), host_proof(&s1));
        assert!(proofs_equal(&host_proof(&s1), &host_proof(&s1)));
        assert!(!proofs_equal(&host_proof(&s1), &host_proof(&s2)));
        assert!(!is_secret_shaped(&s1.to_uppercase()));
    }

    #[test]
    fn the_launch_contracts_vectors_fix_the_encoding_for_other_languages() {
        // docs/plugin-launch-contract.md, "Authentication": the key is the secret's 64
        // hexadecimal characters as ASCII, not the 32 bytes they encode.
        let secret = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let challenge = "ff".repeat(32);
        assert_eq!(
            secret_proof(secret, &challenge),
            "f8d80f50d119bdcf5fb02c69adc704a07483c9705d9ae226e6dd20e00abe6aa5"
        );
        assert_eq!(
            host_proof(secret),
            "563509441343f50738011e0b8d259e8c522e2a64715421af760232cc99da0b88"
        );
        // Keyed with the decoded bytes, the proof is another one: the mistake the
        // vector is there to catch.
        let decoded: Vec<u8> = (0u8..32).collect();
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&decoded).expect("any key length");
        mac.update(format!("plugin.v1 initialize {challenge}").as_bytes());
        assert_ne!(
            hex::encode(mac.finalize().into_bytes()),
            secret_proof(secret, &challenge)
        );
    }

    #[test]
    fn tool_names_at_their_edges() {
        assert!(check_tool_name("a").is_ok());
        assert!(check_tool_name(&"a".repeat(MAX_TOOL_NAME_BYTES)).is_ok());
        assert!(check_tool_name(&"a".repeat(MAX_TOOL_NAME_BYTES + 1)).is_err());
        assert!(check_tool_name("").is_err());
        assert!(check_tool_name("1abc").is_err());
        assert!(check_tool_name("Echo").is_err());
        assert!(check_tool_name("fs.read_file-2").is_ok());
        assert!(check_tool_name("a b").is_err());
    }

    #[test]
    fn call_ids_at_their_edges() {
        assert!(check_call_id("call_id", "c").is_ok());
        assert!(check_call_id("call_id", &"c".repeat(MAX_CALL_ID_BYTES)).is_ok());
        assert!(check_call_id("call_id", &"c".repeat(MAX_CALL_ID_BYTES + 1)).is_err());
        assert!(check_call_id("call_id", "").is_err());
        assert!(check_call_id("call_id", "run:1.a-b_C").is_ok());
        assert!(check_call_id("call_id", "a/b").is_err());
        assert!(check_call_id("call_id", "é").is_err());
    }

    #[test]
    fn clip_keeps_whole_characters() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("héllo", 3), "hé");
        assert_eq!(clip("abc", 10), "abc");
    }

    #[test]
    fn every_known_capability_says_it_is_not_enforced() {
        for c in KNOWN_CAPABILITIES {
            assert!(capability_enforcement(c).contains("not enforced"));
        }
        assert_eq!(capability_enforcement("x"), "unknown capability");
    }
}
