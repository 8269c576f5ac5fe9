//! The plugin host against real plugin processes (the Rust fixture, and shell wrappers
//! around it that misbehave at launch): digest pinning, a path replaced after
//! verification, stdout contamination, 4 MiB of stderr before the handshake, start
//! timeouts shorter and longer than the plugin's start, crash and restart, leases and
//! drain, cancellation, and no survivor after the host is SIGKILLed.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use contract_impl::plugin::host::verify::{sha256_of, verify};
use contract_impl::plugin::host::{CallError, PluginConfig, PluginHost, ToolOutcome};

fn exe() -> PathBuf {
    std::fs::canonicalize(env!("CARGO_BIN_EXE_contract-impl")).unwrap()
}

fn config(executable: &Path, args: &[&str]) -> PluginConfig {
    PluginConfig {
        name: "conformance-fixture".into(),
        executable: executable.to_path_buf(),
        sha256: sha256_of(executable).unwrap(),
        args: args.iter().map(|a| (*a).to_string()).collect(),
        env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        approved_capabilities: vec!["filesystem.write".into(), "process.spawn".into()],
        startup_timeout_ms: 20_000,
        call_timeout_ms: 20_000,
        drain_timeout_ms: 2_000,
    }
}

fn fixture() -> PluginConfig {
    config(&exe(), &["plugin", "fixture"])
}

/// A shell script in `dir` that runs `prelude` and then becomes the fixture.
fn wrapper(dir: &Path, name: &str, prelude: &str) -> PathBuf {
    let path = std::fs::canonicalize(dir).unwrap().join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n{prelude}\nexec {} plugin fixture\n",
            exe().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
    path
}

fn host(config: PluginConfig) -> PluginHost {
    PluginHost::new(config, exe())
}

async fn call(
    host: &PluginHost,
    id: &str,
    tool: &str,
    args: &str,
) -> Result<ToolOutcome, CallError> {
    let lease = host.lease().expect("an active generation");
    lease
        .execute(id, tool, args, |_, _| {}, std::future::pending())
        .await
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: its process has ended.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn a_validated_generation_answers_calls_with_progress() {
    let host = host(fixture());
    assert_eq!(host.activate().await.unwrap(), 1);
    let lease = host.lease().unwrap();
    let mut seen = Vec::new();
    let outcome = lease
        .execute(
            "c1",
            "progress",
            r#"{"count":3}"#,
            |n, _| seen.push(n),
            std::future::pending(),
        )
        .await
        .unwrap();
    assert_eq!(outcome, ToolOutcome::Result(r#"{"count":3}"#.into()));
    assert_eq!(seen, vec![1, 2, 3]);
    let err = lease
        .execute("c2", "nope", "{}", |_, _| {}, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unknown_tool");
    let status = host.status().await;
    assert_eq!(status["active"]["generation"], 1);
    assert_eq!(status["active"]["drift"], serde_json::Value::Null);
    for c in status["capabilities"].as_array().unwrap() {
        assert!(
            c["enforcement"].as_str().unwrap().contains("not enforced"),
            "{c}"
        );
    }
    drop(lease);
    host.shutdown().await;
    assert_eq!(
        host.status().await["drains"][0]["termination_confirmed"],
        true
    );
}

#[tokio::test]
async fn a_wrong_digest_launches_nothing() {
    let mut config = fixture();
    config.sha256 = "0".repeat(64);
    let host = host(config);
    let err = host.activate().await.unwrap_err();
    assert_eq!(err.code, "digest_mismatch", "{err}");
    assert!(host.lease().is_none());
}

#[tokio::test]
async fn a_path_replaced_after_verification_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("replacement-ran");
    let path = wrapper(dir.path(), "plugin", "");
    let config = config(&path, &[]);
    let verified = verify(&path, &config.sha256).unwrap();
    // Between verification and exec, another file is renamed over the path.
    let evil = wrapper(dir.path(), "evil", &format!("touch {}", marker.display()));
    std::fs::rename(&evil, &path).unwrap();
    let launched = contract_impl::plugin::host::launch::launch(&config, &verified, &exe()).await;
    // The drift is seen before the exec, and nothing of the replacement ran.
    let err = launched.unwrap_err();
    assert_eq!(err.code, "path_replaced", "{err}");
    assert!(!marker.exists(), "the replaced file ran");
    // Re-verifying the path now finds the replacement's digest.
    let again = host(config).activate().await.unwrap_err();
    assert_eq!(again.code, "digest_mismatch");
    assert!(!marker.exists(), "the replaced file ran");
}

#[tokio::test]
async fn the_verified_inode_is_what_executes() {
    // Executing through the descriptor: the file the path names at exec time is not
    // consulted. (The host refuses a drifted path before it gets here; this checks the
    // mechanism itself.)
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("replacement-ran");
    let path = wrapper(dir.path(), "plugin", "");
    let verified = verify(&path, &sha256_of(&path).unwrap()).unwrap();
    let (fd, exec_path) = verified.inheritable().unwrap();
    let evil = wrapper(
        dir.path(),
        "evil",
        &format!("touch {}; exit 3", marker.display()),
    );
    std::fs::rename(&evil, &path).unwrap();
    let out = std::process::Command::new(&exec_path)
        .env("RUNTIME_PLUGIN_PROTOCOL", "plugin.v0")
        .output()
        .unwrap();
    drop(fd);
    // The verified wrapper ran the fixture, which refused the protocol (status 2).
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!marker.exists(), "the replacement ran");
}

#[tokio::test]
async fn stdout_before_the_handshake_fails_the_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let path = wrapper(dir.path(), "chatty", "echo hello");
    let host = host(config(&path, &[]));
    let err = host.activate().await.unwrap_err();
    assert_eq!(err.code, "stdout_contamination", "{err}");
    assert!(host.lease().is_none());
}

#[tokio::test]
async fn four_mib_of_stderr_without_a_newline_never_blocks_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let path = wrapper(
        dir.path(),
        "noisy",
        "head -c 4194304 /dev/zero | tr '\\0' x >&2",
    );
    let host = host(config(&path, &[]));
    host.activate().await.unwrap();
    assert_eq!(
        call(&host, "c1", "echo", r#"{"text":"ok"}"#).await.unwrap(),
        ToolOutcome::Result(r#"{"text":"ok"}"#.into())
    );
    let tail = host.status().await["active"]["stderr_tail"]
        .as_str()
        .unwrap()
        .len();
    assert!(
        tail <= contract_impl::plugin::host::launch::STDERR_TAIL_BYTES + 8,
        "{tail}"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn the_start_bound_is_the_configured_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = wrapper(dir.path(), "slow-start", "sleep 1");
    let mut short = config(&path, &[]);
    short.startup_timeout_ms = 200;
    let started = Instant::now();
    let err = host(short).activate().await.unwrap_err();
    assert_eq!(err.code, "startup_timeout", "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut long = config(&path, &[]);
    long.startup_timeout_ms = 20_000;
    let host = host(long);
    host.activate().await.unwrap();
    host.shutdown().await;
}

#[tokio::test]
async fn a_crash_fails_the_call_and_a_restart_serves_future_calls() {
    let host = host(fixture());
    host.activate().await.unwrap();
    let err = call(&host, "c1", "crash", "{}").await.unwrap_err();
    assert_eq!(err, CallError::Interrupted { uncertain: false });
    assert_eq!(host.activate().await.unwrap(), 2);
    assert_eq!(
        call(&host, "c1", "echo", r#"{"text":"again"}"#)
            .await
            .unwrap(),
        ToolOutcome::Result(r#"{"text":"again"}"#.into())
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_leased_generation_lives_until_its_lease_is_released() {
    let host = host(fixture());
    host.activate().await.unwrap();
    let old = host.lease().unwrap();
    assert_eq!(host.activate().await.unwrap(), 2);
    // The old lease still runs on generation 1; a new lease gets generation 2.
    assert_eq!(old.generation().id, 1);
    assert_eq!(
        old.execute(
            "c1",
            "echo",
            r#"{"text":"old"}"#,
            |_, _| {},
            std::future::pending()
        )
        .await
        .unwrap(),
        ToolOutcome::Result(r#"{"text":"old"}"#.into())
    );
    assert_eq!(host.lease().unwrap().generation().id, 2);
    assert!(host.status().await["drains"].as_array().unwrap().is_empty());
    drop(old);
    let deadline = Instant::now() + Duration::from_secs(10);
    while host.status().await["drains"].as_array().unwrap().is_empty() && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drains = host.status().await["drains"].clone();
    assert_eq!(drains[0]["generation"], 1, "{drains}");
    assert_eq!(drains[0]["termination_confirmed"], true, "{drains}");
    host.shutdown().await;
}

#[tokio::test]
async fn cancellation_goes_through_the_rpc() {
    let host = host(fixture());
    host.activate().await.unwrap();
    let lease = host.lease().unwrap();
    let err = lease
        .execute(
            "c1",
            "slow",
            "{}",
            |_, _| {},
            tokio::time::sleep(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CallError::Cancelled {
            acknowledged: true,
            confirmed: true,
            uncertain: false
        }
    );
    let err = lease
        .execute(
            "c2",
            "mutate",
            r#"{"key":"k","outcome":"uncertain"}"#,
            |_, _| {},
            std::future::pending(),
        )
        .await
        .unwrap();
    assert!(matches!(err, ToolOutcome::Failure { .. }));
    drop(lease);
    host.shutdown().await;
}

#[test]
fn no_plugin_process_survives_a_sigkill_of_its_host() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("plugin.json");
    let c = fixture();
    std::fs::write(
        &config_path,
        serde_json::json!({
            "name": c.name, "executable": c.executable, "sha256": c.sha256, "args": c.args,
            "env": c.env, "approved_capabilities": c.approved_capabilities,
        })
        .to_string(),
    )
    .unwrap();
    let mut host = std::process::Command::new(exe())
        .args(["plugin", "call", "--config"])
        .arg(&config_path)
        .args(["--tool", "spawn_detached", "--hold"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(host.stdout.take().unwrap()));
    let result: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let status: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let detached = i32::try_from(result["result"]["pid"].as_i64().unwrap()).unwrap();
    let supervisor = i32::try_from(status["active"]["supervisor_pid"].as_i64().unwrap()).unwrap();
    let plugin: Vec<i32> =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
    assert!(alive(detached) && alive(supervisor) && !plugin.is_empty());
    // The plugin's own child never inherits the launch secret.
    let environ = std::fs::read(format!("/proc/{detached}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("RUNTIME_PLUGIN_SECRET"),
        "the secret reached the plugin's child"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(host.id()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    host.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let everyone: Vec<i32> = plugin
        .iter()
        .copied()
        .chain([supervisor, detached])
        .collect();
    while everyone.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in everyone {
        assert!(
            !alive(pid),
            "process {pid} survived the host's SIGKILL by 5 s"
        );
    }
}

/// SIGTERM is handled: the fixture stops serving, removes its socket and exits 0 (not
/// killed by the signal), with its stdin still open.
#[test]
fn sigterm_ends_the_fixture_cleanly() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plugin.sock");
    let mut child = std::process::Command::new(exe())
        .args(["plugin", "fixture"])
        .env_clear()
        .env("RUNTIME_PLUGIN_PROTOCOL", "plugin.v1")
        .env("RUNTIME_PLUGIN_SOCKET", &socket)
        .env("RUNTIME_PLUGIN_SECRET", "ab".repeat(32))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "plugin.v1 ready\n");
    assert!(socket.exists());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the fixture ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!socket.exists(), "the socket outlived the fixture");
}
