//! A **death watchdog** for the process groups this process starts: a small POSIX shell
//! in its own process group reads a pipe from this process, which registers each group
//! it starts (`+<pgid>`) and each it has reaped (`-<pgid>`). When the pipe reaches end of
//! file (this process exited, even killed outright by SIGKILL, which skips every
//! destructor and group kill of its own) the watchdog kills every group still
//! registered with SIGKILL and exits.
//!
//! This stands in for `PR_SET_PDEATHSIG`, which needs a `pre_exec` hook (unsafe code,
//! forbidden in this workspace) and covers only the direct child, not its group.
//!
//! This module owns the watchdog process and its pipe. It never spawns the groups it
//! watches and never signals a group before this process exits (that stays the caller's
//! [`super::ProcessGroup`]). A group must be unregistered once reaped, so that a reused
//! group ID is never killed.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use std::os::unix::process::CommandExt;

use super::ProcessGroup;

/// The watchdog's script: one line per registration, kill what is left at end of file.
/// Signals a terminal or a process-group kill sends are ignored: only the end of the
/// pipe ends it.
const SCRIPT: &str = r#"trap '' INT TERM HUP QUIT
live=' '
while IFS= read -r line; do
  case $line in
    +*) live="$live${line#+} " ;;
    -*) g=${line#-}
        case $live in *" $g "*) live="${live%% $g *} ${live#* $g }" ;; esac ;;
  esac
done
for g in $live; do kill -9 "-$g" 2>/dev/null; done
"#;

static WATCHDOG: OnceLock<Option<Mutex<ChildStdin>>> = OnceLock::new();

fn pipe() -> Option<&'static Mutex<ChildStdin>> {
    WATCHDOG
        .get_or_init(|| {
            let mut child = Command::new("/bin/sh")
                .args(["-c", SCRIPT])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .inspect_err(|e| tracing::warn!("cannot start the process watchdog: {e}"))
                .ok()?;
            // Nobody waits for the watchdog: it outlives this process by design, and
            // init reaps it once it has done its work.
            let stdin = child.stdin.take()?;
            Some(Mutex::new(stdin))
        })
        .as_ref()
}

fn send(line: &str) {
    if let Some(pipe) = pipe() {
        let mut stdin = pipe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            tracing::warn!("process watchdog unreachable: {e}");
        }
    }
}

/// Starts the watchdog if it is not running yet. Called before spawning a group, so
/// that [`register`] right after the spawn is one pipe write: a process killed between
/// its spawn and its registration leaks that group, and starting `/bin/sh` there would
/// widen that window to a fork and an exec.
pub fn start() {
    let _ = pipe();
}

/// Registers `group`: it is killed if this process exits while it is registered.
/// Starts the watchdog on first use; without one (no `/bin/sh`) this logs and does
/// nothing.
pub fn register(group: ProcessGroup) {
    send(&format!("+{}\n", group.id()));
}

/// Unregisters `group`, once it is reaped (its ID may be reused from then on).
pub fn unregister(group: ProcessGroup) {
    send(&format!("-{}\n", group.id()));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script's bookkeeping: what is registered and not unregistered is killed,
    /// including IDs that are prefixes or suffixes of other registered IDs.
    #[test]
    fn the_script_kills_exactly_the_groups_still_registered() {
        let script = SCRIPT.replace("kill -9 \"-$g\" 2>/dev/null", "echo $g");
        assert_ne!(script, SCRIPT, "the test must not kill real groups");
        let mut child = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"+10\n+100\n+210\n+21\n-10\n-21\n+5\n-999\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let killed: Vec<&str> = std::str::from_utf8(&out.stdout)
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(killed, ["100", "210", "5"]);
    }
}
