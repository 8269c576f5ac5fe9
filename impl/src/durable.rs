//! Opening an embedded SQLite database where a spec says "durable": the file is made 0600
//! (it may hold identities and receipts), journaled in WAL mode and synced in full on
//! every commit (`synchronous=FULL`), so a SIGKILL loses nothing committed. Every
//! family's store opens its database here; none of them sets these pragmas itself.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rusqlite::Connection;

/// Opens (creating) the database at `path`.
///
/// # Errors
/// The SQLite or file-system error, as text naming the path.
pub fn open(path: &Path) -> Result<Connection, String> {
    let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| format!("{}: {e}", path.display()))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(conn)
}
