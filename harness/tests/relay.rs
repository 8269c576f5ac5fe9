//! `contract-harness peer relay` as a real process: what a target that launches its peer
//! itself runs. The test plays the harness end ([`RelayListener`]).

use std::process::Stdio;
use std::time::Duration;

use contract_harness::transport::relay::{RelayEvent, RelayListener, RelayMsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const T: Duration = Duration::from_secs(10);

fn peer(socket: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_contract-harness"));
    cmd.args(["peer", "relay", "--socket"])
        .arg(socket)
        .args(["--", "--plugin-flag", "x"])
        .env("PEER_TOKEN", "tok-1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn the_relay_peer_carries_launch_stdio_and_exit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("relay.sock");
    let listener = RelayListener::bind(&socket).unwrap();
    let mut child = peer(&socket).spawn().unwrap();
    let (mut relay, hello) = listener.accept(T).await.unwrap();
    assert!(
        hello.argv.ends_with(&["--plugin-flag".into(), "x".into()]),
        "{hello:?}"
    );
    assert!(hello.env.contains(&("PEER_TOKEN".into(), "tok-1".into())));
    assert_eq!(hello.pid, child.id().unwrap());

    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"from the target").await.unwrap();
    let mut got = Vec::new();
    while got.len() < 15 {
        match relay.recv().await {
            RelayEvent::Msg(RelayMsg::Stdin(bytes)) => got.extend(bytes),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, b"from the target");

    relay
        .send(RelayMsg::Stdout(b"1|1|unix|/tmp/p.sock|grpc\n".to_vec()), T)
        .await
        .unwrap();
    relay.send(RelayMsg::CloseStdout, T).await.unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    assert_eq!(out, "1|1|unix|/tmp/p.sock|grpc\n");

    relay.send(RelayMsg::Exit(5), T).await.unwrap();
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(5));
}

#[tokio::test]
async fn the_relay_peer_exits_when_the_harness_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("relay.sock");
    let listener = RelayListener::bind(&socket).unwrap();
    let mut child = peer(&socket).spawn().unwrap();
    let (relay, _) = listener.accept(T).await.unwrap();
    drop(relay);
    drop(listener);
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    // No harness at all: it says so and exits non-zero.
    let output = tokio::time::timeout(T, peer(&socket).output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot reach the harness"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
