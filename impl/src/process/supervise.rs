//! The supervisor: the process a host actually spawns for a program it did not write (a
//! worker, a tool plugin, a command Harness program), so that no process of that program
//! outlives the host, even when the host is killed with SIGKILL
//! ("Rust retains the final hard-stop authority"; the spec's own caveat, "only the direct
//! child is currently managed, not all descendants", is what this closes).
//!
//! `contract-impl worker supervise -- PROGRAM [ARGS…]` with `CONTRACT_SUPERVISOR_WATCH`
//! naming a Unix socket the host listens on:
//!
//! 1. it marks itself a child subreaper (descendants whose parent dies are re-parented to
//!    it, whatever process group or session they moved to);
//! 2. it connects to the watch socket and keeps the connection: the host holds the other
//!    end, so the host's death (any signal, SIGKILL included) or its hard stop (it drops
//!    the connection) is an end of stream here;
//! 3. it starts the worker in a process group of its own (environment passed on, the
//!    watch variable removed);
//! 4. when the watch ends it SIGKILLs the worker's group, then every descendant left
//!    (each re-parented one and its group), reaps them all, removes the scratch roots
//!    of dead processes (`crate::process::scratch`) and exits 137; when the worker
//!    exits first it does the same for what the worker left behind and exits with the
//!    worker's status (128 + signal when a signal ended it, after writing
//!    `signal <N>\n` on the watch connection).
//!
//! It never reads or writes the worker's protocol socket and never outlives its worker's
//! descendants by more than [`SWEEP_BOUND`].

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpid};

/// The environment variable naming the host's watch socket.
pub const WATCH_ENV: &str = "CONTRACT_SUPERVISOR_WATCH";

/// The environment variable naming the host's temporary directory, whose scratch roots
/// of dead processes ([`crate::process::scratch`]) the supervisor removes when its watch
/// ends (the host may pass the program a reduced environment without `TMPDIR`). Unset:
/// nothing is swept. Not passed on to the worker.
pub const SCRATCH_BASE_ENV: &str = "CONTRACT_SUPERVISOR_SCRATCH";

/// Exit status after the watch ended (the host is gone or stopped the worker): 128 +
/// SIGKILL, as if the worker had been killed.
pub const EXIT_WATCH_ENDED: i32 = 137;

/// Exit status when the supervisor cannot start (no watch socket, no program).
pub const EXIT_CANNOT_START: i32 = 2;

/// Longest the final sweep of descendants may take before the supervisor gives up.
pub const SWEEP_BOUND: Duration = Duration::from_secs(3);

/// Pause between two rounds of reaping.
const POLL: Duration = Duration::from_millis(10);

/// Runs the supervisor; returns its exit status.
pub fn run(program: &[OsString]) -> i32 {
    run_with(program, false)
}

/// [`run`]; with `reraise_signal`, a worker ended by a signal ends the supervisor by the
/// same signal (after the sweep) instead of exiting 128 + signal, so that whoever waits
/// for the supervisor sees the worker's own status (the command adapter reports "program
/// was terminated by signal N" exactly as without a supervisor).
pub fn run_with(program: &[OsString], reraise_signal: bool) -> i32 {
    let Some((name, args)) = program.split_first() else {
        eprintln!("contract-impl worker supervise: no program to run");
        return EXIT_CANNOT_START;
    };
    let Some(watch_path) = std::env::var_os(WATCH_ENV) else {
        eprintln!("contract-impl worker supervise: {WATCH_ENV} is not set");
        return EXIT_CANNOT_START;
    };
    if let Err(e) = crate::process::group::become_subreaper() {
        eprintln!("contract-impl worker supervise: cannot become a subreaper: {e}");
        return EXIT_CANNOT_START;
    }
    let mut watch = match UnixStream::connect(&watch_path) {
        Ok(stream) => stream,
        Err(e) => {
            eprintln!(
                "contract-impl worker supervise: cannot connect to {}: {e}",
                std::path::Path::new(&watch_path).display()
            );
            return EXIT_CANNOT_START;
        }
    };
    let scratch_base = std::env::var_os(SCRATCH_BASE_ENV);
    let child = Command::new(name)
        .args(args)
        .env_remove(WATCH_ENV)
        .env_remove(SCRATCH_BASE_ENV)
        .process_group(0)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "contract-impl worker supervise: cannot start {}: {e}",
                name.to_string_lossy()
            );
            return EXIT_CANNOT_START;
        }
    };
    let worker = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    // The host learns the worker's process group, so that it can still stop the worker
    // should this supervisor be killed.
    let _ = std::io::Write::write_all(&mut watch, format!("pid {}\n", child.id()).as_bytes());
    // Written to at the end: the signal that ended the worker, when one did.
    let mut report = watch.try_clone().ok();
    // The watch: a thread blocked on the socket, reporting its end.
    let (ended_tx, ended) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            match watch.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = ended_tx.send(());
    });
    loop {
        if ended.try_recv().is_ok() {
            sweep(worker);
            remove_private_dir(std::path::Path::new(&watch_path));
            // A host killed outright left its scratch root (the program's working
            // directory, for a Run without an execution environment) behind.
            if let Some(base) = &scratch_base {
                crate::process::scratch::sweep_stale(std::path::Path::new(base));
            }
            return EXIT_WATCH_ENDED;
        }
        match waitpid(worker, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => {
                sweep(worker);
                return code;
            }
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                sweep(worker);
                // Said on the watch before anything else: a signal the supervisor cannot
                // re-raise (one Rust's runtime handles or ignores: SIGSEGV, SIGBUS,
                // SIGPIPE) is still reported as the worker's.
                if let Some(report) = report.as_mut() {
                    let line = format!("signal {}\n", signal as i32);
                    let _ = std::io::Write::write_all(report, line.as_bytes());
                }
                if reraise_signal {
                    // Default dispositions survive exec (the supervisor installs no
                    // handler); an ignored signal falls through to the exit status.
                    let _ = kill(getpid(), signal);
                }
                return 128 + signal as i32;
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => {
                // Reaped elsewhere (cannot happen: it is our only direct child).
                let status = std::process::ExitStatus::from_raw(0);
                sweep(worker);
                return status.code().unwrap_or(0);
            }
        }
        // Orphans re-parented to us meanwhile are reaped as they exit.
        reap_others(worker);
        std::thread::sleep(POLL);
    }
}

/// Reaps exited children other than the worker.
/// The host is gone or gave the generation up: its private directory (the watch
/// socket's, named `cw-…` by the host) goes too, so that a host killed with SIGKILL
/// leaves no socket behind. Anything else is left alone.
fn remove_private_dir(watch: &std::path::Path) {
    if let Some(dir) = watch.parent()
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("cw-"))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn reap_others(worker: Pid) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) if status.pid() == Some(worker) => return,
            Ok(_) => {}
        }
    }
}

/// Kills the worker's group and every descendant re-parented to us, and reaps them, for
/// at most [`SWEEP_BOUND`].
fn sweep(worker: Pid) {
    let deadline = Instant::now() + SWEEP_BOUND;
    let _ = killpg(worker, Signal::SIGKILL);
    let _ = kill(worker, Signal::SIGKILL);
    loop {
        for pid in children() {
            if let Ok(group) = getpgid(Some(pid))
                && group != getpgid(None).unwrap_or(group)
            {
                let _ = killpg(group, Signal::SIGKILL);
            }
            let _ = kill(pid, Signal::SIGKILL);
        }
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Err(Errno::ECHILD) => return,
            Ok(WaitStatus::StillAlive) => {
                if Instant::now() >= deadline {
                    eprintln!("contract-impl worker supervise: descendants survived SIGKILL");
                    return;
                }
                std::thread::sleep(POLL);
            }
            _ => {}
        }
    }
}

/// Our children, from `/proc` (each process's parent in its `stat`).
fn children() -> Vec<Pid> {
    let me = getpid().as_raw();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split(' ').nth(1)?.parse::<i32>().ok()
                })
                == Some(me)
        })
        .map(Pid::from_raw)
        .collect()
}
