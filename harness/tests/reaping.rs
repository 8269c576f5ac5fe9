//! No target outlives the harness: a harness killed outright (SIGKILL, no destructor
//! runs) still leaves no target process behind.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The parent PID and command name of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(i32, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 2..].split(' ');
    let state = rest.next()?;
    if state == "Z" {
        return None;
    }
    Some((rest.next()?.parse().ok()?, comm))
}

fn children_named(parent: i32, name: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(ppid, comm)| ppid == parent && comm == name))
        .collect()
}

/// Polls `condition` every 20 ms until it holds or `bound` passes.
fn eventually(bound: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

#[test]
fn a_target_dies_with_a_harness_killed_outright() {
    let scenarios = tempfile::tempdir().unwrap();
    // A target that never becomes ready: the harness waits for it when it is killed.
    let mut harness = Command::new(env!("CARGO_BIN_EXE_contract-harness"))
        .args([
            "run",
            "--family",
            "core_runtime",
            "--side",
            "core",
            "--filter",
            "core_runtime/core_error_then_done",
            "--target-cmd",
            "sleep 600",
        ])
        .current_dir(scenarios.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let harness_pid = harness.id() as i32;
    let mut target = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            target = children_named(harness_pid, "sleep");
            !target.is_empty()
        }),
        "the harness never started its target"
    );
    harness.kill().unwrap();
    harness.wait().unwrap();
    let target = target[0];
    let gone = eventually(Duration::from_secs(30), || stat(target).is_none());
    if !gone {
        let _ = Command::new("kill")
            .args(["-9", &target.to_string()])
            .status();
    }
    assert!(gone, "target {target} outlived the harness killed outright");
}
