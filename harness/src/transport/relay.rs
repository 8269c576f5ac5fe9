//! The relay: for sides where the **target launches the peer itself** (a worker host
//! spawning its worker, a plugin host starting its plugin), the harness gives the target
//! its own binary in peer mode (`contract-harness peer relay --socket PATH`) as the
//! program to launch. That process ([`run_peer`]) connects back to the running harness
//! over the Unix socket `PATH` ([`RelayListener`]) and carries everything the launched
//! peer would do, so the scenario still scripts it:
//!
//! * its launch (argv, environment, working directory, pid) in a `hello`;
//! * its stdio: what the target writes to the peer's stdin reaches the harness, what the
//!   harness writes goes out on the peer's stdout/stderr;
//! * sockets: the harness asks the peer to `dial` a Unix socket the target listens on
//!   (a worker connecting to its host) or to `listen` on one (a plugin serving its
//!   host: bound and made 0600 before the peer reads its next message, then one
//!   connection accepted), and bytes flow both ways on a numbered channel;
//! * its end: the harness tells it to exit with a code; when the harness goes away the
//!   relay socket closes and the peer exits at once (it never outlives the harness).
//!
//! The link is the [`super::framed`] transport (4-byte big-endian length), each payload
//! one [`RelayMsg`]: a kind byte, then the kind's fields. This module carries bytes only:
//! it never interprets the wire inside a channel (the family's codec does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::TransportError;
use super::framed::{FramedConnection, FramedEvent};

/// Largest data chunk in one relay message (bytes); longer writes are split.
pub const RELAY_CHUNK_MAX_BYTES: usize = 256 * 1024;

/// Largest relay message: a chunk plus its kind byte and channel number.
pub const RELAY_FRAME_MAX_BYTES: usize = RELAY_CHUNK_MAX_BYTES + 16;

/// Largest `hello` (argv and environment of the launched peer), bytes.
pub const RELAY_HELLO_MAX_BYTES: usize = RELAY_FRAME_MAX_BYTES;

/// Most channels (dialled or accepted sockets) one relay carries.
pub const RELAY_CHANNELS_MAX: u32 = 16;

/// Deadline of one write on the relay link.
const LINK_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How the launched peer was started, as the target started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Its argv (the relay's own arguments included).
    pub argv: Vec<String>,
    /// Its whole environment, as the target passed it.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: String,
    /// Its process ID.
    pub pid: u32,
}

/// One message on the relay link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayMsg {
    /// Peer → harness, first: how the peer was launched.
    Hello(Hello),
    /// Peer → harness: bytes the target wrote to the peer's stdin.
    Stdin(Vec<u8>),
    /// Peer → harness: the target closed the peer's stdin.
    StdinEof,
    /// Harness → peer: write these bytes to the peer's stdout.
    Stdout(Vec<u8>),
    /// Harness → peer: write these bytes to the peer's stderr.
    Stderr(Vec<u8>),
    /// Harness → peer: close the peer's stdout.
    CloseStdout,
    /// Harness → peer: connect to the Unix socket `path` as channel `channel`.
    Dial {
        /// The channel the connection becomes.
        channel: u32,
        /// The socket path (the target's).
        path: String,
    },
    /// Harness → peer: listen on the Unix socket `path` and accept one connection as
    /// channel `channel`.
    Listen {
        /// The channel the accepted connection becomes.
        channel: u32,
        /// The socket path to bind.
        path: String,
    },
    /// Peer → harness: channel `channel` is connected (dialled or accepted).
    Opened(u32),
    /// Peer → harness: opening channel `channel` failed.
    OpenFailed {
        /// The channel.
        channel: u32,
        /// Why.
        reason: String,
    },
    /// Either way: bytes on a channel.
    Data {
        /// The channel.
        channel: u32,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// Either way: the sender's side of the channel ended (half-close).
    Eof(u32),
    /// Harness → peer: exit with this code.
    Exit(i32),
}

/// A relay message that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed relay message: {0}")]
pub struct RelayDecodeError(pub String);

fn channel_of(bytes: &[u8]) -> Result<(u32, &[u8]), RelayDecodeError> {
    let (head, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| RelayDecodeError("a channel number needs 4 bytes".into()))?;
    Ok((u32::from_be_bytes(*head), rest))
}

fn text(bytes: &[u8]) -> Result<String, RelayDecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|e| RelayDecodeError(e.to_string()))
}

impl RelayMsg {
    /// The message as one relay payload.
    pub fn encode(&self) -> Vec<u8> {
        let with_channel = |kind: u8, channel: u32, rest: &[u8]| {
            let mut out = vec![kind];
            out.extend_from_slice(&channel.to_be_bytes());
            out.extend_from_slice(rest);
            out
        };
        let with_bytes = |kind: u8, rest: &[u8]| {
            let mut out = vec![kind];
            out.extend_from_slice(rest);
            out
        };
        match self {
            RelayMsg::Hello(h) => with_bytes(1, &serde_json::to_vec(h).unwrap_or_default()),
            RelayMsg::Stdin(b) => with_bytes(2, b),
            RelayMsg::StdinEof => vec![3],
            RelayMsg::Stdout(b) => with_bytes(4, b),
            RelayMsg::Stderr(b) => with_bytes(5, b),
            RelayMsg::CloseStdout => vec![6],
            RelayMsg::Dial { channel, path } => with_channel(7, *channel, path.as_bytes()),
            RelayMsg::Listen { channel, path } => with_channel(8, *channel, path.as_bytes()),
            RelayMsg::Opened(channel) => with_channel(9, *channel, &[]),
            RelayMsg::OpenFailed { channel, reason } => {
                with_channel(10, *channel, reason.as_bytes())
            }
            RelayMsg::Data { channel, bytes } => with_channel(11, *channel, bytes),
            RelayMsg::Eof(channel) => with_channel(12, *channel, &[]),
            RelayMsg::Exit(code) => with_bytes(13, &code.to_be_bytes()),
        }
    }

    /// Decodes one relay payload.
    ///
    /// # Errors
    /// An unknown kind or a short or malformed body.
    pub fn decode(payload: &[u8]) -> Result<Self, RelayDecodeError> {
        let (kind, rest) = payload
            .split_first()
            .ok_or_else(|| RelayDecodeError("empty".into()))?;
        Ok(match kind {
            1 => RelayMsg::Hello(
                serde_json::from_slice(rest).map_err(|e| RelayDecodeError(e.to_string()))?,
            ),
            2 => RelayMsg::Stdin(rest.to_vec()),
            3 => RelayMsg::StdinEof,
            4 => RelayMsg::Stdout(rest.to_vec()),
            5 => RelayMsg::Stderr(rest.to_vec()),
            6 => RelayMsg::CloseStdout,
            7 | 8 | 10 => {
                let (channel, rest) = channel_of(rest)?;
                let value = text(rest)?;
                match kind {
                    7 => RelayMsg::Dial {
                        channel,
                        path: value,
                    },
                    8 => RelayMsg::Listen {
                        channel,
                        path: value,
                    },
                    _ => RelayMsg::OpenFailed {
                        channel,
                        reason: value,
                    },
                }
            }
            9 => RelayMsg::Opened(channel_of(rest)?.0),
            11 => {
                let (channel, rest) = channel_of(rest)?;
                RelayMsg::Data {
                    channel,
                    bytes: rest.to_vec(),
                }
            }
            12 => RelayMsg::Eof(channel_of(rest)?.0),
            13 => {
                let code = rest
                    .first_chunk::<4>()
                    .ok_or_else(|| RelayDecodeError("an exit code needs 4 bytes".into()))?;
                RelayMsg::Exit(i32::from_be_bytes(*code))
            }
            other => return Err(RelayDecodeError(format!("unknown kind {other}"))),
        })
    }
}

/// The harness end: a listening socket the launched peer connects back to.
pub struct RelayListener {
    listener: UnixListener,
    path: PathBuf,
}

impl RelayListener {
    /// Binds `path` (inside the run's private directory; the socket is made 0600).
    ///
    /// # Errors
    /// [`TransportError::Bind`].
    pub fn bind(path: &Path) -> Result<Self, TransportError> {
        let listener = UnixListener::bind(path).map_err(TransportError::Bind)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(TransportError::Bind)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The socket path (what the peer's `--socket` names).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits (at most `timeout`) for the peer to connect and say hello.
    ///
    /// # Errors
    /// [`TransportError::Timeout`], or [`TransportError::Client`] when what connected
    /// did not start with a hello.
    pub async fn accept(&self, timeout: Duration) -> Result<(Relay, Hello), TransportError> {
        let accepted = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .map_err(|_| TransportError::Timeout(timeout))?
            .map_err(|e| TransportError::Client(e.to_string()))?;
        let mut conn = FramedConnection::new(accepted.0, RELAY_FRAME_MAX_BYTES);
        let first = tokio::time::timeout(timeout, conn.recv())
            .await
            .map_err(|_| TransportError::Timeout(timeout))?;
        match first {
            Some(FramedEvent::Frame(payload)) => match RelayMsg::decode(&payload) {
                Ok(RelayMsg::Hello(hello)) => Ok((Relay { conn }, hello)),
                Ok(other) => Err(TransportError::Client(format!(
                    "the relay peer began with {other:?} instead of its hello"
                ))),
                Err(e) => Err(TransportError::Client(e.to_string())),
            },
            other => Err(TransportError::Client(format!(
                "the relay peer sent no hello: {other:?}"
            ))),
        }
    }
}

impl Drop for RelayListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the launched peer's side reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEvent {
    /// A relay message from the peer (stdin bytes, channel data, …).
    Msg(RelayMsg),
    /// The relay link ended: the peer exited or was killed.
    Gone,
    /// The link broke or carried something malformed.
    Error(String),
}

/// The harness's handle on a connected relay peer.
pub struct Relay {
    conn: FramedConnection,
}

impl Relay {
    /// Sends one message (data longer than [`RELAY_CHUNK_MAX_BYTES`] is split).
    ///
    /// # Errors
    /// The link is gone or stalled.
    pub async fn send(&mut self, msg: RelayMsg, timeout: Duration) -> Result<(), TransportError> {
        for part in split(msg) {
            self.conn.send(&part.encode(), timeout).await?;
        }
        Ok(())
    }

    /// The next thing the peer reported (cancel-safe).
    pub async fn recv(&mut self) -> RelayEvent {
        match self.conn.recv().await {
            Some(FramedEvent::Frame(payload)) => match RelayMsg::decode(&payload) {
                Ok(msg) => RelayEvent::Msg(msg),
                Err(e) => RelayEvent::Error(e.to_string()),
            },
            Some(FramedEvent::Eof) | None => RelayEvent::Gone,
            Some(FramedEvent::Error { code, detail }) => {
                RelayEvent::Error(format!("{code}: {detail}"))
            }
        }
    }
}

/// Splits data messages into chunks of at most [`RELAY_CHUNK_MAX_BYTES`].
fn split(msg: RelayMsg) -> Vec<RelayMsg> {
    let chunks = |bytes: &[u8]| -> Vec<Vec<u8>> {
        if bytes.is_empty() {
            vec![Vec::new()]
        } else {
            bytes
                .chunks(RELAY_CHUNK_MAX_BYTES)
                .map(<[u8]>::to_vec)
                .collect()
        }
    };
    match msg {
        RelayMsg::Stdin(b) => chunks(&b).into_iter().map(RelayMsg::Stdin).collect(),
        RelayMsg::Stdout(b) => chunks(&b).into_iter().map(RelayMsg::Stdout).collect(),
        RelayMsg::Stderr(b) => chunks(&b).into_iter().map(RelayMsg::Stderr).collect(),
        RelayMsg::Data { channel, bytes } => chunks(&bytes)
            .into_iter()
            .map(|bytes| RelayMsg::Data { channel, bytes })
            .collect(),
        other => vec![other],
    }
}

/// Why the peer side stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerEnd {
    /// The harness said `exit` with this code.
    Exit(i32),
    /// The relay link ended (the harness is gone): exit at once.
    LinkGone,
}

/// What a channel task reports to the peer loop.
enum Local {
    Stdin(Option<Vec<u8>>),
    Opened(u32, Result<UnixStream, String>),
    Data(u32, Option<Vec<u8>>),
}

/// The link to the harness as the peer side holds it: a reader task that never blocks
/// (it forwards every decoded message at once and flags the link's end), and the write
/// half. Every local write the peer makes races the link's end, so a target that stops
/// reading the peer's stdout or a socket can never keep the peer alive after the harness
/// is gone.
struct PeerLink {
    write: tokio::net::unix::OwnedWriteHalf,
    messages: mpsc::UnboundedReceiver<RelayMsg>,
    gone: tokio::sync::watch::Receiver<bool>,
}

impl PeerLink {
    async fn connect(socket: &Path) -> Result<Self, TransportError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| TransportError::Client(format!("{}: {e}", socket.display())))?;
        let (mut read, write) = stream.into_split();
        let (tx, messages) = mpsc::unbounded_channel();
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut decoder = super::framed::FrameDecoder::new(RELAY_FRAME_MAX_BYTES);
            let mut chunk = vec![0u8; 64 * 1024];
            'read: loop {
                loop {
                    match decoder.next_frame() {
                        Ok(Some(payload)) => {
                            let Ok(msg) = RelayMsg::decode(&payload) else {
                                break 'read;
                            };
                            if tx.send(msg).is_err() {
                                break 'read;
                            }
                        }
                        Ok(None) => break,
                        Err(_) => break 'read,
                    }
                }
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => decoder.push(&chunk[..n]),
                }
            }
            let _ = gone_tx.send(true);
        });
        Ok(Self {
            write,
            messages,
            gone,
        })
    }

    /// Sends one message to the harness; `false` when the link is gone.
    async fn send(&mut self, msg: &RelayMsg) -> bool {
        let Ok(frame) = super::framed::encode_frame(&msg.encode(), RELAY_FRAME_MAX_BYTES) else {
            return false;
        };
        let mut gone = self.gone.clone();
        tokio::select! {
            sent = tokio::time::timeout(LINK_WRITE_TIMEOUT, self.write.write_all(&frame)) => {
                matches!(sent, Ok(Ok(())))
            }
            _ = gone.wait_for(|g| *g) => false,
        }
    }

    /// Writes `bytes` to a local destination, unless the link ends first (`false`).
    async fn local_write<W: AsyncWrite + Unpin>(&self, out: &mut W, bytes: &[u8]) -> bool {
        let mut gone = self.gone.clone();
        tokio::select! {
            written = async {
                let _ = out.write_all(bytes).await;
                let _ = out.flush().await;
            } => { let () = written; true }
            _ = gone.wait_for(|g| *g) => false,
        }
    }
}

/// The peer side (`contract-harness peer relay`): connects to the harness at `socket`,
/// says hello, then relays until told to exit or until the link ends, which it notices
/// even while a write to the target is stalled. `stdin`, `stdout` and `stderr` are the
/// process's own in production and pipes in tests.
///
/// # Errors
/// The harness's socket cannot be reached.
pub async fn run_peer<I, O, E>(
    socket: &Path,
    hello: Hello,
    stdin: I,
    mut stdout: O,
    mut stderr: E,
) -> Result<PeerEnd, TransportError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let mut link = PeerLink::connect(socket).await?;
    if !link.send(&RelayMsg::Hello(hello)).await {
        return Ok(PeerEnd::LinkGone);
    }
    let (tx, mut local) = mpsc::channel::<Local>(64);
    spawn_reader(stdin, tx.clone(), Local::Stdin);
    let mut channels: HashMap<u32, tokio::net::unix::OwnedWriteHalf> = HashMap::new();
    let mut stdout_open = true;
    loop {
        tokio::select! {
            msg = link.messages.recv() => {
                let Some(msg) = msg else {
                    return Ok(PeerEnd::LinkGone);
                };
                let alive = match msg {
                    RelayMsg::Stdout(bytes) if stdout_open => link.local_write(&mut stdout, &bytes).await,
                    RelayMsg::Stderr(bytes) => link.local_write(&mut stderr, &bytes).await,
                    RelayMsg::CloseStdout => {
                        stdout_open = false;
                        let _ = stdout.shutdown().await;
                        true
                    }
                    RelayMsg::Dial { channel, path } if channel < RELAY_CHANNELS_MAX => {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            let opened = UnixStream::connect(&path)
                                .await
                                .map_err(|e| format!("{path}: {e}"));
                            let _ = tx.send(Local::Opened(channel, opened)).await;
                        });
                        true
                    }
                    RelayMsg::Listen { channel, path } if channel < RELAY_CHANNELS_MAX => {
                        // Bound (and made 0600) before the next message is read, so a
                        // handshake line the harness sends right behind it is written
                        // only once the socket accepts connections.
                        match listen_private(&path) {
                            Ok(listener) => {
                                let tx = tx.clone();
                                tokio::spawn(async move {
                                    let opened = listener
                                        .accept()
                                        .await
                                        .map(|(stream, _)| stream)
                                        .map_err(|e| format!("{path}: {e}"));
                                    let _ = tx.send(Local::Opened(channel, opened)).await;
                                });
                                true
                            }
                            Err(reason) => {
                                link.send(&RelayMsg::OpenFailed { channel, reason }).await
                            }
                        }
                    }
                    RelayMsg::Dial { channel, .. } | RelayMsg::Listen { channel, .. } => {
                        let reason = format!("channel {channel} is not below {RELAY_CHANNELS_MAX}");
                        link.send(&RelayMsg::OpenFailed { channel, reason }).await
                    }
                    RelayMsg::Data { channel, bytes } => match channels.get_mut(&channel) {
                        Some(write) => link.local_write(write, &bytes).await,
                        None => true,
                    },
                    RelayMsg::Eof(channel) => {
                        if let Some(mut write) = channels.remove(&channel) {
                            let _ = write.shutdown().await;
                        }
                        true
                    }
                    RelayMsg::Exit(code) => return Ok(PeerEnd::Exit(code)),
                    // Messages only a peer sends, or stdout after it was closed: ignored.
                    _ => true,
                };
                if !alive {
                    return Ok(PeerEnd::LinkGone);
                }
            }
            Some(event) = local.recv() => {
                let msg = match event {
                    Local::Stdin(Some(bytes)) => RelayMsg::Stdin(bytes),
                    Local::Stdin(None) => RelayMsg::StdinEof,
                    Local::Opened(channel, Ok(stream)) => {
                        let (read, write) = stream.into_split();
                        channels.insert(channel, write);
                        spawn_reader(read, tx.clone(), move |bytes| Local::Data(channel, bytes));
                        RelayMsg::Opened(channel)
                    }
                    Local::Opened(channel, Err(reason)) => RelayMsg::OpenFailed { channel, reason },
                    Local::Data(channel, Some(bytes)) => RelayMsg::Data { channel, bytes },
                    Local::Data(channel, None) => RelayMsg::Eof(channel),
                };
                if !link.send(&msg).await {
                    return Ok(PeerEnd::LinkGone);
                }
            }
        }
    }
}

/// Binds `path` and makes it 0600 (no access for group or others).
fn listen_private(path: &str) -> Result<UnixListener, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let listener = UnixListener::bind(path).map_err(|e| format!("{path}: {e}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{path}: {e}"))?;
    Ok(listener)
}

/// Reads `source` in chunks into `tx` (wrapped by `wrap`); `None` at its end.
fn spawn_reader<R, F>(mut source: R, tx: mpsc::Sender<Local>, wrap: F)
where
    R: AsyncRead + Unpin + Send + 'static,
    F: Fn(Option<Vec<u8>>) -> Local + Send + 'static,
{
    tokio::spawn(async move {
        let mut buf = vec![0u8; RELAY_CHUNK_MAX_BYTES];
        loop {
            match source.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = tx.send(wrap(None)).await;
                    return;
                }
                Ok(n) => {
                    if tx.send(wrap(Some(buf[..n].to_vec()))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            RelayMsg::Hello(Hello {
                argv: vec!["peer".into()],
                env: vec![("K".into(), "v".into())],
                cwd: "/".into(),
                pid: 7,
            }),
            RelayMsg::Stdin(b"in".to_vec()),
            RelayMsg::StdinEof,
            RelayMsg::Stdout(b"out".to_vec()),
            RelayMsg::Stderr(Vec::new()),
            RelayMsg::CloseStdout,
            RelayMsg::Dial {
                channel: 1,
                path: "/tmp/s".into(),
            },
            RelayMsg::Listen {
                channel: 2,
                path: "/tmp/l".into(),
            },
            RelayMsg::Opened(3),
            RelayMsg::OpenFailed {
                channel: 4,
                reason: "refused".into(),
            },
            RelayMsg::Data {
                channel: 5,
                bytes: vec![0, 255],
            },
            RelayMsg::Eof(6),
            RelayMsg::Exit(-3),
        ];
        for msg in msgs {
            assert_eq!(RelayMsg::decode(&msg.encode()).unwrap(), msg);
        }
        assert!(RelayMsg::decode(&[]).is_err());
        assert!(RelayMsg::decode(&[99]).is_err());
        assert!(RelayMsg::decode(&[11, 0, 0]).is_err());
        assert!(RelayMsg::decode(&[13, 0]).is_err());
    }

    #[test]
    fn long_data_is_split_into_bounded_chunks() {
        let parts = split(RelayMsg::Data {
            channel: 1,
            bytes: vec![1; RELAY_CHUNK_MAX_BYTES * 2 + 1],
        });
        assert_eq!(parts.len(), 3);
        assert!(
            parts
                .iter()
                .all(|p| p.encode().len() <= RELAY_FRAME_MAX_BYTES)
        );
    }

    /// The peer loop in-process: stdio through pipes, a socket the "target" listens on,
    /// and the harness end scripting it.
    #[tokio::test]
    async fn the_harness_scripts_stdio_and_sockets_through_the_peer() {
        let dir = tempfile::tempdir().unwrap();
        let relay_path = dir.path().join("relay.sock");
        let listener = RelayListener::bind(&relay_path).unwrap();
        let (stdin_w, stdin_r) = tokio::io::duplex(1024);
        let (stdout_w, mut stdout_r) = tokio::io::duplex(1024);
        let (stderr_w, _stderr_r) = tokio::io::duplex(1024);
        let hello = Hello {
            argv: vec!["contract-harness".into(), "peer".into()],
            env: vec![("TOKEN".into(), "t-1".into())],
            cwd: "/".into(),
            pid: 1,
        };
        let peer = tokio::spawn({
            let relay_path = relay_path.clone();
            let hello = hello.clone();
            async move { run_peer(&relay_path, hello, stdin_r, stdout_w, stderr_w).await }
        });
        let t = Duration::from_secs(5);
        let (mut relay, got) = listener.accept(t).await.unwrap();
        assert_eq!(got, hello);
        // The target writes to the peer's stdin; the harness sees it.
        let mut stdin_w = stdin_w;
        stdin_w.write_all(b"ping").await.unwrap();
        assert_eq!(
            relay.recv().await,
            RelayEvent::Msg(RelayMsg::Stdin(b"ping".to_vec()))
        );
        drop(stdin_w);
        assert_eq!(relay.recv().await, RelayEvent::Msg(RelayMsg::StdinEof));
        // The harness writes the peer's stdout.
        relay
            .send(RelayMsg::Stdout(b"1|handshake\n".to_vec()), t)
            .await
            .unwrap();
        let mut line = [0u8; 12];
        stdout_r.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"1|handshake\n");
        // The target listens; the peer dials it for the harness; bytes flow both ways.
        let target_path = dir.path().join("target.sock");
        let target = UnixListener::bind(&target_path).unwrap();
        relay
            .send(
                RelayMsg::Dial {
                    channel: 1,
                    path: target_path.display().to_string(),
                },
                t,
            )
            .await
            .unwrap();
        let (mut at_target, _) = target.accept().await.unwrap();
        assert_eq!(relay.recv().await, RelayEvent::Msg(RelayMsg::Opened(1)));
        relay
            .send(
                RelayMsg::Data {
                    channel: 1,
                    bytes: b"frame".to_vec(),
                },
                t,
            )
            .await
            .unwrap();
        let mut buf = [0u8; 5];
        at_target.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"frame");
        at_target.write_all(b"reply").await.unwrap();
        assert_eq!(
            relay.recv().await,
            RelayEvent::Msg(RelayMsg::Data {
                channel: 1,
                bytes: b"reply".to_vec()
            })
        );
        drop(at_target);
        assert_eq!(relay.recv().await, RelayEvent::Msg(RelayMsg::Eof(1)));
        // A refused dial is reported, not fatal.
        relay
            .send(
                RelayMsg::Dial {
                    channel: 2,
                    path: dir.path().join("none").display().to_string(),
                },
                t,
            )
            .await
            .unwrap();
        assert!(matches!(
            relay.recv().await,
            RelayEvent::Msg(RelayMsg::OpenFailed { channel: 2, .. })
        ));
        relay.send(RelayMsg::Exit(3), t).await.unwrap();
        assert_eq!(peer.await.unwrap().unwrap(), PeerEnd::Exit(3));
    }

    /// A hello with nothing in it.
    fn blank_hello() -> Hello {
        Hello {
            argv: vec![],
            env: vec![],
            cwd: "/".into(),
            pid: 1,
        }
    }

    #[tokio::test]
    async fn a_stalled_stdout_does_not_keep_the_peer_alive() {
        let dir = tempfile::tempdir().unwrap();
        let relay_path = dir.path().join("relay.sock");
        let listener = RelayListener::bind(&relay_path).unwrap();
        let hello = blank_hello();
        let (_stdin_w, stdin_r) = tokio::io::duplex(64);
        // Nobody reads the peer's stdout: writes stall after 64 bytes.
        let (stdout_w, _stdout_r) = tokio::io::duplex(64);
        let peer = tokio::spawn({
            let relay_path = relay_path.clone();
            async move { run_peer(&relay_path, hello, stdin_r, stdout_w, tokio::io::sink()).await }
        });
        let t = Duration::from_secs(5);
        let (mut relay, _) = listener.accept(t).await.unwrap();
        relay
            .send(RelayMsg::Stdout(vec![b'x'; 1 << 20]), t)
            .await
            .unwrap();
        drop(relay);
        let end = tokio::time::timeout(t, peer)
            .await
            .expect("the peer must end");
        assert_eq!(end.unwrap().unwrap(), PeerEnd::LinkGone);
    }

    #[tokio::test]
    async fn the_peer_ends_when_the_harness_goes_away() {
        let dir = tempfile::tempdir().unwrap();
        let relay_path = dir.path().join("relay.sock");
        let listener = RelayListener::bind(&relay_path).unwrap();
        let hello = blank_hello();
        let (_stdin_w, stdin_r) = tokio::io::duplex(64);
        let peer = tokio::spawn({
            let relay_path = relay_path.clone();
            async move {
                run_peer(
                    &relay_path,
                    hello,
                    stdin_r,
                    tokio::io::sink(),
                    tokio::io::sink(),
                )
                .await
            }
        });
        let (relay, _) = listener.accept(Duration::from_secs(5)).await.unwrap();
        drop(relay);
        assert_eq!(peer.await.unwrap().unwrap(), PeerEnd::LinkGone);
        // Without a harness the peer cannot start.
        drop(listener);
        let (_w, r) = tokio::io::duplex(64);
        let hello = blank_hello();
        assert!(
            run_peer(&relay_path, hello, r, tokio::io::sink(), tokio::io::sink())
                .await
                .is_err()
        );
    }
}
