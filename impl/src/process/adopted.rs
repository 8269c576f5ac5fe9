//! Processes re-parented to this process (a child subreaper) that nobody else waits for.
//!
//! A host marked a child subreaper ([`super::group::become_subreaper`]) inherits the
//! descendants of a child that died before them. When that child was a program's
//! supervisor killed outright (SIGKILL), its sweep never ran: a descendant that left the
//! program's process group (`setsid`) is now the host's child, still running, and a
//! zombie once it exits. [`sweep`] finds such processes (children of this process in
//! `/proc` that the caller does not manage), SIGKILLs each with the group it leads and
//! reaps them.
//!
//! This module owns finding, killing and reaping adopted children. It never waits for a
//! PID the caller declares its own (a child a runtime such as Tokio reaps), so the
//! caller must list them while no new child can be spawned unlisted.

use std::collections::HashSet;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpid};

/// Longest an adopted-process sweep keeps going (killing what appears, reaping what
/// exited) before it gives up.
pub const SWEEP_BOUND: Duration = Duration::from_secs(3);

/// Pause between two rounds of a sweep.
const POLL: Duration = Duration::from_millis(10);

/// The PIDs whose parent is this process, read from `/proc/<pid>/stat` (zombies
/// included). Empty where `/proc` cannot be read.
pub fn children() -> Vec<Pid> {
    let me = getpid().as_raw();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_of(&stat))
                == Some(me)
        })
        .map(Pid::from_raw)
        .collect()
}

/// The parent PID in a `/proc/<pid>/stat` line: the field after the state, which
/// follows the last `)` (the command name may hold spaces and parentheses).
fn parent_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Kills and reaps every child of this process that `managed` (called for each round)
/// does not list, for at most [`SWEEP_BOUND`]; returns how many were reaped. `managed`
/// must be computed under the lock the caller spawns under, so a child just spawned is
/// never taken for an adopted one.
pub async fn sweep(mut managed: impl FnMut() -> HashSet<i32>) -> usize {
    let deadline = tokio::time::Instant::now() + SWEEP_BOUND;
    let mut reaped = 0;
    loop {
        let known = managed();
        let adopted: Vec<Pid> = children()
            .into_iter()
            .filter(|pid| !known.contains(&pid.as_raw()))
            .collect();
        if adopted.is_empty() {
            return reaped;
        }
        for pid in adopted {
            // The group it leads (a `setsid` escapee's own), then the process itself.
            if getpgid(Some(pid)) == Ok(pid) {
                let _ = killpg(pid, Signal::SIGKILL);
            }
            let _ = kill(pid, Signal::SIGKILL);
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
                Ok(_) => reaped += 1,
                // ECHILD: reaped by someone else meanwhile.
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return reaped;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_is_read_after_the_command_name() {
        assert_eq!(parent_of("42 (sleep) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("42 (a) b (c) Z 9 1 1"), Some(9));
        assert_eq!(parent_of("garbage"), None);
    }
}
