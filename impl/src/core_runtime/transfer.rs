//! The bounded, ordered, digest-checked chunked transfer shared by `runtime_prepare`
//! file/archive transfers and `workspace_write`.
//!
//! Spec ("Preparation and execution order"): "send `begin`, wait for `ready`, send
//! ordered `chunk`s and wait for each matching `received` offset, then send `commit` and
//! wait for `completed`. […] A chunk receipt confirms staged bytes, not installation."
//! Spec ("Workspace operations"): "`workspace_write` transfers the complete, bounded body
//! through acknowledged 64 KiB frames before the native writer runs, verifies the
//! declared digest […] The private transfer limit is 50 MiB […] a malformed, incomplete
//! or expired transfer never reaches the installer."
//!
//! [`ChunkedTransfer`] is the I/O-free state of one such transfer:
//!
//! ```text
//! begin(size, sha256, limit) ──► chunk(offset = received, data)* ──► commit() ──► body
//!        │ size > limit                │ offset ≠ received                │ received < size
//!        │ malformed digest            │ chunk > 64 KiB                   │ digest differs
//!        ▼                             ▼ received + len > size            ▼
//!   SizeExceeded / InvalidDigest   UnexpectedOffset / SizeExceeded   Incomplete / DigestMismatch
//! ```
//!
//! The body is staged in memory, never in a file: the spec forbids a staging directory
//! ("no external helper or staging directory"). Memory is bounded by the `limit` given to
//! [`ChunkedTransfer::begin`] (normally [`WRITE_TRANSFER_MAX_BYTES`], 50 MiB): the
//! declared size is reserved exactly when the first bytes arrive, so a `begin` that is
//! never followed by chunks costs nothing and a transfer never holds more than its
//! declared size.
//! The SHA-256 is computed incrementally as chunks arrive, so `commit` is O(1) in hashing.
//!
//! A rejected `chunk` stages nothing and leaves the state unchanged; the caller decides
//! (per spec, a failed transfer "is closed") whether to drop the transfer.
//!
//! [`WRITE_TRANSFER_MAX_BYTES`]: super::wire::limits::WRITE_TRANSFER_MAX_BYTES

use sha2::{Digest, Sha256};

use super::wire::limits::WRITE_CHUNK_MAX_BYTES;
use super::wire::{TransferErrorCode, WorkspaceErrorCode};

/// Length of a SHA-256 digest in bytes.
const SHA256_LEN: usize = 32;

/// Length of a hex SHA-256 digest on the wire (64 lower-case hex characters).
pub const SHA256_HEX_LEN: usize = 2 * SHA256_LEN;

/// Why a transfer step was refused. Every variant is a safe refusal: no bytes were
/// staged by the refused step, and nothing was installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// A chunk's offset is not the number of bytes received so far.
    #[error("unexpected chunk offset: expected {expected}, got {got}")]
    UnexpectedOffset {
        /// Bytes received so far (the only acceptable offset).
        expected: u64,
        /// The offset the chunk carried.
        got: u64,
    },
    /// The declared size exceeds the transfer limit, a chunk exceeds
    /// [`WRITE_CHUNK_MAX_BYTES`], or a chunk would carry the body past its declared size.
    #[error("transfer size exceeded")]
    SizeExceeded,
    /// `commit` arrived before all declared bytes.
    #[error("transfer incomplete: received {received} of {declared} bytes")]
    Incomplete {
        /// Bytes received.
        received: u64,
        /// Declared size.
        declared: u64,
    },
    /// The SHA-256 of the received body differs from the declared one.
    #[error("SHA-256 of the received body differs from the declared digest")]
    DigestMismatch,
    /// The declared digest is not 64 lower-case hex characters.
    #[error("declared SHA-256 is not 64 lower-case hex characters")]
    InvalidDigest,
}

impl TransferError {
    /// Stable snake_case code for tests, logs and goldens.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnexpectedOffset { .. } => "unexpected_offset",
            Self::SizeExceeded => "size_exceeded",
            Self::Incomplete { .. } => "incomplete",
            Self::DigestMismatch => "digest_mismatch",
            Self::InvalidDigest => "invalid_digest",
        }
    }

    /// The bounded `runtime_prepare_result` `failed` code.
    ///
    /// [`TransferErrorCode`] has no "malformed digest" category: `InvalidDigest` maps to
    /// `digest_mismatch`, since a malformed declared digest can never match the body.
    pub fn transfer_code(&self) -> TransferErrorCode {
        match self {
            Self::UnexpectedOffset { .. } => TransferErrorCode::UnexpectedOffset,
            Self::SizeExceeded => TransferErrorCode::SizeExceeded,
            Self::Incomplete { .. } => TransferErrorCode::Incomplete,
            Self::DigestMismatch | Self::InvalidDigest => TransferErrorCode::DigestMismatch,
        }
    }

    /// The bounded `workspace_write_result` `rejected` code.
    ///
    /// `InvalidDigest` maps to `invalid_request`: the `begin` frame carries a value the
    /// operation cannot accept ("The frame does not decode as this operation").
    pub fn workspace_code(&self) -> WorkspaceErrorCode {
        match self {
            Self::UnexpectedOffset { .. } => WorkspaceErrorCode::UnexpectedOffset,
            Self::SizeExceeded => WorkspaceErrorCode::SizeExceeded,
            Self::Incomplete { .. } => WorkspaceErrorCode::Incomplete,
            Self::DigestMismatch => WorkspaceErrorCode::DigestMismatch,
            Self::InvalidDigest => WorkspaceErrorCode::InvalidRequest,
        }
    }
}

/// One open chunked transfer: declared size and digest, the bytes staged so far (in
/// memory) and the running SHA-256.
pub struct ChunkedTransfer {
    declared_size: u64,
    expected: [u8; SHA256_LEN],
    body: Vec<u8>,
    hasher: Sha256,
}

impl std::fmt::Debug for ChunkedTransfer {
    // The staged body is deliberately not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkedTransfer")
            .field("declared_size", &self.declared_size)
            .field("received", &self.received())
            .field("sha256", &hex::encode(self.expected))
            .finish()
    }
}

impl ChunkedTransfer {
    /// Opens a transfer of `size` bytes whose SHA-256 is `sha256_hex` (64 lower-case hex
    /// characters, as the wire's `Sha256Hex` documents), bounded by `limit` bytes
    /// (normally [`WRITE_TRANSFER_MAX_BYTES`], 50 MiB; launch configuration may lower it).
    ///
    /// No memory is reserved up front.
    ///
    /// # Errors
    /// * [`TransferError::SizeExceeded`] when `size > limit`.
    /// * [`TransferError::InvalidDigest`] when `sha256_hex` is not 64 lower-case hex
    ///   characters (upper-case is refused: the wire form is lower-case only).
    ///
    /// [`WRITE_TRANSFER_MAX_BYTES`]: super::wire::limits::WRITE_TRANSFER_MAX_BYTES
    pub fn begin(size: u64, sha256_hex: &str, limit: u64) -> Result<Self, TransferError> {
        if size > limit {
            return Err(TransferError::SizeExceeded);
        }
        let expected = parse_sha256_hex(sha256_hex).ok_or(TransferError::InvalidDigest)?;
        Ok(Self {
            declared_size: size,
            expected,
            body: Vec::new(),
            hasher: Sha256::new(),
        })
    }

    /// Stages one ordered chunk and returns the bytes received so far (the `received`
    /// field of the receipt). An empty chunk at the right offset is accepted and stages
    /// nothing.
    ///
    /// Checks, in this order (a refused chunk stages nothing):
    /// 1. `data.len() > WRITE_CHUNK_MAX_BYTES` (64 KiB) → [`TransferError::SizeExceeded`];
    /// 2. `offset != received()` → [`TransferError::UnexpectedOffset`];
    /// 3. `received() + data.len() > declared_size()` → [`TransferError::SizeExceeded`].
    ///
    /// # Errors
    /// As listed above.
    pub fn chunk(&mut self, offset: u64, data: &[u8]) -> Result<u64, TransferError> {
        if data.len() > WRITE_CHUNK_MAX_BYTES {
            return Err(TransferError::SizeExceeded);
        }
        let received = self.received();
        if offset != received {
            return Err(TransferError::UnexpectedOffset {
                expected: received,
                got: offset,
            });
        }
        // `data.len() <= 64 KiB`, so the conversion cannot fail on any platform.
        let len = u64::try_from(data.len()).map_err(|_| TransferError::SizeExceeded)?;
        let after = received
            .checked_add(len)
            .ok_or(TransferError::SizeExceeded)?;
        if after > self.declared_size {
            return Err(TransferError::SizeExceeded);
        }
        if self.body.capacity() == 0 && !data.is_empty() {
            // Reserve exactly the declared size once, so memory never exceeds it (no
            // doubling growth). On allocation failure fall back to ordinary growth.
            let declared = usize::try_from(self.declared_size).unwrap_or(usize::MAX);
            let _ = self.body.try_reserve_exact(declared);
        }
        self.body.extend_from_slice(data);
        self.hasher.update(data);
        Ok(after)
    }

    /// Verifies the complete body and returns it for installation.
    ///
    /// # Errors
    /// * [`TransferError::Incomplete`] when fewer than the declared bytes arrived.
    /// * [`TransferError::DigestMismatch`] when the body's SHA-256 differs.
    pub fn commit(self) -> Result<Vec<u8>, TransferError> {
        let received = self.received();
        if received < self.declared_size {
            return Err(TransferError::Incomplete {
                received,
                declared: self.declared_size,
            });
        }
        let actual: [u8; SHA256_LEN] = self.hasher.finalize().into();
        if actual != self.expected {
            return Err(TransferError::DigestMismatch);
        }
        Ok(self.body)
    }

    /// Bytes staged so far.
    pub fn received(&self) -> u64 {
        // A `Vec` length always fits in `u64` on supported platforms (at most 64-bit).
        u64::try_from(self.body.len()).unwrap_or(u64::MAX)
    }

    /// The size declared by `begin`, in bytes.
    pub fn declared_size(&self) -> u64 {
        self.declared_size
    }

    /// The declared SHA-256 as 64 lower-case hex characters (for the `completed` /
    /// `committed` receipt).
    pub fn declared_sha256_hex(&self) -> String {
        hex::encode(self.expected)
    }
}

/// Parses exactly 64 lower-case hex characters.
fn parse_sha256_hex(s: &str) -> Option<[u8; SHA256_LEN]> {
    if s.len() != SHA256_HEX_LEN || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; SHA256_LEN];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::wire::limits::WRITE_TRANSFER_MAX_BYTES;

    fn sha(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    #[test]
    fn ordered_chunks_commit_to_the_body() {
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut t = ChunkedTransfer::begin(body.len() as u64, &sha(&body), 1 << 20).unwrap();
        assert_eq!(t.declared_size(), body.len() as u64);
        assert_eq!(t.declared_sha256_hex(), sha(&body));
        let mut offset = 0u64;
        for piece in body.chunks(WRITE_CHUNK_MAX_BYTES) {
            let received = t.chunk(offset, piece).unwrap();
            offset += piece.len() as u64;
            assert_eq!(received, offset);
            assert_eq!(t.received(), offset);
        }
        assert_eq!(t.commit().unwrap(), body);
    }

    #[test]
    fn empty_body_commits() {
        let t = ChunkedTransfer::begin(0, &sha(b""), 0).unwrap();
        assert_eq!(t.commit().unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn offset_must_equal_received() {
        let body = b"hello world";
        let mut t = ChunkedTransfer::begin(11, &sha(body), 100).unwrap();
        assert_eq!(
            t.chunk(1, b"hello"),
            Err(TransferError::UnexpectedOffset {
                expected: 0,
                got: 1
            })
        );
        assert_eq!(t.received(), 0, "a refused chunk stages nothing");
        t.chunk(0, b"hello").unwrap();
        // A replayed chunk is out of order too.
        let err = t.chunk(0, b"hello").unwrap_err();
        assert_eq!(err.code(), "unexpected_offset");
        assert_eq!(err.transfer_code(), TransferErrorCode::UnexpectedOffset);
        assert_eq!(err.workspace_code(), WorkspaceErrorCode::UnexpectedOffset);
        t.chunk(5, b" world").unwrap();
        assert_eq!(t.commit().unwrap(), body);
    }

    #[test]
    fn chunk_past_declared_size_is_size_exceeded() {
        let mut t = ChunkedTransfer::begin(4, &sha(b"abcd"), 100).unwrap();
        t.chunk(0, b"abc").unwrap();
        let err = t.chunk(3, b"de").unwrap_err();
        assert_eq!(err, TransferError::SizeExceeded);
        assert_eq!(err.transfer_code(), TransferErrorCode::SizeExceeded);
        assert_eq!(err.workspace_code(), WorkspaceErrorCode::SizeExceeded);
        assert_eq!(t.received(), 3);
    }

    #[test]
    fn oversized_chunk_is_size_exceeded() {
        let big = vec![0u8; WRITE_CHUNK_MAX_BYTES + 1];
        let mut t = ChunkedTransfer::begin(big.len() as u64, &sha(&big), u64::MAX).unwrap();
        assert_eq!(t.chunk(0, &big), Err(TransferError::SizeExceeded));
        // Exactly 64 KiB is fine.
        t.chunk(0, &big[..WRITE_CHUNK_MAX_BYTES]).unwrap();
    }

    #[test]
    fn size_bound_is_the_limit() {
        let digest = sha(b"");
        let limit = WRITE_TRANSFER_MAX_BYTES;
        assert!(ChunkedTransfer::begin(limit, &digest, limit).is_ok());
        let err = ChunkedTransfer::begin(limit + 1, &digest, limit).unwrap_err();
        assert_eq!(err, TransferError::SizeExceeded);
        assert_eq!(err.code(), "size_exceeded");
        assert!(ChunkedTransfer::begin(u64::MAX, &digest, limit).is_err());
    }

    #[test]
    fn fifty_mib_transfer_commits() {
        let limit = WRITE_TRANSFER_MAX_BYTES;
        let chunk = vec![0x5au8; WRITE_CHUNK_MAX_BYTES];
        let chunks = limit / WRITE_CHUNK_MAX_BYTES as u64;
        let mut hasher = Sha256::new();
        for _ in 0..chunks {
            hasher.update(&chunk);
        }
        let digest = hex::encode(hasher.finalize());
        let mut t = ChunkedTransfer::begin(limit, &digest, limit).unwrap();
        let mut offset = 0;
        for _ in 0..chunks {
            offset = t.chunk(offset, &chunk).unwrap();
        }
        assert_eq!(offset, limit);
        // One byte more than declared (and than the limit) is refused.
        assert_eq!(t.chunk(offset, b"x"), Err(TransferError::SizeExceeded));
        assert_eq!(t.commit().unwrap().len() as u64, limit);
    }

    #[test]
    fn early_commit_is_incomplete() {
        let mut t = ChunkedTransfer::begin(4, &sha(b"abcd"), 100).unwrap();
        t.chunk(0, b"ab").unwrap();
        let err = t.commit().unwrap_err();
        assert_eq!(
            err,
            TransferError::Incomplete {
                received: 2,
                declared: 4
            }
        );
        assert_eq!(err.transfer_code(), TransferErrorCode::Incomplete);
        assert_eq!(err.workspace_code(), WorkspaceErrorCode::Incomplete);
    }

    #[test]
    fn wrong_body_is_digest_mismatch() {
        let mut t = ChunkedTransfer::begin(4, &sha(b"abcd"), 100).unwrap();
        t.chunk(0, b"abce").unwrap();
        let err = t.commit().unwrap_err();
        assert_eq!(err, TransferError::DigestMismatch);
        assert_eq!(err.code(), "digest_mismatch");
        assert_eq!(err.transfer_code(), TransferErrorCode::DigestMismatch);
        assert_eq!(err.workspace_code(), WorkspaceErrorCode::DigestMismatch);
    }

    #[test]
    fn malformed_digest_is_invalid_digest() {
        let good = sha(b"x");
        for bad in [
            String::new(),
            "00".into(),
            good.to_uppercase(),
            format!("{}0", good),
            good[..63].to_string(),
            format!("{}g", &good[..63]),
            format!("{}é", &good[..62]),
        ] {
            let err = ChunkedTransfer::begin(1, &bad, 100).unwrap_err();
            assert_eq!(err, TransferError::InvalidDigest, "{bad:?}");
            assert_eq!(err.code(), "invalid_digest");
            assert_eq!(err.transfer_code(), TransferErrorCode::DigestMismatch);
            assert_eq!(err.workspace_code(), WorkspaceErrorCode::InvalidRequest);
        }
    }

    #[test]
    fn debug_does_not_print_the_body() {
        let mut t = ChunkedTransfer::begin(6, &sha(b"secret"), 100).unwrap();
        t.chunk(0, b"secret").unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("secret"));
        assert!(shown.contains("received: 6"));
    }
}
