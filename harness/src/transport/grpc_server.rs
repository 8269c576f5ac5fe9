//! The harness as a gRPC **server** on a Unix socket, with dynamic messages: it plays a
//! daemon whose every answer the scenario scripts (the engine family's side `client`).
//!
//! Each call a client makes becomes one [`IncomingCall`] in arrival order: a name the
//! server gives it (`call-<n>`), the method, how it authenticated, and its request in the
//! proto3 JSON mapping (decoded with `prost-reflect` from the family's descriptor pool).
//! The driver answers a call by name through [`GrpcServer::answerer`]:
//! [`Answerer::message`] sends one response message (encoded payload bytes, so unknown
//! fields can be sent on purpose), [`Answerer::finish`] ends it with a status and
//! trailers. Unary and
//! server-streaming methods look the same on the wire (messages, then trailers), so every
//! method is served as a stream of what the driver sends. The response headers wait for
//! the driver's first answer: a call ended with a status before any message gets a
//! trailers-only response, as from a server that refuses the call outright.
//!
//! [`GrpcServer::disconnect`] drops every connection at once (no GOAWAY, no status): the
//! client sees a transport failure, as when a daemon dies.
//!
//! Bounds: at most [`CONNECTIONS_MAX`] connections at once (more wait in the backlog),
//! [`CALL_QUEUE_MAX`] calls the driver has not read (then new calls wait), a request of at
//! most [`REQUEST_MAX_BYTES`], [`RESPONSE_QUEUE_MAX`] answers queued per call.
//!
//! This module owns the socket, the connections and the calls; it never decides an
//! answer (the driver scripts every one) and never panics on what a client sends.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost_reflect::{DescriptorPool, MethodDescriptor};
use serde_json::Value;
use tokio::net::UnixListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tonic::Status;
use tonic::server::{Grpc, ServerStreamingService};

use super::grpc::{RawCodec, to_json};

/// Connections served at once.
pub const CONNECTIONS_MAX: usize = 16;

/// Calls received and not yet read by the driver; past it new calls wait.
pub const CALL_QUEUE_MAX: usize = 256;

/// Largest request message the server decodes (bytes).
pub const REQUEST_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Answers queued for one call before the driver waits for the client to read them.
pub const RESPONSE_QUEUE_MAX: usize = 64;

/// How a call presented the endpoint token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// The token in a metadata entry (`authorization: Bearer <token>`, or the token as
    /// another entry's whole value).
    Token,
    /// An `authorization` entry with anything else.
    Wrong,
    /// No `authorization` entry.
    None,
}

impl Auth {
    /// `token`, `wrong` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Auth::Token => "token",
            Auth::Wrong => "wrong",
            Auth::None => "none",
        }
    }
}

/// One call a client made.
#[derive(Debug, Clone, PartialEq)]
pub struct IncomingCall {
    /// The server's name for it (`call-<n>`, in arrival order).
    pub call: String,
    /// The method's short name (`StartRun`).
    pub method: String,
    /// How it authenticated.
    pub auth: Auth,
    /// The request in the proto3 JSON mapping, or why it did not decode.
    pub request: Result<Value, String>,
}

type Answer = Result<Vec<u8>, Status>;

/// The calls in flight: their method and where their answers go.
#[derive(Default)]
struct Calls {
    open: HashMap<String, (MethodDescriptor, mpsc::Sender<Answer>)>,
}

/// A listening server and its calls.
pub struct GrpcServer {
    socket: PathBuf,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    calls: Arc<Mutex<Calls>>,
    /// Set to end every connection gracefully ([`GrpcServer::close_gracefully`]).
    stop: tokio::sync::watch::Sender<bool>,
    /// Calls in arrival order.
    pub rx: mpsc::Receiver<IncomingCall>,
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrpcServer({})", self.socket.display())
    }
}

/// What every connection shares.
#[derive(Clone)]
struct Shared {
    pool: DescriptorPool,
    service: String,
    token: Arc<str>,
    counter: Arc<AtomicU64>,
    /// What call names start with (`call-`).
    prefix: Arc<str>,
    /// Becomes true when the connections are to end gracefully.
    stop: tokio::sync::watch::Receiver<bool>,
    calls: Arc<Mutex<Calls>>,
    tx: mpsc::Sender<IncomingCall>,
}

impl GrpcServer {
    /// Listens on `socket` (made 0600) and serves `service` of `pool`, checking calls
    /// against `token`.
    ///
    /// # Errors
    /// The socket cannot be bound or made private.
    pub fn bind(
        socket: &Path,
        pool: &DescriptorPool,
        service: &str,
        token: &str,
    ) -> Result<Self, String> {
        let listener =
            UnixListener::bind(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        Ok(Self::serve(
            socket.to_path_buf(),
            "call-",
            pool,
            service,
            token,
            {
                let listener = Arc::new(listener);
                move || {
                    let listener = listener.clone();
                    async move {
                        loop {
                            match listener.accept().await {
                                Ok((stream, _)) => return Some(stream),
                                // Out of descriptors, say: try again shortly.
                                Err(_) => {
                                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                                }
                            }
                        }
                    }
                }
            },
        ))
    }

    /// Serves `service` on the connections `incoming` yields (byte streams the caller
    /// carries, e.g. through a relay), checking calls against `token`; calls are named
    /// `<prefix><n>`. `label` names the server in debug output.
    pub fn over<S>(
        label: &str,
        prefix: &str,
        pool: &DescriptorPool,
        service: &str,
        token: &str,
        incoming: mpsc::Receiver<S>,
    ) -> Self
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let incoming = Arc::new(tokio::sync::Mutex::new(incoming));
        Self::serve(
            PathBuf::from(label),
            prefix,
            pool,
            service,
            token,
            move || {
                let incoming = incoming.clone();
                async move { incoming.lock().await.recv().await }
            },
        )
    }

    fn serve<S, F, Fut>(
        socket: PathBuf,
        prefix: &str,
        pool: &DescriptorPool,
        service: &str,
        token: &str,
        next: F,
    ) -> Self
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Option<S>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(CALL_QUEUE_MAX);
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let calls = Arc::new(Mutex::new(Calls::default()));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            pool: pool.clone(),
            service: service.to_string(),
            token: token.into(),
            counter: Arc::new(AtomicU64::new(0)),
            prefix: prefix.into(),
            stop: stop_rx,
            calls: calls.clone(),
            tx,
        };
        let accept = tokio::spawn(accept_loop(next, shared, connections.clone()));
        Self {
            socket,
            accept,
            connections,
            calls,
            stop,
            rx,
        }
    }

    /// Whether a client connection is open.
    pub fn connected(&self) -> bool {
        lock(&self.connections).iter().any(|c| !c.is_finished())
    }

    /// Drops every connection and every call in flight; `false` when none was open.
    pub fn disconnect(&self) -> bool {
        let mut any = false;
        for c in lock(&self.connections).drain(..) {
            any |= !c.is_finished();
            c.abort();
        }
        lock(&self.calls).open.clear();
        any
    }

    /// A handle that answers this server's calls from another task.
    pub fn answerer(&self) -> Answerer {
        Answerer {
            calls: self.calls.clone(),
        }
    }

    /// Stops accepting connections and ends each one gracefully: GOAWAY, the calls in
    /// flight finish, everything written is flushed, then the connection closes (as a
    /// server that shuts down before its process exits).
    pub fn close_gracefully(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops listening and drops every connection.
    pub fn close(&mut self) {
        self.accept.abort();
        self.disconnect();
    }
}

/// Answers the calls of one [`GrpcServer`] (cheap to clone).
#[derive(Clone)]
pub struct Answerer {
    calls: Arc<Mutex<Calls>>,
}

impl Answerer {
    /// The method of call `call`, while it is in flight.
    pub fn method(&self, call: &str) -> Option<MethodDescriptor> {
        lock(&self.calls).open.get(call).map(|(m, _)| m.clone())
    }

    /// Sends one response message (encoded payload) on `call`. A call the client already
    /// gave up is not an error: nothing reads the answer.
    ///
    /// # Errors
    /// `call` is not in flight.
    pub async fn message(&self, call: &str, payload: Vec<u8>) -> Result<(), String> {
        let tx = self.sender(call)?;
        let _ = tx.send(Ok(payload)).await;
        Ok(())
    }

    /// Ends `call` with `status` (`OK` ends the stream after what was sent).
    ///
    /// # Errors
    /// `call` is not in flight.
    pub async fn finish(&self, call: &str, status: Option<Status>) -> Result<(), String> {
        let tx = self.sender(call)?;
        lock(&self.calls).open.remove(call);
        if let Some(status) = status {
            let _ = tx.send(Err(status)).await;
        }
        Ok(())
    }

    fn sender(&self, call: &str) -> Result<mpsc::Sender<Answer>, String> {
        lock(&self.calls)
            .open
            .get(call)
            .map(|(_, tx)| tx.clone())
            .ok_or_else(|| format!("call `{call}` is not in flight (it ended, or was never made)"))
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn accept_loop<S, F, Fut>(
    mut next: F,
    shared: Shared,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut stop = shared.stop.clone();
        let stream = tokio::select! {
            stream = next() => stream,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(stream) = stream else {
            return;
        };
        let shared = shared.clone();
        let task = tokio::spawn(async move {
            let mut stop = shared.stop.clone();
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(serve_call(shared, req).await) }
            });
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let stopping = tokio::select! {
                _ = conn.as_mut() => false,
                stopped = stop.wait_for(|s| *s) => stopped.is_ok(),
            };
            if stopping {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(permit);
        });
        let mut list = lock(&connections);
        list.retain(|c| !c.is_finished());
        list.push(task);
    }
}

async fn serve_call(
    shared: Shared,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<tonic::body::Body> {
    let path = req.uri().path().to_string();
    let method = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(service, _)| *service == shared.service)
        .and_then(|(_, name)| {
            shared
                .pool
                .get_service_by_name(&shared.service)?
                .methods()
                .find(|m| m.name() == name)
        });
    let auth = auth_of(req.headers(), &shared.token);
    let Some(method) = method else {
        // Recorded like any call, so a scenario sees it (and fails on it: a client calls
        // only what an operation asks for), then refused.
        let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = shared
            .tx
            .send(IncomingCall {
                call: format!("{}{n}", shared.prefix),
                method: path.clone(),
                auth,
                request: Err(format!("{path} is not a method of {}", shared.service)),
            })
            .await;
        return Status::unimplemented(format!("no method {path}")).into_http();
    };
    let handler = Handler {
        shared,
        method,
        auth,
    };
    let mut grpc = Grpc::new(RawCodec).max_decoding_message_size(REQUEST_MAX_BYTES);
    grpc.server_streaming(handler, req).await
}

/// How a call presented `token`: [`Auth::Token`] when any metadata entry is the token
/// or `Bearer <token>` (the spec says only "from gRPC metadata"; the entry's name is the
/// implementation's), [`Auth::Wrong`] when an `authorization` entry holds anything else,
/// else [`Auth::None`].
pub fn auth_of(headers: &http::HeaderMap, token: &str) -> Auth {
    let bearer = format!("Bearer {token}");
    let presents = |v: &http::HeaderValue| {
        v.as_bytes() == token.as_bytes() || v.as_bytes() == bearer.as_bytes()
    };
    if headers.values().any(presents) {
        Auth::Token
    } else if headers.contains_key("authorization") {
        Auth::Wrong
    } else {
        Auth::None
    }
}

/// Records one call and streams what the driver answers.
struct Handler {
    shared: Shared,
    method: MethodDescriptor,
    auth: Auth,
}

type AnswerStream = Pin<Box<dyn Stream<Item = Answer> + Send>>;

impl ServerStreamingService<Vec<u8>> for Handler {
    type Response = Vec<u8>;
    type ResponseStream = AnswerStream;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<AnswerStream>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Vec<u8>>) -> Self::Future {
        let shared = self.shared.clone();
        let method = self.method.clone();
        let auth = self.auth;
        Box::pin(async move {
            let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;
            let call = format!("{}{n}", shared.prefix);
            let (tx, rx) = mpsc::channel(RESPONSE_QUEUE_MAX);
            lock(&shared.calls)
                .open
                .insert(call.clone(), (method.clone(), tx));
            let incoming = IncomingCall {
                call,
                method: method.name().to_string(),
                auth,
                request: to_json(method.input(), request.get_ref()),
            };
            if shared.tx.send(incoming).await.is_err() {
                return Err(Status::unavailable("the harness stopped"));
            }
            // The response headers wait for the first answer, so a call the scenario ends
            // with a status before any message gets a trailers-only response, as a server
            // that refuses a call does.
            let mut rx = rx;
            let first = match rx.recv().await {
                Some(Err(status)) => return Err(status),
                Some(Ok(message)) => Some(Ok(message)),
                None => None,
            };
            let rest = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|answer| (answer, rx))
            });
            let stream = futures_util::StreamExt::chain(futures_util::stream::iter(first), rest);
            Ok(tonic::Response::new(Box::pin(stream) as AnswerStream))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use serde_json::json;

    use super::*;
    use crate::family::engine::codec::{SERVICE, pool};
    use crate::transport::grpc::{CallEvent, CallSpec, GrpcLink, from_json, method};

    fn spec(call: &str, name: &str, request: Value, auth: Option<&str>) -> CallSpec {
        let m = method(pool(), SERVICE, name).unwrap();
        CallSpec {
            call: call.into(),
            payload: from_json(m.input(), &request).unwrap(),
            method: m,
            metadata: auth
                .map(|a| vec![("authorization".to_string(), a.to_string())])
                .unwrap_or_default(),
            timeout: None,
            reading: crate::transport::grpc::Reading::Read,
        }
    }

    #[tokio::test]
    async fn calls_are_recorded_answered_refused_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("d.sock");
        let mut server = GrpcServer::bind(&socket, pool(), SERVICE, "tok").unwrap();
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut link = GrpcLink::new(&socket);

        // Recorded with its request and how it authenticated; answered by name.
        link.start(spec(
            "a",
            "CancelRun",
            json!({"runId": "r"}),
            Some("Bearer tok"),
        ))
        .unwrap();
        let call = server.rx.recv().await.unwrap();
        assert_eq!(
            (
                call.method.as_str(),
                call.auth,
                call.request.clone().unwrap()
            ),
            ("CancelRun", Auth::Token, json!({"runId": "r"}))
        );
        let out = server.answerer().method(&call.call).unwrap().output();
        let reply = from_json(out, &json!({"alreadyTerminal": true})).unwrap();
        server.answerer().message(&call.call, reply).await.unwrap();
        server.answerer().finish(&call.call, None).await.unwrap();
        assert_eq!(
            link.next().await.unwrap(),
            CallEvent::Message {
                call: "a".into(),
                message: json!({"alreadyTerminal": true})
            }
        );
        assert!(
            matches!(link.next().await.unwrap(), CallEvent::Status { code, .. } if code == "OK")
        );
        // An ended call cannot be answered again.
        assert!(
            server
                .answerer()
                .message(&call.call, Vec::new())
                .await
                .is_err()
        );

        // Another token, and no token; a refusal with a trailer.
        link.start(spec("b", "Health", json!({}), Some("Bearer nope")))
            .unwrap();
        let wrong = server.rx.recv().await.unwrap();
        assert_eq!(wrong.auth, Auth::Wrong);
        let mut meta = tonic::metadata::MetadataMap::new();
        meta.insert("engine-oldest-retained-sequence", "5".parse().unwrap());
        let refusal = Status::with_metadata(tonic::Code::OutOfRange, "gap", meta);
        server
            .answerer()
            .finish(&wrong.call, Some(refusal))
            .await
            .unwrap();
        match link.next().await.unwrap() {
            CallEvent::Status { code, trailers, .. } => {
                assert_eq!(code, "OUT_OF_RANGE");
                assert_eq!(trailers["engine-oldest-retained-sequence"], json!("5"));
            }
            other => panic!("{other:?}"),
        }
        link.start(spec("c", "Health", json!({}), None)).unwrap();
        assert_eq!(server.rx.recv().await.unwrap().auth, Auth::None);

        // A dropped connection ends the call in transport, and it is no longer in flight.
        assert!(server.disconnect());
        match link.next().await.unwrap() {
            CallEvent::Status { code, .. } => assert_ne!(code, "OK"),
            other => panic!("{other:?}"),
        }
        assert!(server.answerer().method("call-3").is_none());
        // The client can connect again.
        link.abort();
        link.start(spec("d", "Health", json!({}), Some("Bearer tok")))
            .unwrap();
        assert_eq!(server.rx.recv().await.unwrap().call, "call-4");
    }
}
