//! The harness as a **client** of the target (side `core`: the harness plays the Runtime
//! and the user): plain HTTP requests ([`HttpClient`]) for bootstrap and the public API,
//! and the WebSocket dial ([`dial_ws`]) for the machine connection.
//!
//! Bounds: every request and dial has a deadline; response bodies are read in chunks up
//! to [`HTTP_RESPONSE_MAX_BYTES`] (more is an error, never buffered); the WebSocket uses
//! the size bounds the family gives ([`WsLimits`]). No proxy is
//! consulted (the target is always on `127.0.0.1`).
//!
//! This module never interprets bodies or frames and never decides what a status means.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::TransportError;
use super::ws::{BoxedIo, WsConnection, WsLimits};

/// Largest HTTP response body the client reads (bytes): Core's largest answers (a Turn's
/// events page, a file read) stay well below it.
pub const HTTP_RESPONSE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// One HTTP answer: status and the raw body (at most [`HTTP_RESPONSE_MAX_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// HTTP status code.
    pub status: u16,
    /// The complete body (possibly empty).
    pub body: Vec<u8>,
}

/// The `Authorization` header the harness presents: `scheme`, a space, the credential.
/// The scheme defaults to `Bearer`; a scenario may write it in another case (a scheme is
/// case-insensitive, RFC 9110 "Authentication Scheme") or another word (which a target
/// must refuse).
#[derive(Debug, Clone, Copy)]
pub struct Auth<'a> {
    /// The scheme word (`Bearer`, `bearer`, `Basic`, …).
    pub scheme: &'a str,
    /// The credential that follows it.
    pub token: &'a str,
}

impl<'a> Auth<'a> {
    /// `Bearer <token>`.
    pub fn bearer(token: &'a str) -> Self {
        Self {
            scheme: "Bearer",
            token,
        }
    }

    /// `<scheme> <token>`, `scheme` defaulting to `Bearer`.
    pub fn with_scheme(scheme: Option<&'a str>, token: &'a str) -> Self {
        Self {
            scheme: scheme.unwrap_or("Bearer"),
            token,
        }
    }

    /// The header value, marked sensitive (never printed by the HTTP stack).
    ///
    /// # Errors
    /// [`TransportError::Client`] when the scheme or credential is not a valid header value.
    pub fn header(&self) -> Result<HeaderValue, TransportError> {
        let mut value =
            HeaderValue::from_str(&format!("{} {}", self.scheme, self.token)).map_err(|_| {
                TransportError::Client("the credential is not a valid header value".into())
            })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// An HTTP/1.1 client with per-request deadlines.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
}

impl HttpClient {
    /// A client that never uses a proxy, keeps no cookies and opens a fresh connection
    /// for every request: a target that closes a connection after an answer (a refused
    /// over-bound body it did not read) can never fail the next request on a connection
    /// the pool still held.
    ///
    /// # Errors
    /// [`TransportError::Client`] when the client cannot be built.
    pub fn new() -> Result<Self, TransportError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| TransportError::Client(e.to_string()))?;
        Ok(Self { client })
    }

    /// Sends `method url` with an optional `Authorization` header ([`Auth`]) and an
    /// optional JSON body, and reads the whole answer, all within `timeout`.
    ///
    /// # Errors
    /// [`TransportError::Client`] (bad method or URL, connection failure),
    /// [`TransportError::ResponseTooLarge`], [`TransportError::Timeout`].
    pub async fn request(
        &self,
        method: &str,
        url: &str,
        auth: Option<Auth<'_>>,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<HttpAnswer, TransportError> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| TransportError::Client(format!("method {method:?}: {e}")))?;
        let mut request = self.client.request(method, url);
        if let Some(auth) = auth {
            request = request.header(reqwest::header::AUTHORIZATION, auth.header()?);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let exchange = async {
            let mut response = request
                .send()
                .await
                .map_err(|e| TransportError::Client(e.without_url().to_string()))?;
            let status = response.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| TransportError::Client(e.without_url().to_string()))?
            {
                if body.len() + chunk.len() > HTTP_RESPONSE_MAX_BYTES {
                    return Err(TransportError::ResponseTooLarge {
                        limit: HTTP_RESPONSE_MAX_BYTES,
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(HttpAnswer { status, body })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| TransportError::Timeout(timeout))?
    }
}

/// The result of a WebSocket dial.
#[derive(Debug)]
pub enum WsDial {
    /// `101`: the connection is open.
    Upgraded(WsConnection),
    /// The server answered the upgrade request with another status.
    Refused(HttpAnswer),
}

/// Opens a WebSocket to `url` (`ws://host:port/path?query`) with the `Authorization`
/// header ([`Auth`]), within `timeout`.
///
/// # Errors
/// [`TransportError::Client`] for a bad URL, a connection failure or a broken handshake;
/// [`TransportError::Timeout`].
pub async fn dial_ws(
    url: &str,
    auth: Auth<'_>,
    timeout: Duration,
    limits: WsLimits,
) -> Result<WsDial, TransportError> {
    let mut request = url
        .into_client_request()
        .map_err(|e| TransportError::Client(format!("WebSocket URL: {e}")))?;
    request
        .headers_mut()
        .insert("authorization", auth.header()?);
    let uri = request.uri();
    if uri.scheme_str() != Some("ws") {
        return Err(TransportError::Client(format!(
            "only ws:// URLs are supported, got scheme {:?}",
            uri.scheme_str().unwrap_or("")
        )));
    }
    let host = uri.host().unwrap_or("").to_string();
    let port = uri.port_u16().unwrap_or(80);
    let dial = async {
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| TransportError::Client(format!("connecting to {host}:{port}: {e}")))?;
        let io: BoxedIo = Box::new(tcp);
        match tokio_tungstenite::client_async_with_config(request, io, Some(limits.config())).await
        {
            Ok((stream, _response)) => Ok(WsDial::Upgraded(WsConnection::new(stream, limits))),
            Err(tungstenite::Error::Http(response)) => Ok(WsDial::Refused(HttpAnswer {
                status: response.status().as_u16(),
                body: response.body().clone().unwrap_or_default(),
            })),
            Err(e) => Err(TransportError::Client(format!("WebSocket handshake: {e}"))),
        }
    };
    tokio::time::timeout(timeout, dial)
        .await
        .map_err(|_| TransportError::Timeout(timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::ScriptedServer;
    use crate::transport::ws::TEST_LIMITS;
    use serde_json::json;

    #[tokio::test]
    async fn request_reads_status_and_body_and_sends_bearer() {
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let client = HttpClient::new().unwrap();
        let url = format!("{}/api/v1/agent-daemon/bootstrap", core.base_url());
        let call = tokio::spawn(async move {
            client
                .request(
                    "POST",
                    &url,
                    Some(Auth::bearer("tok")),
                    Some(b"{\"a\":1}".to_vec()),
                    Duration::from_secs(5),
                )
                .await
        });
        let req = core.next_request().await.unwrap();
        assert_eq!(req.header("authorization"), Some("Bearer tok"));
        req.respond(201, Some(&json!({"ok": true}))).unwrap();
        let answer = call.await.unwrap().unwrap();
        assert_eq!(answer.status, 201);
        assert_eq!(answer.body, br#"{"ok":true}"#);
    }

    #[tokio::test]
    async fn dial_upgrades_or_reports_the_refusal() {
        let dial = |url: String, scheme: Option<&'static str>| {
            tokio::spawn(async move {
                let auth = Auth::with_scheme(scheme, "tok");
                dial_ws(&url, auth, Duration::from_secs(5), TEST_LIMITS).await
            })
        };
        let mut core = ScriptedServer::start(TEST_LIMITS).await.unwrap();
        let dial1 = dial(
            format!("{}?device_id=d&version=1", core.ws_url("/ws")),
            None,
        );
        let req = core.next_request().await.unwrap();
        assert_eq!(req.header("authorization"), Some("Bearer tok"));
        req.respond(426, Some(&json!({"error": "incompatible_version"})))
            .unwrap();
        let WsDial::Refused(answer) = dial1.await.unwrap().unwrap() else {
            panic!("expected a refusal");
        };
        assert_eq!(answer.status, 426);
        // The scheme word as the scenario writes it.
        let dial2 = dial(core.ws_url("/ws"), Some("bearer"));
        let req = core.next_request().await.unwrap();
        assert_eq!(req.header("authorization"), Some("bearer tok"));
        let _server = req.upgrade(Duration::from_secs(5)).await.unwrap();
        assert!(matches!(dial2.await.unwrap().unwrap(), WsDial::Upgraded(_)));
    }

    #[tokio::test]
    async fn bad_urls_are_errors() {
        let err = dial_ws(
            "http://127.0.0.1:1/x",
            Auth::bearer("t"),
            Duration::from_secs(1),
            TEST_LIMITS,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "client_failed");
    }
}
