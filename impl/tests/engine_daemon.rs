//! The engine daemon over its real Unix socket (engine-protocol.md, "Initialization",
//! "Security boundary"): private socket and token file, the token checked before the
//! payload is decoded, negotiation results, and the ownership compare-and-swap with
//! racing reconnects.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use contract_impl::engine::proto::common::v1::ProtocolVersion;
use contract_impl::engine::proto::engine::v1 as pb;
use hyper_util::rt::TokioIo;
use pb::engine_service_client::EngineServiceClient;
use tonic::transport::{Channel, Endpoint};

mod engine_support;

use engine_support::{BIN, start};

async fn channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    // The URI is ignored: every connection goes to the Unix socket.
    Endpoint::try_from("http://engine.local")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .unwrap()
}

fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn init(
    major: u32,
    minor: u32,
    required: &[&str],
    claim: pb::ownership_claim::Claim,
) -> pb::InitializeRequest {
    pb::InitializeRequest {
        protocol: Some(ProtocolVersion { major, minor }),
        client_build: None,
        supported_capabilities: vec![],
        required_capabilities: required.iter().map(|s| (*s).to_string()).collect(),
        client_limits: None,
        claim: Some(pb::OwnershipClaim { claim: Some(claim) }),
    }
}

fn new_owner() -> pb::ownership_claim::Claim {
    pb::ownership_claim::Claim::NewOwner(pb::NewOwner {})
}

fn reconnect(client_id: &str, expected_epoch: u64) -> pb::ownership_claim::Claim {
    pb::ownership_claim::Claim::Reconnect(pb::Reconnect {
        client_id: client_id.into(),
        expected_epoch,
    })
}

/// A codec that sends raw bytes as the request message: a payload that is not a valid
/// protobuf message at all.
#[derive(Debug, Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

async fn raw_initialize(channel: Channel, token: Option<&str>, payload: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(payload);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static("/engine.v1.EngineService/Initialize");
    grpc.unary::<Vec<u8>, Vec<u8>, _>(request, path, RawCodec)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn the_token_is_checked_before_the_payload_is_decoded() {
    let daemon = start();
    let ch = channel(&daemon.socket).await;
    // Not protobuf at all: a field tag with wire type 7 (no such type).
    let garbage = vec![0x0f, 0xff, 0xff];
    let without = raw_initialize(ch.clone(), None, garbage.clone()).await;
    assert_eq!(without.code(), tonic::Code::Unauthenticated, "{without:?}");
    let wrong = raw_initialize(ch.clone(), Some("not-the-token"), garbage.clone()).await;
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    assert!(!wrong.message().contains(&daemon.token));
    // With the token the same payload reaches the decoder, which refuses it.
    let decoded = raw_initialize(ch.clone(), Some(&daemon.token), garbage).await;
    assert_ne!(decoded.code(), tonic::Code::Unauthenticated, "{decoded:?}");
    assert_ne!(decoded.code(), tonic::Code::Ok);
    // Every RPC is behind the check.
    let mut client = EngineServiceClient::new(ch);
    let e = client.health(pb::HealthRequest {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let health = client
        .health(authed(&daemon.token, pb::HealthRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.readiness, pb::Readiness::Ready as i32);
}

#[tokio::test]
async fn initialize_negotiates_and_claims_ownership_by_compare_and_swap() {
    let daemon = start();
    let client = EngineServiceClient::new(channel(&daemon.socket).await);
    use pb::initialize_response::Result as R;
    let call = |req| {
        let mut client = client.clone();
        let token = daemon.token.clone();
        async move {
            client
                .initialize(authed(&token, req))
                .await
                .unwrap()
                .into_inner()
                .result
                .unwrap()
        }
    };
    // Another major: typed, with the observed and supported values.
    let R::IncompatibleVersion(v) = call(init(2, 0, &[], new_owner())).await else {
        panic!()
    };
    assert_eq!(v.observed, Some(ProtocolVersion { major: 2, minor: 0 }));
    assert_eq!(
        v.supported_max,
        Some(ProtocolVersion { major: 1, minor: 1 })
    );
    // Minor 0 removes both snapshot capabilities; requiring one is a typed result.
    let R::MissingCapability(m) = call(init(1, 0, &["snapshot-authority-v1"], new_owner())).await
    else {
        panic!()
    };
    assert_eq!(m.missing, ["snapshot-authority-v1"]);
    assert!(m.offered.is_empty());
    // A new owner gets a stable ID at epoch 1, with the catalog and limits.
    let R::Initialized(first) = call(init(1, 1, &["snapshots"], new_owner())).await else {
        panic!()
    };
    assert_eq!(first.epoch, 1);
    assert_eq!(first.capabilities, ["snapshots", "snapshot-authority-v1"]);
    assert!(!first.definitions.unwrap().definitions.is_empty());
    assert!(first.limits.unwrap().max_request_bytes > 0);
    let id = first.client_id;
    // Reconnect: the same ID at exactly the next epoch.
    let R::Initialized(second) = call(init(1, 1, &[], reconnect(&id, 1))).await else {
        panic!()
    };
    assert_eq!((second.client_id.as_str(), second.epoch), (id.as_str(), 2));
    // A stale claim fails and changes nothing.
    let R::StaleClaim(stale) = call(init(1, 1, &[], reconnect(&id, 1))).await else {
        panic!()
    };
    assert_eq!((stale.expected_epoch, stale.current_epoch), (1, 2));
    // Racing reconnects from epoch 2: exactly one wins.
    let racers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(call(init(1, 1, &[], reconnect(&id, 2)))))
        .collect();
    let mut wins = 0;
    for racer in racers {
        if let R::Initialized(won) = racer.await.unwrap() {
            assert_eq!(won.epoch, 3);
            wins += 1;
        }
    }
    assert_eq!(wins, 1);
}

#[test]
fn an_over_long_socket_path_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("x".repeat(120)).join("engine.sock");
    let out = Command::new(BIN)
        .args(["engine", "serve", "--socket"])
        .arg(&long)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("socket_path_too_long") && stderr.contains("engine.sock"),
        "{stderr}"
    );
}

/// An independent client: grpcio (installed by `ci/setup.sh` into `.tools/py`) compiles
/// proto/ itself and talks to the daemon at `unix:PATH`.
#[test]
fn a_grpcio_client_initializes_starts_a_run_and_follows_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".tools/py/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ci/setup.sh (make setup) to install grpcio",
        python.display()
    );
    let daemon = start();
    let out = Command::new(&python)
        .arg(root.join("impl/tests/fixtures/engine_grpcio_client.py"))
        .arg(root.join("proto"))
        .arg(&daemon.socket)
        .arg(&daemon.token_file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The client subcommands a person uses: claim, reconnect, a stale claim, health.
#[test]
fn the_client_subcommands_claim_and_reconnect() {
    let daemon = start();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("engine")
            .args(args)
            .arg("--socket")
            .arg(&daemon.socket)
            .arg("--token-file")
            .arg(&daemon.token_file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            !stdout.contains(&daemon.token),
            "the token is never printed"
        );
        (out.status.code(), stdout)
    };
    let (code, out) = run(&["initialize", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let first: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (first["result"].clone(), first["epoch"].clone()),
        (serde_json::json!("initialized"), serde_json::json!(1))
    );
    let id = first["client_id"].as_str().unwrap().to_string();
    let (code, out) = run(&["initialize", "--client-id", &id, "--epoch", "1"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("client {id} at epoch 2")), "{out}");
    let (code, out) = run(&["initialize", "--client-id", &id, "--epoch", "1", "--json"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("\"stale_claim\""), "{out}");
    let (code, out) = run(&["health"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("ready, 0 active runs"), "{out}");
}

#[test]
fn the_run_subcommands_start_follow_steer_and_keep_the_client_epoch() {
    let daemon = start();
    let state = daemon.dir.path().join("client.json");
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("engine")
            .args(args)
            .arg("--socket")
            .arg(&daemon.socket)
            .arg("--token-file")
            .arg(&daemon.token_file)
            .arg("--client-state")
            .arg(&state)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!stdout.contains(&daemon.token) && !stderr.contains(&daemon.token));
        (out.status.code(), stdout, stderr)
    };
    let (code, out, err) = run(&["run", "--message", "hello there"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("#2 message: hello there"), "{out}");
    assert!(out.contains("#4 run ended: succeeded"), "{out}");
    assert!(err.contains("succeeded; 4 events followed"), "{err}");
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(recorded["epoch"], 1);
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A held run: detach, list nothing pending, suspend, export, cancel.
    let (code, out, _) = run(&[
        "run",
        "--detach",
        "--json",
        "--message",
        "#!script\nask q1 Deploy?\nturn\nhold\nsay more\nhold",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let started: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let id = started["run_id"].as_str().unwrap().to_string();
    let mut pending = String::new();
    for _ in 0..200 {
        let (_, out, _) = run(&["interactions", "--run", &id]);
        if out.contains("q1: Deploy?") {
            pending = out;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(pending.starts_with("revision 1: 1 pending"), "{pending}");
    let (code, out, _) = run(&[
        "respond",
        "--run",
        &id,
        "--interaction",
        "q1",
        "--response",
        "\"yes\"",
        "--operation-id",
        "answer-1",
    ]);
    assert_eq!((code, out.trim()), (Some(0), "q1: answered"));
    let (code, out, _) = run(&[
        "respond",
        "--run",
        &id,
        "--interaction",
        "q1",
        "--response",
        "\"yes\"",
        "--operation-id",
        "answer-1",
    ]);
    assert_eq!(code, Some(0));
    assert!(out.contains("answered before"), "{out}");
    let (code, _, err) = run(&[
        "respond",
        "--run",
        &id,
        "--interaction",
        "q1",
        "--response",
        "\"yes\"",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("stale_interaction"), "{err}");
    let (code, out, _) = run(&["suspend", "--run", &id]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("suspended after #4"), "{out}");
    let file = daemon.dir.path().join("snap.bin");
    let (code, out, _) = run(&["export", "--run", &id, "--out", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (code, _, err) = run(&["import", "--file", file.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("run_exists"), "{err}");
    let (code, out, _) = run(&["resume", "--run", &id]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out, _) = run(&["cancel", "--run", &id]);
    assert_eq!(
        (code, out.trim().ends_with("ended: canceled")),
        (Some(0), true),
        "{out}"
    );
    let (code, out, _) = run(&["cancel", "--run", &id]);
    assert!(
        code == Some(0) && out.contains("had already ended: canceled"),
        "{out}"
    );
    let (code, out, _) = run(&["follow", "--run", &id, "--after", "4", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["sequence"], "5");
    assert!(lines[0].get("suspended").is_some(), "{out}");
    assert_eq!(
        lines.last().unwrap()["terminal"]["outcome"],
        "OUTCOME_CANCELED"
    );
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert!(
        recorded["epoch"].as_u64().unwrap() >= 10,
        "each command reconnected: {recorded}"
    );
}

#[test]
fn sigterm_ends_open_streams_and_the_daemon_promptly() {
    let mut daemon = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut stream = rt.block_on(async {
        let mut s = contract_impl::engine::session::Session::open(
            &daemon.socket,
            &daemon.token_file,
            &contract_impl::engine::client::Ownership::New,
            &[],
        )
        .await
        .unwrap();
        let run = s
            .start_run(
                pb::DefinitionRef {
                    id: "scripted".into(),
                    revision: 1,
                },
                "#!script\nsay a\nhold",
                "op-term",
            )
            .await
            .unwrap()
            .run_id;
        let mut stream = s
            .client
            .stream_events(pb::StreamEventsRequest {
                run_id: run,
                after_sequence: 0,
                cursor: Some(pb::PageCursor {
                    max_events: 10,
                    tail: true,
                }),
            })
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        stream
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the daemon did not stop within 10 s of SIGTERM with a stream open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(!daemon.socket.exists(), "the socket is removed");
    // The open stream ended with the daemon: `UNAVAILABLE` (`daemon_stopping`), not a hang
    // and not a clean end the reader would take for the run's.
    let end = rt.block_on(async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => break None,
                Err(s) => break Some((s.code(), s.message().to_string())),
            }
        }
    });
    let (code, message) = end.expect("the stream ends with a status");
    assert_eq!(code, tonic::Code::Unavailable, "{message}");
}

#[tokio::test]
async fn capability_lists_are_bounded_at_their_edge() {
    use contract_impl::engine::daemon::limits::MAX_COLLECTION_COUNT;
    let daemon = start();
    let mut client = EngineServiceClient::new(channel(&daemon.socket).await);
    let caps = |n: u32| -> Vec<String> { (0..n).map(|i| format!("cap-{i}")).collect() };
    let mut at = init(1, 1, &[], new_owner());
    at.supported_capabilities = caps(MAX_COLLECTION_COUNT);
    let answer = client.initialize(authed(&daemon.token, at)).await.unwrap();
    assert!(matches!(
        answer.into_inner().result,
        Some(pb::initialize_response::Result::Initialized(_))
    ));
    let mut over = init(1, 1, &[], new_owner());
    over.supported_capabilities = caps(MAX_COLLECTION_COUNT + 1);
    let refused = client
        .initialize(authed(&daemon.token, over))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}
