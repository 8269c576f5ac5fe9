//! A child's process group: signal it, reap it, confirm it is gone.
//!
//! Killing a group does not reach a descendant that left it (`setsid`, `setpgid`); a
//! host that must leave no orphan also marks itself a child subreaper
//! ([`become_subreaper`]) so re-parented members are its to reap, and a member that
//! left the group is out of reach (documented by each caller).

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;

/// How long a group may take to empty after SIGKILL before it is reported as surviving.
pub const KILL_CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// Pause between two checks of whether a group is empty.
pub const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Marks this process a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): orphaned
/// descendants are re-parented to it instead of PID 1, so it can reap them.
///
/// # Errors
/// The `prctl` error.
pub fn become_subreaper() -> Result<(), Errno> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// The process group a child leads (spawned with `process_group(0)`: its ID is the
/// child's PID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup(Pid);

impl std::fmt::Display for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl ProcessGroup {
    /// The group `pgid`.
    pub fn new(pgid: Pid) -> Self {
        Self(pgid)
    }

    /// The group led by the child with PID `pid`.
    pub fn of_leader(pid: u32) -> Self {
        Self(Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)))
    }

    /// The group ID.
    pub fn id(self) -> Pid {
        self.0
    }

    /// Reaps the exited members of the group that are children of this process (the
    /// leader's re-parented descendants). Call only after the leader itself was reaped,
    /// so it never steals the leader's exit status from Tokio.
    pub fn reap(self) {
        let group = Pid::from_raw(-self.0.as_raw());
        loop {
            match waitpid(group, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                // ECHILD: none of our children is in the group.
                Err(_) => return,
            }
        }
    }

    /// Whether the group still has a member (a zombie counts), after reaping ours.
    pub fn is_alive(self) -> bool {
        self.reap();
        !matches!(killpg(self.0, None), Err(Errno::ESRCH))
    }

    /// Sends `signal` to every member; an empty group is not an error.
    pub fn signal(self, signal: Signal) {
        match killpg(self.0, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::warn!(pgid = %self.0, ?signal, error = %e, "cannot signal the process group");
            }
        }
    }

    /// Polls until the group is empty (`true`) or `deadline` passes (`false`).
    pub async fn wait_gone(self, deadline: Instant) -> bool {
        loop {
            if !self.is_alive() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(GROUP_POLL_INTERVAL).await;
        }
    }

    /// With the leader already reaped and SIGTERM already sent: waits until
    /// `term_deadline` for the group to empty, then SIGKILLs it and confirms.
    ///
    /// # Errors
    /// Members survived SIGKILL for [`KILL_CONFIRM_TIMEOUT`].
    pub async fn finish(self, term_deadline: Instant) -> Result<(), String> {
        if self.wait_gone(term_deadline).await {
            return Ok(());
        }
        self.signal(Signal::SIGKILL);
        if self.wait_gone(Instant::now() + KILL_CONFIRM_TIMEOUT).await {
            Ok(())
        } else {
            Err(format!(
                "process group {} still has members {} ms after SIGKILL",
                self.0,
                KILL_CONFIRM_TIMEOUT.as_millis()
            ))
        }
    }

    /// Terminates what is left of the group after its leader exited on its own:
    /// SIGTERM, `grace`, SIGKILL.
    ///
    /// # Errors
    /// As [`ProcessGroup::finish`].
    pub async fn clean(self, grace: Duration) -> Result<(), String> {
        if !self.is_alive() {
            return Ok(());
        }
        tracing::info!(pgid = %self.0, "terminating processes left behind by the program");
        self.signal(Signal::SIGTERM);
        self.finish(Instant::now() + grace).await
    }

    /// Stops the running `leader` and its group: SIGTERM, `grace`, SIGKILL; `Ok` once the
    /// leader was reaped and the group is empty.
    ///
    /// # Errors
    /// The leader did not exit, or members survived, [`KILL_CONFIRM_TIMEOUT`] after
    /// SIGKILL.
    pub async fn terminate(self, leader: &mut Child, grace: Duration) -> Result<(), String> {
        // The leader is not reaped yet, so the group ID cannot have been reused.
        self.signal(Signal::SIGTERM);
        let term_deadline = Instant::now() + grace;
        if tokio::time::timeout_at(term_deadline, leader.wait())
            .await
            .is_err()
        {
            self.signal(Signal::SIGKILL);
            if tokio::time::timeout(KILL_CONFIRM_TIMEOUT, leader.wait())
                .await
                .is_err()
            {
                return Err(format!(
                    "the program (pid {}) did not exit {} ms after SIGKILL",
                    self.0,
                    KILL_CONFIRM_TIMEOUT.as_millis()
                ));
            }
        }
        self.finish(term_deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use tokio::process::Command;

    fn spawn(script: &str) -> (Child, ProcessGroup) {
        let child = Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let group = ProcessGroup::of_leader(child.id().unwrap());
        (child, group)
    }

    #[tokio::test]
    async fn terminate_reaches_the_whole_group() {
        // The leader ignores SIGTERM; its background child sleeps.
        let (mut child, group) = spawn("trap '' TERM; sleep 30 & wait");
        assert!(group.is_alive());
        group
            .terminate(&mut child, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(!group.is_alive());
    }

    #[tokio::test]
    async fn clean_removes_what_the_leader_left_behind() {
        let (mut child, group) = spawn("sleep 30 & exit 0");
        child.wait().await.unwrap();
        assert!(
            group.is_alive(),
            "the background sleep is still in the group"
        );
        group.clean(Duration::from_millis(100)).await.unwrap();
        assert!(!group.is_alive());
        // An empty group is clean at once.
        group.clean(Duration::from_millis(100)).await.unwrap();
    }
}
