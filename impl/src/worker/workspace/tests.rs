//! Runs of real programs through [`Workspace`]: exit statuses, timeouts that take the
//! whole group, the output bound, the working directory, the replies' shapes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let lane = Arc::new(OperatorLane::open(dir.path()).unwrap());
    let ws = Workspace::open(&dir.path().join("ws"), lane, false).unwrap();
    (dir, ws)
}

async fn sh(ws: &Workspace, script: &str, timeout_ms: u64, max: u64) -> Value {
    run_in(ws, script, ".", timeout_ms, max).await.unwrap()
}

async fn run_in(
    ws: &Workspace,
    script: &str,
    cwd: &str,
    timeout_ms: u64,
    max: u64,
) -> Result<Value, (String, String)> {
    let argv = ["sh", "-c", script].map(String::from);
    split(ws.run(&argv, cwd, &BTreeMap::new(), timeout_ms, max).await)
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported_as_they_are() {
    let (_dir, ws) = workspace();
    let ok = sh(&ws, "printf out; printf err >&2", 10_000, 1000).await;
    assert_eq!(ok["exit_code"], 0);
    assert_eq!(ok["signal"], Value::Null);
    assert_eq!(
        (ok["stdout"].as_str(), ok["stderr"].as_str()),
        (Some("out"), Some("err"))
    );
    assert_eq!(ok["timed_out"], false);
    assert!(ok["elapsed_ms"].is_u64());
    let failed = sh(&ws, "exit 3", 10_000, 1000).await;
    assert_eq!(
        (&failed["exit_code"], &failed["signal"]),
        (&json!(3), &Value::Null)
    );
    let killed = sh(&ws, "kill -TERM $$", 10_000, 1000).await;
    assert_eq!(
        (&killed["exit_code"], &killed["signal"]),
        (&Value::Null, &json!(15))
    );
}

#[tokio::test]
async fn a_timeout_kills_the_whole_group_grandchildren_included() {
    let (_dir, ws) = workspace();
    let started = std::time::Instant::now();
    let value = sh(&ws, "sleep 100 & echo $! > bg.pid; sleep 100", 300, 1000).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(value["timed_out"], true);
    assert_eq!(
        (&value["exit_code"], &value["signal"]),
        (&Value::Null, &json!(9))
    );
    assert!(value["elapsed_ms"].as_u64().unwrap() >= 300);
    let pid: i32 = std::fs::read_to_string(ws.root().join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The reply comes once the group is empty.
    assert!(!pid_alive(pid), "the background sleep {pid} survived");
}

#[tokio::test]
async fn what_the_program_leaves_in_its_group_ends_with_it() {
    let (_dir, ws) = workspace();
    // The background sleep holds stdout open: the run still ends when sh does.
    let value = sh(&ws, "sleep 100 & echo $!", 10_000, 1000).await;
    assert_eq!(
        (&value["exit_code"], &value["timed_out"]),
        (&json!(0), &json!(false))
    );
    let pid: i32 = value["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(!pid_alive(pid), "the background sleep {pid} survived");
}

#[tokio::test]
async fn the_output_bound_is_exact_at_the_bound_and_counts_the_excess() {
    let (_dir, ws) = workspace();
    let at = sh(&ws, "printf 0123456789abcdef", 10_000, 16).await;
    assert_eq!(
        (
            &at["stdout"],
            &at["stdout_bytes"],
            &at["stdout_truncated_bytes"],
            &at["truncated"]
        ),
        (
            &json!("0123456789abcdef"),
            &json!(16),
            &json!(0),
            &json!(false)
        )
    );
    let past = sh(&ws, "printf 0123456789abcdefX", 10_000, 16).await;
    assert_eq!(
        (
            &past["stdout"],
            &past["stdout_bytes"],
            &past["stdout_truncated_bytes"],
            &past["truncated"]
        ),
        (
            &json!("0123456789abcdef"),
            &json!(17),
            &json!(1),
            &json!(true)
        )
    );
    // Far past it: everything is read (the program never blocks) and counted.
    let big = sh(
        &ws,
        "head -c 3000000 /dev/zero | tr '\\0' a; printf e >&2",
        30_000,
        1000,
    )
    .await;
    assert_eq!(big["exit_code"], 0);
    assert_eq!(big["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(big["stdout_truncated_bytes"], 3_000_000 - 1000);
    assert_eq!(
        (&big["stdout_bytes"], &big["stderr_bytes"]),
        (&json!(3_000_000), &json!(1))
    );
    assert_eq!(
        (&big["stderr"], &big["stderr_truncated_bytes"]),
        (&json!(""), &json!(1))
    );
}

#[tokio::test]
async fn a_reply_of_escaped_output_still_fits_one_frame() {
    let (_dir, ws) = workspace();
    let max = RUN_OUTPUT_BYTES_MAX;
    let value = sh(
        &ws,
        "head -c 1000000 /dev/zero | tr '\\0' '\\1'",
        30_000,
        max,
    )
    .await;
    let len = serde_json::to_string(&value).unwrap().len();
    assert!(len <= crate::worker::wire::limits::FRAME_MAX_BYTES - REPLY_ENVELOPE_MARGIN_BYTES);
    let kept = value["stdout"].as_str().unwrap().len() as u64;
    assert!(kept > 100_000, "cut no more than needed: {kept}");
    assert_eq!(
        kept + value["stdout_truncated_bytes"].as_u64().unwrap(),
        1_000_000
    );
}

#[tokio::test]
async fn cwd_escapes_are_refused_and_a_subdirectory_is_used() {
    let (_dir, ws) = workspace();
    std::fs::create_dir(ws.root().join("sub")).unwrap();
    std::os::unix::fs::symlink("/", ws.root().join("escape")).unwrap();
    let inside = run_in(&ws, "pwd -P", "sub", 10_000, 1000).await.unwrap();
    let expected = format!("{}\n", ws.root().join("sub").display());
    assert_eq!(inside["stdout"], json!(expected));
    for (cwd, code) in [
        ("..", "cwd_outside_workspace"),
        ("sub/../..", "cwd_outside_workspace"),
        ("escape", "cwd_outside_workspace"),
        ("missing", "cwd_not_found"),
    ] {
        let (got, message) = run_in(&ws, "true", cwd, 10_000, 1000).await.unwrap_err();
        assert_eq!(got, code, "{cwd}: {message}");
    }
}

#[tokio::test]
async fn the_program_gets_the_minimal_environment_and_the_requested_variables() {
    let (_dir, ws) = workspace();
    let argv = ["sh", "-c", "env | sort"].map(String::from);
    let env = BTreeMap::from([("EXTRA".to_string(), "1".to_string())]);
    let value = split(ws.run(&argv, ".", &env, 10_000, 100_000).await).unwrap();
    let names: Vec<&str> = value["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n))
        // What sh itself sets.
        .filter(|n| !["PWD", "SHLVL", "_", "OLDPWD"].contains(n))
        .collect();
    assert!(
        names.contains(&"EXTRA") && names.contains(&"PATH"),
        "{names:?}"
    );
    for name in &names {
        assert!(
            *name == "EXTRA" || INHERITED_ENV.contains(name),
            "{name} leaked"
        );
    }
}

#[tokio::test]
async fn refusals_are_typed_and_a_missing_program_is_a_spawn_failure() {
    let (_dir, ws) = workspace();
    let (code, _) = split(ws.run(&[], ".", &BTreeMap::new(), 1000, 1000).await).unwrap_err();
    assert_eq!(code, "argv_empty");
    let argv = ["no-such-program-here".to_string()];
    let (code, _) = split(ws.run(&argv, ".", &BTreeMap::new(), 1000, 1000).await).unwrap_err();
    assert_eq!(code, "spawn_failed");
    let (code, _) = run_in(&ws, "true", ".", 0, 1000).await.unwrap_err();
    assert_eq!(code, "timeout_out_of_range");
    let (code, _) = run_in(&ws, "true", ".", 1000, RUN_OUTPUT_BYTES_MAX + 1)
        .await
        .unwrap_err();
    assert_eq!(code, "output_bound_out_of_range");
    // The different profile names the same refusal otherwise.
    let dir = tempfile::tempdir().unwrap();
    let lane = Arc::new(OperatorLane::open(dir.path()).unwrap());
    let other = Workspace::open(dir.path(), lane, true).unwrap();
    let (code, _) = run_in(&other, "true", "..", 1000, 1000).await.unwrap_err();
    assert_eq!(code, "host-cwd-outside-workspace");
}

#[tokio::test]
async fn the_different_profile_answers_a_run_in_another_shape() {
    let dir = tempfile::tempdir().unwrap();
    let lane = Arc::new(OperatorLane::open(dir.path()).unwrap());
    let other = Workspace::open(&dir.path().join("ws"), lane, true).unwrap();
    let ended = sh(&other, "printf 0123456789; printf e >&2; exit 3", 10_000, 4).await;
    assert_eq!(ended["end"], json!({"kind": "exit", "code": 3}));
    assert!(ended["took_ms"].is_u64());
    assert_eq!(
        ended["output"],
        json!({
            "stdout": {"text": "0123", "written": 10, "dropped": 6},
            "stderr": {"text": "", "written": 1, "dropped": 1},
        })
    );
    let killed = sh(&other, "sleep 30", 200, 1000).await;
    assert_eq!(
        killed["end"],
        json!({"kind": "signal", "signal": 9, "timeout": true})
    );
}

#[tokio::test]
async fn stopping_kills_live_runs_and_every_later_one() {
    let (_dir, ws) = workspace();
    let ws = Arc::new(ws);
    let running = {
        let ws = ws.clone();
        tokio::spawn(async move { sh(&ws, "sleep 100", 600_000, 1000).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    ws.stop_runs();
    let value = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (&value["signal"], &value["timed_out"]),
        (&json!(9), &json!(false))
    );
    let later = sh(&ws, "sleep 100", 600_000, 1000).await;
    assert_eq!(later["signal"], 9);
}

#[tokio::test]
async fn an_abandoned_run_takes_its_group_with_it() {
    let (_dir, ws) = workspace();
    let run = sh(&ws, "echo $$ > leader.pid; sleep 100", 600_000, 1000);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), run)
            .await
            .is_err()
    );
    let pid: i32 = std::fs::read_to_string(ws.root().join("leader.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = ProcessGroupProbe(pid);
    assert!(
        gone.empties_within(Duration::from_secs(5)).await,
        "group {pid} survived"
    );
}

/// Whether the group `pgid` empties within a bound.
struct ProcessGroupProbe(i32);

impl ProcessGroupProbe {
    async fn empties_within(&self, bound: Duration) -> bool {
        let group = crate::process::ProcessGroup::new(nix::unistd::Pid::from_raw(self.0));
        group.wait_gone(tokio::time::Instant::now() + bound).await
    }
}

#[tokio::test]
async fn info_names_the_root_and_the_bounds() {
    let (_dir, ws) = workspace();
    let value = split(ws.info()).unwrap();
    assert_eq!(value["root"], json!(ws.root().to_str().unwrap()));
    assert!(ws.root().is_absolute());
    assert_eq!(value["run"]["timeout_ms_max"], RUN_TIMEOUT_MS_MAX);
    assert_eq!(value["run"]["max_output_bytes_max"], RUN_OUTPUT_BYTES_MAX);
    assert_eq!(value["evidence"]["refs_max"], EVIDENCE_REFS_MAX);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(ws.root()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}
