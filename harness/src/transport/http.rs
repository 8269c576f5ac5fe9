//! The scripted HTTP server (a family's peer, e.g. the scripted Core).
//!
//! [`ScriptedServer::start`] listens on `127.0.0.1:0` and serves every request on any path
//! (the family checks the path: a target calling anything but the routes the family
//! expects fails the step that sees it). Each request becomes one [`IncomingRequest`] on a
//! bounded queue, in arrival order; the server holds the HTTP exchange open until the
//! driver answers it with [`IncomingRequest::respond`] (status + JSON body) or
//! [`IncomingRequest::upgrade`] (101 and a [`WsConnection`]). A request the driver drops
//! unanswered gets `503 {"error": "harness_not_expecting_request"}`.
//!
//! Bounds: at most [`HTTP_CONNECTIONS_MAX`] connections served at once, request bodies up
//! to [`HTTP_BODY_MAX_BYTES`], [`HTTP_QUEUE_CAPACITY`] queued requests, hyper's default
//! header limits and a 30 s header-read timeout.
//!
//! This module never decides an answer itself and never interprets bodies.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::ws::{BoxedIo, WsConnection, WsLimits};
use super::{HTTP_BODY_MAX_BYTES, HTTP_CONNECTIONS_MAX, HTTP_QUEUE_CAPACITY, TransportError};

/// The body of an [`IncomingRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestBody {
    /// The complete body (possibly empty).
    Bytes(Vec<u8>),
    /// The body exceeded [`HTTP_BODY_MAX_BYTES`] and was not kept.
    TooLarge,
    /// Reading the body failed (the peer aborted).
    Failed(String),
}

/// One HTTP request the target sent to the scripted server, waiting for the driver's
/// answer. Dropping it unanswered answers `503`.
#[derive(Debug)]
pub struct IncomingRequest {
    /// HTTP method (`GET`, `POST`, …).
    pub method: String,
    /// Request path, without the query.
    pub path: String,
    /// Raw query string (without `?`), if any.
    pub query: Option<String>,
    /// Headers in arrival order; names lower-case, values lossily decoded as UTF-8.
    pub headers: Vec<(String, String)>,
    /// The request body (empty for upgrade requests).
    pub body: RequestBody,
    upgrade: Option<UpgradeInfo>,
    reply: oneshot::Sender<Reply>,
}

#[derive(Debug)]
struct UpgradeInfo {
    accept_key: String,
}

#[derive(Debug)]
enum Reply {
    Status { status: StatusCode, body: Vec<u8> },
    Upgrade(oneshot::Sender<Result<WsConnection, TransportError>>),
}

impl IncomingRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Path and query as sent (`/path?query`).
    pub fn url(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }

    /// The query parameters, percent- and `+`-decoded, in order (repeats kept).
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        self.query.as_deref().map(parse_query).unwrap_or_default()
    }

    /// Whether the request is a well-formed WebSocket upgrade (GET, `Upgrade: websocket`,
    /// `Connection: upgrade`, `Sec-WebSocket-Version: 13`, a key).
    pub fn is_websocket_upgrade(&self) -> bool {
        self.upgrade.is_some()
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        format!("HTTP request {} {}", self.method, self.path)
    }

    /// Answers with `status` and, when given, a JSON `body`.
    ///
    /// # Errors
    /// [`TransportError::InvalidStatus`] for a status HTTP cannot carry or `101` (use
    /// [`IncomingRequest::upgrade`]).
    pub fn respond(self, status: u16, body: Option<&Value>) -> Result<(), TransportError> {
        let code =
            StatusCode::from_u16(status).map_err(|_| TransportError::InvalidStatus(status))?;
        if code == StatusCode::SWITCHING_PROTOCOLS {
            return Err(TransportError::InvalidStatus(status));
        }
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        // The peer may already be gone; there is nobody left to tell.
        let _ = self.reply.send(Reply::Status { status: code, body });
        Ok(())
    }

    /// Answers `101 Switching Protocols` and waits (at most `timeout`) for the upgraded
    /// connection.
    ///
    /// # Errors
    /// [`TransportError::NotUpgradable`] when the request is no WebSocket upgrade (it is
    /// answered `400`); [`TransportError::UpgradeFailed`] when the peer vanished before the
    /// upgrade completed; [`TransportError::Timeout`].
    pub async fn upgrade(self, timeout: Duration) -> Result<WsConnection, TransportError> {
        if self.upgrade.is_none() {
            let _ = self.reply.send(Reply::Status {
                status: StatusCode::BAD_REQUEST,
                body: br#"{"error":"not_a_websocket_upgrade"}"#.to_vec(),
            });
            return Err(TransportError::NotUpgradable(format!(
                "{} {} lacks the WebSocket upgrade headers",
                self.method, self.path
            )));
        }
        let (tx, rx) = oneshot::channel();
        if self.reply.send(Reply::Upgrade(tx)).is_err() {
            return Err(TransportError::UpgradeFailed(
                "the connection closed before the answer".into(),
            ));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(TransportError::UpgradeFailed(
                "the connection task ended".into(),
            )),
            Err(_) => Err(TransportError::Timeout(timeout)),
        }
    }
}

/// A listening HTTP server whose every answer is scripted by the family's peer. Dropping it stops the server and every connection it still serves (upgraded
/// connections already handed out live on in their [`WsConnection`]).
#[derive(Debug)]
pub struct ScriptedServer {
    addr: SocketAddr,
    requests: mpsc::Receiver<IncomingRequest>,
    server: JoinHandle<()>,
}

impl ScriptedServer {
    /// Binds `127.0.0.1:0` and starts serving; upgraded WebSockets get `limits`.
    ///
    /// # Errors
    /// [`TransportError::Bind`].
    pub async fn start(limits: WsLimits) -> Result<Self, TransportError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(TransportError::Bind)?;
        let addr = listener.local_addr().map_err(TransportError::Bind)?;
        let (tx, requests) = mpsc::channel(HTTP_QUEUE_CAPACITY);
        let server = tokio::spawn(serve(listener, tx, limits));
        Ok(Self {
            addr,
            requests,
            server,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The WebSocket URL of `path` on this server: `ws://127.0.0.1:<port><path>`.
    pub fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{path}", self.addr)
    }

    /// The next request, waiting as long as it takes (wrap it in a timeout). `None` only
    /// if the server task ended. Cancel-safe.
    pub async fn next_request(&mut self) -> Option<IncomingRequest> {
        self.requests.recv().await
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, tx: mpsc::Sender<IncomingRequest>, limits: WsLimits) {
    let permits = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
    let mut connections = JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let tx = tx.clone();
                connections.spawn(async move {
                    let _permit = permit;
                    let service = service_fn(move |req| handle(req, tx.clone(), limits));
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new());
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
            // Reap finished connections so the set stays bounded.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn handle(
    mut req: Request<Incoming>,
    tx: mpsc::Sender<IncomingRequest>,
    limits: WsLimits,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let upgrade = upgrade_info(&req);
    let on_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let body = if upgrade.is_some() {
        RequestBody::Bytes(Vec::new())
    } else {
        match Limited::new(req.into_body(), HTTP_BODY_MAX_BYTES)
            .collect()
            .await
        {
            Ok(collected) => RequestBody::Bytes(collected.to_bytes().to_vec()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => RequestBody::TooLarge,
            Err(e) => RequestBody::Failed(e.to_string()),
        }
    };
    let accept_key = upgrade.as_ref().map(|u| u.accept_key.clone());
    let (reply_tx, reply_rx) = oneshot::channel();
    let request = IncomingRequest {
        method,
        path,
        query,
        headers,
        body,
        upgrade,
        reply: reply_tx,
    };
    if tx.send(request).await.is_err() {
        return Ok(json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            br#"{"error":"harness_stopped"}"#.to_vec(),
        ));
    }
    let response = match reply_rx.await {
        Ok(Reply::Status { status, body }) => json_response(status, body),
        Ok(Reply::Upgrade(conn_tx)) => match (on_upgrade, accept_key) {
            (Some(on_upgrade), Some(accept_key)) => {
                tokio::spawn(async move {
                    let result = match on_upgrade.await {
                        Ok(upgraded) => {
                            let io: BoxedIo = Box::new(TokioIo::new(upgraded));
                            let stream = WebSocketStream::from_raw_socket(
                                io,
                                Role::Server,
                                Some(limits.config()),
                            )
                            .await;
                            Ok(WsConnection::new(stream, limits))
                        }
                        Err(e) => Err(TransportError::UpgradeFailed(e.to_string())),
                    };
                    let _ = conn_tx.send(result);
                });
                switching_protocols(&accept_key)
            }
            _ => json_response(
                StatusCode::BAD_REQUEST,
                br#"{"error":"not_a_websocket_upgrade"}"#.to_vec(),
            ),
        },
        Err(_) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            br#"{"error":"harness_not_expecting_request"}"#.to_vec(),
        ),
    };
    Ok(response)
}

fn upgrade_info(req: &Request<Incoming>) -> Option<UpgradeInfo> {
    let headers = req.headers();
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
                .unwrap_or(false)
        })
    };
    let is_upgrade = req.method() == http::Method::GET
        && has_token(header::UPGRADE, "websocket")
        && has_token(header::CONNECTION, "upgrade")
        && headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v.as_bytes() == b"13");
    let key = headers.get(header::SEC_WEBSOCKET_KEY)?;
    is_upgrade.then(|| UpgradeInfo {
        accept_key: derive_accept_key(key.as_bytes()),
    })
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn switching_protocols(accept_key: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(value) = HeaderValue::from_str(accept_key) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}

/// Splits and decodes an `application/x-www-form-urlencoded` query string. Invalid
/// percent escapes are kept literally; invalid UTF-8 is decoded lossily.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(
            parse_query("device_id=a%20b&version=1.0.0&x=%zz&y=c+d&flag"),
            vec![
                ("device_id".into(), "a b".into()),
                ("version".into(), "1.0.0".into()),
                ("x".into(), "%zz".into()),
                ("y".into(), "c d".into()),
                ("flag".into(), String::new()),
            ]
        );
        assert_eq!(parse_query("a=%4"), vec![("a".into(), "%4".into())]);
        assert_eq!(parse_query("a=%41"), vec![("a".into(), "A".into())]);
    }
}

#[cfg(test)]
mod transport_tests {
    use super::*;
    use crate::transport::ws::{TEST_LIMITS, WsEvent};

    /// Routes the tests use (this server serves any path).
    const BOOT: &str = "/api/v1/agent-daemon/bootstrap";
    const WS: &str = "/api/v1/agent-daemon/ws";
    use futures_util::{SinkExt, StreamExt};
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::{self, Message};

    const T: Duration = Duration::from_secs(5);

    async fn raw_post(addr: SocketAddr, path: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer tok\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn http_requests_are_scripted_in_order() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let addr = core.addr();
        let client = tokio::spawn(async move {
            raw_post(
                addr,
                "/api/v1/agent-daemon/bootstrap?x=1",
                "{\"device_id\":\"d\"}",
            )
            .await
        });
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, BOOT);
        assert_eq!(req.query.as_deref(), Some("x=1"));
        assert_eq!(req.header("AUTHORIZATION"), Some("Bearer tok"));
        assert_eq!(
            req.body,
            RequestBody::Bytes(b"{\"device_id\":\"d\"}".to_vec())
        );
        assert!(!req.is_websocket_upgrade());
        req.respond(200, Some(&json!({"connection_url": "ws://x"})))
            .unwrap();
        let response = client.await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.ends_with("{\"connection_url\":\"ws://x\"}"),
            "{response}"
        );

        // An unanswered (dropped) request gets 503; a too-large body is reported.
        let big = "x".repeat(HTTP_BODY_MAX_BYTES + 1);
        let client = tokio::spawn(async move { raw_post(addr, "/other", &big).await });
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(req.body, RequestBody::TooLarge);
        drop(req);
        let response = client.await.unwrap();
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    }

    #[tokio::test]
    async fn status_instead_of_upgrade() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let url = format!("{}?device_id=d&version=0.9.0", core.ws_url(WS));
        let client = tokio::spawn(async move { tokio_tungstenite::connect_async(url).await });
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        assert!(req.is_websocket_upgrade());
        assert_eq!(
            req.query_pairs(),
            vec![
                ("device_id".into(), "d".into()),
                ("version".into(), "0.9.0".into())
            ]
        );
        req.respond(426, Some(&json!({"error": "incompatible_version"})))
            .unwrap();
        match client.await.unwrap() {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), 426);
                let body = response.body().clone().unwrap_or_default();
                assert_eq!(body, b"{\"error\":\"incompatible_version\"}");
            }
            other => panic!("expected an HTTP error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn websocket_exchange_bounds_and_close() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let mut request = core.ws_url(WS).into_client_request().unwrap();
        request
            .headers_mut()
            .insert("authorization", HeaderValue::from_static("Bearer tok"));
        let client = tokio::spawn(tokio_tungstenite::connect_async(request));
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(req.header("authorization"), Some("Bearer tok"));
        let mut conn = req.upgrade(T).await.unwrap();
        let (mut client, response) = client.await.unwrap().unwrap();
        assert_eq!(response.status().as_u16(), 101);

        // Harness → target.
        conn.send_text("{\"type\":\"x\"}".into(), T).await.unwrap();
        conn.send_binary(vec![1, 2, 3], T).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::text("{\"type\":\"x\"}")
        );
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::binary(vec![1, 2, 3])
        );

        // Target → harness, in order.
        client.send(Message::text("hello")).await.unwrap();
        client.send(Message::Ping(vec![9].into())).await.unwrap();
        client.send(Message::binary(vec![7])).await.unwrap();
        assert_eq!(conn.recv().await, Some(WsEvent::Text("hello".into())));
        assert_eq!(conn.recv().await, Some(WsEvent::Binary(vec![7])));
        // The ping was answered by the reader task.
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::Pong(vec![9].into())
        );

        // The harness closes; the client's automatic reply arrives as Close.
        conn.send_close(4001, "bye", T).await.unwrap();
        let client_side = tokio::spawn(async move {
            let first = client.next().await;
            // Keep polling so the automatic close reply is flushed; then the end.
            let rest = client.next().await;
            (first, rest)
        });
        assert_eq!(
            conn.recv().await,
            Some(WsEvent::Close {
                code: Some(4001),
                reason: "bye".into()
            })
        );
        conn.finish(T).await;
        let (first, rest) = client_side.await.unwrap();
        match first.unwrap().unwrap() {
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 4001);
                assert_eq!(frame.reason.as_str(), "bye");
            }
            other => panic!("expected close, got {other:?}"),
        }
        assert!(rest.is_none() || rest.is_some_and(|r| r.is_err()));
    }

    #[tokio::test]
    async fn target_initiated_close_is_answered() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let client = tokio::spawn(tokio_tungstenite::connect_async(core.ws_url(WS)));
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        let mut conn = req.upgrade(T).await.unwrap();
        let (mut client, _) = client.await.unwrap().unwrap();
        client
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Away,
                reason: "done".into(),
            })))
            .await
            .unwrap();
        let client_side = tokio::spawn(async move { client.next().await });
        assert_eq!(
            conn.recv().await,
            Some(WsEvent::Close {
                code: Some(1001),
                reason: "done".into()
            })
        );
        conn.finish(T).await;
        match client_side.await.unwrap() {
            Some(Ok(Message::Close(Some(frame)))) => assert_eq!(u16::from(frame.code), 1001),
            other => panic!("expected the close reply, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn oversized_message_and_abrupt_drops() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let url = core.ws_url(WS);
        let client = tokio::spawn(tokio_tungstenite::connect_async(url.clone()));
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        let mut conn = req.upgrade(T).await.unwrap();
        let (mut client, _) = client.await.unwrap().unwrap();
        let big = "x".repeat(TEST_LIMITS.max_message_bytes + 1);
        // The send may block or fail once the harness stops reading; only the event matters.
        let sender = tokio::spawn(async move {
            let _ = client.send(Message::text(big)).await;
            client
        });
        match conn.recv().await {
            Some(WsEvent::Error { code, .. }) => assert_eq!(code, "message_too_large"),
            other => panic!("expected message_too_large, got {other:?}"),
        }
        drop(conn);
        let client = sender.await.unwrap();

        // The target drops the TCP connection without a Close frame → Eof.
        let client_task = tokio::spawn(tokio_tungstenite::connect_async(url.clone()));
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        let mut conn = req.upgrade(T).await.unwrap();
        let (client2, _) = client_task.await.unwrap().unwrap();
        drop(client2);
        assert_eq!(conn.recv().await, Some(WsEvent::Eof));

        // The harness drops abruptly → the client sees no Close frame.
        let client_task = tokio::spawn(tokio_tungstenite::connect_async(url));
        let req = tokio::time::timeout(T, core.next_request())
            .await
            .unwrap()
            .unwrap();
        let conn = req.upgrade(T).await.unwrap();
        let (mut client3, _) = client_task.await.unwrap().unwrap();
        conn.abort();
        match client3.next().await {
            None | Some(Err(_)) => {}
            Some(Ok(Message::Close(_))) => panic!("abort must not send a Close frame"),
            Some(Ok(other)) => panic!("unexpected {other:?}"),
        }
        drop(client);
    }
}
