//! Snapshot authority ("Operations", "Security boundary"): "Export requires a trusted
//! signer and import requires keyed HMAC verification before state mutation; an unkeyed
//! structural check is never import authority." "Snapshot authority uses a distinct
//! server-owned key. The public 32-byte scope ID and positive generation select that
//! key; neither is a secret. [...] Scope keys must never be derived from or reused as
//! endpoint authentication tokens."
//!
//! Keys live in the daemon's database (`snapshot_keys`): a random 32-byte key per
//! (scope ID, generation), created on first start, or given by the operator in a 0600
//! key file so that several daemons trust each other's snapshots. The MAC is
//! HMAC-SHA256 over the domain [`MAC_DOMAIN`] and every field of the snapshot except the
//! MAC itself, each length-prefixed ([`mac_input`]), so no two snapshots share an input.
//!
//! This module owns the keys and the MAC; it never reads or changes a run.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use rusqlite::{Connection, OptionalExtension, params};
use sha2::Sha256;
use tonic::Status;

use crate::engine::proto::engine::v1::{Snapshot, SnapshotAuthority};

/// The MAC domain of snapshot-authority-v1 (the manifest's `mac_domains`).
pub const MAC_DOMAIN: &str = "engine.v1/snapshot-authority-v1";

/// Bytes of a scope ID ("The public 32-byte scope ID").
pub const SCOPE_ID_BYTES: usize = 32;

/// Bytes of a scope key.
pub const KEY_BYTES: usize = 32;

/// Largest encoded snapshot state, bytes.
pub const STATE_MAX_BYTES: usize = 1024 * 1024;

/// An operator-provided key (`--snapshot-key-file`, JSON, file mode 0600).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    /// The scope ID, 64 hex digits.
    pub scope_id: String,
    /// The key generation, ≥ 1.
    pub generation: u64,
    /// The key, 64 hex digits.
    pub key: String,
}

/// The signer and verifier.
#[derive(Clone)]
pub struct Authority {
    db: Arc<Mutex<Connection>>,
    signer: ([u8; SCOPE_ID_BYTES], u64),
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Authority(scope {}, generation {})",
            hex::encode(self.signer.0),
            self.signer.1
        )
    }
}

fn parse_key_file(path: &Path) -> Result<([u8; 32], u64, [u8; 32]), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{}: a snapshot key file must not be readable by group or others (mode 0600)",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: KeyFile =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let hex32 = |what: &str, v: &str| -> Result<[u8; 32], String> {
        hex::decode(v)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| format!("{}: {what} must be 64 hex digits", path.display()))
    };
    if file.generation == 0 {
        return Err(format!("{}: generation must be positive", path.display()));
    }
    Ok((
        hex32("scope_id", &file.scope_id)?,
        file.generation,
        hex32("key", &file.key)?,
    ))
}

impl Authority {
    /// Opens the key table in `db`; the signer is the key file's key when given (added
    /// to the table), else the daemon's own key (created once).
    ///
    /// # Errors
    /// A key file that is unreadable, not private or malformed; the SQLite error.
    pub fn open(db: Arc<Mutex<Connection>>, key_file: Option<&Path>) -> Result<Self, String> {
        let given = key_file.map(parse_key_file).transpose()?;
        let signer = {
            let conn = db.lock().map_err(|_| "poisoned".to_string())?;
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS snapshot_keys (
                     scope_id BLOB NOT NULL,
                     generation INTEGER NOT NULL CHECK (generation >= 1),
                     key BLOB NOT NULL,
                     own INTEGER NOT NULL DEFAULT 0,
                     PRIMARY KEY (scope_id, generation)
                 );",
            )
            .map_err(|e| e.to_string())?;
            if let Some((scope, generation, key)) = given {
                let existing: Option<Vec<u8>> = conn
                    .query_row(
                        "SELECT key FROM snapshot_keys WHERE scope_id = ?1 AND generation = ?2",
                        params![scope.as_slice(), generation as i64],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(|e| e.to_string())?;
                match existing {
                    Some(k) if k != key => {
                        return Err(
                            "the key file's scope and generation already select another key".into(),
                        );
                    }
                    Some(_) => {}
                    None => {
                        conn.execute(
                            "INSERT INTO snapshot_keys (scope_id, generation, key) VALUES (?1, ?2, ?3)",
                            params![scope.as_slice(), generation as i64, key.as_slice()],
                        )
                        .map_err(|e| e.to_string())?;
                    }
                }
                (scope, generation)
            } else {
                let own: Option<(Vec<u8>, i64)> = conn
                    .query_row(
                        "SELECT scope_id, generation FROM snapshot_keys WHERE own = 1",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(|e| e.to_string())?;
                match own {
                    Some((scope, generation)) => (
                        <[u8; 32]>::try_from(scope)
                            .map_err(|_| "a stored scope ID is not 32 bytes")?,
                        generation as u64,
                    ),
                    None => {
                        let scope: [u8; SCOPE_ID_BYTES] = rand::random();
                        let key: [u8; KEY_BYTES] = rand::random();
                        conn.execute(
                            "INSERT INTO snapshot_keys (scope_id, generation, key, own) VALUES (?1, 1, ?2, 1)",
                            params![scope.as_slice(), key.as_slice()],
                        )
                        .map_err(|e| e.to_string())?;
                        (scope, 1)
                    }
                }
            }
        };
        Ok(Self { db, signer })
    }

    fn key(&self, scope: &[u8], generation: u64) -> Result<Option<Vec<u8>>, Status> {
        let conn = self.db.lock().map_err(|_| Status::internal("poisoned"))?;
        conn.query_row(
            "SELECT key FROM snapshot_keys WHERE scope_id = ?1 AND generation = ?2",
            params![scope, i64::try_from(generation).unwrap_or(i64::MAX)],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| Status::unavailable(format!("snapshot keys: {e}")))
    }

    /// Signs `snapshot` (its authority is replaced).
    ///
    /// # Errors
    /// The key store failed.
    pub fn sign(&self, snapshot: &mut Snapshot) -> Result<(), Status> {
        let (scope, generation) = self.signer;
        let key = self
            .key(&scope, generation)?
            .ok_or_else(|| Status::internal("the signing key is missing"))?;
        snapshot.authority = Some(SnapshotAuthority {
            mac_domain: MAC_DOMAIN.into(),
            scope_id: scope.to_vec(),
            key_generation: generation,
            mac: Vec::new(),
        });
        let mac = mac(&key, snapshot);
        if let Some(a) = snapshot.authority.as_mut() {
            a.mac = mac;
        }
        Ok(())
    }

    /// Verifies `snapshot`'s authority with the key it selects, before anything else
    /// about it is trusted.
    ///
    /// # Errors
    /// `snapshot_unsigned`, `unknown_mac_domain`, `invalid_scope` (`INVALID_ARGUMENT`);
    /// `unknown_snapshot_key`, `snapshot_mac_invalid` (`PERMISSION_DENIED`).
    pub fn verify(&self, snapshot: &Snapshot) -> Result<(), Status> {
        let a = snapshot.authority.as_ref().ok_or_else(|| {
            Status::invalid_argument(
                "snapshot_unsigned: a snapshot without authority is never imported",
            )
        })?;
        if a.mac_domain != MAC_DOMAIN {
            return Err(Status::invalid_argument(format!(
                "unknown_mac_domain: {:?} is not {MAC_DOMAIN:?}",
                a.mac_domain
            )));
        }
        if a.scope_id.len() != SCOPE_ID_BYTES || a.key_generation == 0 {
            return Err(Status::invalid_argument(
                "invalid_scope: scope_id must be 32 bytes and key_generation positive",
            ));
        }
        let key = self.key(&a.scope_id, a.key_generation)?.ok_or_else(|| {
            Status::permission_denied(
                "unknown_snapshot_key: no key of this daemon matches the snapshot's scope and generation",
            )
        })?;
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&key)
            .map_err(|_| Status::internal("bad key length"))?;
        m.update(&mac_input(snapshot));
        m.verify_slice(&a.mac).map_err(|_| {
            Status::permission_denied("snapshot_mac_invalid: the snapshot's MAC does not verify")
        })
    }
}

/// The bytes the MAC covers: the domain, then the format version, run ID, suspended
/// flag, state, scope ID and key generation, each length-prefixed (u32 big-endian) or
/// fixed-width.
pub fn mac_input(snapshot: &Snapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(snapshot.state.len() + 128);
    let mut field = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    let (scope, generation) = snapshot
        .authority
        .as_ref()
        .map_or((&[][..], 0), |a| (a.scope_id.as_slice(), a.key_generation));
    field(MAC_DOMAIN.as_bytes());
    field(snapshot.format_version.as_bytes());
    field(snapshot.run_id.as_bytes());
    field(&[u8::from(snapshot.suspended)]);
    field(&snapshot.state);
    field(scope);
    field(&generation.to_be_bytes());
    out
}

/// HMAC-SHA256 of [`mac_input`] under `key`.
pub fn mac(key: &[u8], snapshot: &Snapshot) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(&mac_input(snapshot));
    m.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn db(dir: &Path) -> Arc<Mutex<Connection>> {
        Arc::new(Mutex::new(crate::durable::open(&dir.join("s.db")).unwrap()))
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            format_version: "v1alpha2".into(),
            run_id: "run-1".into(),
            suspended: true,
            state: b"{}".to_vec(),
            authority: None,
        }
    }

    #[test]
    fn signed_snapshots_verify_and_any_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let authority = Authority::open(db(dir.path()), None).unwrap();
        let mut s = snapshot();
        assert!(
            authority
                .verify(&s)
                .unwrap_err()
                .message()
                .starts_with("snapshot_unsigned")
        );
        authority.sign(&mut s).unwrap();
        authority.verify(&s).unwrap();
        for tamper in [
            |s: &mut Snapshot| s.state.push(b' '),
            |s: &mut Snapshot| s.run_id.push('x'),
            |s: &mut Snapshot| s.suspended = false,
            |s: &mut Snapshot| s.format_version = "v1alpha3".into(),
            |s: &mut Snapshot| s.authority.as_mut().unwrap().mac[0] ^= 1,
        ] {
            let mut t = s.clone();
            tamper(&mut t);
            assert_eq!(
                authority.verify(&t).unwrap_err().code(),
                tonic::Code::PermissionDenied
            );
        }
        let mut t = s.clone();
        t.authority.as_mut().unwrap().key_generation = 2;
        assert!(
            authority
                .verify(&t)
                .unwrap_err()
                .message()
                .starts_with("unknown_snapshot_key")
        );
        // Another daemon does not trust it; one sharing a key file does.
        let other = tempfile::tempdir().unwrap();
        let stranger = Authority::open(db(other.path()), None).unwrap();
        assert!(stranger.verify(&s).is_err());
        let key_file = dir.path().join("key.json");
        std::fs::write(
            &key_file,
            serde_json::to_string(&KeyFile {
                scope_id: "ab".repeat(32),
                generation: 3,
                key: "cd".repeat(32),
            })
            .unwrap(),
        )
        .unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Authority::open(db(other.path()), Some(&key_file)).is_err(),
            "0644 refused"
        );
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let a = Authority::open(db(other.path()), Some(&key_file)).unwrap();
        let third = tempfile::tempdir().unwrap();
        let b = Authority::open(db(third.path()), Some(&key_file)).unwrap();
        let mut s = snapshot();
        a.sign(&mut s).unwrap();
        b.verify(&s).unwrap();
        assert_eq!(s.authority.as_ref().unwrap().key_generation, 3);
    }
}
