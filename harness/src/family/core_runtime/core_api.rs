//! `api:` and `api_result:` steps of side `core`: calls to the target Core's public API
//! (`docs/core-api.md`) as the user, checked and recorded as `api response`.
//!
//! `api:` calls `<base_url><path>?<query>` (placeholders substituted in path segments,
//! query values and body; the query percent-encoded, [`encode_query`]); the status is
//! checked and the body matched (binds). `poll: true` repeats a GET until it matches
//! (a Turn answered in a terminal state is final: a mismatch then fails at once),
//! within the step deadline; `await: false` starts the call in its own task and goes on
//! (at most [`API_IN_FLIGHT_MAX`] in flight, each bounded by
//! [`API_ASYNC_CALL_TIMEOUT`]); `api_result:` awaits it (step deadline) and checks and
//! records it like `api:`.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::core_side::ScriptedRuntimePeer;
use crate::drive::{Run, StepResult, fail, show_duration};
use crate::golden::EntryKind;
use crate::scenario::model::{API_IN_FLIGHT_MAX, ApiCall, ApiStep};
use crate::transport::TransportError;
use crate::transport::client::{Auth, HttpAnswer};
use crate::transport::ws::truncate;

/// The Turn states no Turn leaves (`docs/core-api.md`): a polled answer in one is final.
pub const TERMINAL_TURN_STATES: &[&str] = &["completed", "failed", "cancelled"];

/// Whether `answer` is a Turn (a top-level `state` and `turn_id`) in a terminal state.
fn terminal_turn(answer: &HttpAnswer) -> bool {
    let body = answer_body(answer);
    body.get("turn_id").is_some()
        && body
            .get("state")
            .and_then(Value::as_str)
            .is_some_and(|s| TERMINAL_TURN_STATES.contains(&s))
}

/// Pause between two calls of a polling `api:` step (bounded by the step deadline).
pub const API_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Bound on one asynchronous `api:` call (`await: false`), from its start to Core's
/// answer (its `api_result:` step waits at most the step deadline on top of the steps
/// run meanwhile). Above Core's own Files bound (30 s).
pub const API_ASYNC_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Percent-encodes query parameters as `name=value&…` (RFC 3986: every byte but the
/// unreserved `A-Z a-z 0-9 - . _ ~` becomes `%XX`), in the given order.
pub fn encode_query(params: &[(String, String)]) -> String {
    fn encode(text: &str, out: &mut String) {
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(byte));
            } else {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    let mut out = String::new();
    for (i, (name, value)) in params.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        encode(name, &mut out);
        out.push('=');
        encode(value, &mut out);
    }
    out
}

/// An HTTP answer's body as JSON: `null` when empty, the text as a string when it is not
/// JSON. HTTP answers are not wire frames: `null` values are allowed in them.
pub fn answer_body(answer: &HttpAnswer) -> Value {
    if answer.body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| Value::String(truncate(&String::from_utf8_lossy(&answer.body), 2000)))
}

/// An asynchronous `api:` call in flight; its task is aborted when it is dropped (a run
/// that ends early leaves nothing running).
pub struct InFlightCall {
    api: ApiStep,
    handle: tokio::task::JoinHandle<Result<HttpAnswer, TransportError>>,
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl ScriptedRuntimePeer {
    /// The URL of `call`: placeholders substituted in the path segments and the query
    /// values, the query percent-encoded ([`encode_query`]).
    fn api_url(&self, run: &mut Run, call: &ApiCall) -> StepResult<String> {
        let text = |value: Value| match value {
            Value::String(s) => s,
            other => other.to_string(),
        };
        let mut segments = Vec::new();
        for segment in call.path.split('/') {
            let value = run
                .bindings
                .substitute(&Value::String(segment.to_string()), false)
                .map_err(|e| fail::scenario(format!("cannot build the path: {e}")))?;
            segments.push(text(value));
        }
        let mut url = format!("{}{}", self.base_url, segments.join("/"));
        if let Some(query) = &call.query {
            let mut params = Vec::new();
            for (name, template) in query {
                let value = run
                    .bindings
                    .substitute(&Value::String(template.clone()), false)
                    .map_err(|e| {
                        fail::scenario(format!("cannot build the query parameter `{name}`: {e}"))
                    })?;
                params.push((name.clone(), text(value)));
            }
            url.push('?');
            url.push_str(&encode_query(&params));
        }
        Ok(url)
    }

    /// The credential an `api:` call presents (`credential:`): Core's Project API key
    /// (`api_key`, the default), the device's daemon credential (`daemon`, which is not
    /// a key) or none (`none`: no `Authorization` header).
    fn api_token(&self, call: &ApiCall) -> StepResult<Option<String>> {
        match call.credential.as_deref() {
            None | Some("api_key") => Ok(Some(self.launcher.api_key.clone())),
            Some("daemon") => Ok(Some(self.launcher.credential.clone())),
            Some("none") => Ok(None),
            Some(other) => Err(fail::scenario(format!(
                "api.call.credential is `api_key`, `daemon` or `none`, not `{other}`"
            ))),
        }
    }

    /// Checks and records the final answer of an `api:` call (synchronous or awaited
    /// by `api_result:`).
    fn settle_api(run: &mut Run, api: &ApiStep, answer: &HttpAnswer, polled: bool) -> StepResult {
        let what = format!("api {} {}", api.call.method, api.call.path);
        run.check_secret(&String::from_utf8_lossy(&answer.body), "an API answer")?;
        let answer_value = answer_body(answer);
        let checked = Self::check_answer(run, &what, &api.expect, answer, &answer_value);
        let body = match &api.expect.body {
            Some(pattern) => crate::matcher::mask_unspecified(pattern, &answer_value),
            None => answer_value.clone(),
        };
        let mut record = json!({
            "method": api.call.method,
            "path": api.call.path,
            "status": answer.status,
            "body": body,
        });
        if let Some(query) = &api.call.query {
            record["query"] = json!(query);
        }
        run.record("api response", EntryKind::HttpResponse, record);
        checked.map_err(|mut e| {
            if polled {
                e.message.push_str("\n  (polled until the step deadline)");
            }
            e
        })
    }

    /// `api:` (see the module docs).
    pub(super) async fn call_api(&mut self, run: &mut Run, api: &ApiStep) -> StepResult {
        let url = self.api_url(run, &api.call)?;
        let body = match &api.call.body {
            Some(template) => Some(
                run.bindings
                    .substitute(
                        &crate::matcher::expand_generated(template).map_err(|e| {
                            fail::scenario(format!("cannot build the request body: {e}"))
                        })?,
                        true,
                    )
                    .map_err(|e| fail::scenario(format!("cannot build the request body: {e}")))
                    .and_then(|body| {
                        crate::matcher::expand_text(&body).map_err(|e| {
                            fail::scenario(format!("cannot build the request body: {e}"))
                        })
                    })?
                    .to_string()
                    .into_bytes(),
            ),
            None => None,
        };
        let token = self.api_token(&api.call)?;
        let what = format!("api {} {}", api.call.method, api.call.path);
        run.log_wire(
            "to target",
            "api request",
            &json!({
                "method": api.call.method,
                "path": api.call.path,
                "query": api.call.query,
                "body": body.as_deref().map(|b| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null)),
            }),
        );
        if !api.wait {
            return self.start_api(api, url, body, token);
        }
        let deadline = Instant::now() + run.step_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .http
                .request(
                    &api.call.method,
                    &url,
                    token
                        .as_deref()
                        .map(|t| Auth::with_scheme(api.call.scheme.as_deref(), t)),
                    body.clone(),
                    left,
                )
                .await
                .map_err(|e| fail::transport(format!("{what}: the request failed: {e}")))?;
            // A Turn in a terminal state never leaves it: such an answer is final, and a
            // mismatch fails at once instead of being polled past.
            let retry = api.poll
                && Instant::now() + API_POLL_INTERVAL < deadline
                && Self::peek_mismatch(run, api, &answer)
                && !terminal_turn(&answer);
            if !retry {
                return Self::settle_api(run, api, &answer, api.poll);
            }
            tokio::time::sleep(API_POLL_INTERVAL).await;
        }
    }

    /// Whether `answer` fails `api.expect` (without binding anything).
    fn peek_mismatch(run: &Run, api: &ApiStep, answer: &HttpAnswer) -> bool {
        if answer.status != api.expect.status {
            return true;
        }
        let Some(pattern) = &api.expect.body else {
            return false;
        };
        let mut trial = run.bindings.clone();
        crate::matcher::match_frame(pattern, &answer_body(answer), &mut trial).is_err()
    }

    /// Starts the asynchronous call of an `api: {await: false}` step: the request runs
    /// in its own task (bounded by [`API_ASYNC_CALL_TIMEOUT`]) while the next steps run.
    fn start_api(
        &mut self,
        api: &ApiStep,
        url: String,
        body: Option<Vec<u8>>,
        token: Option<String>,
    ) -> StepResult {
        let Some(id) = api.id.clone() else {
            return Err(fail::scenario(
                "an `api` step with `await: false` needs an `id`",
            ));
        };
        if self.in_flight.contains_key(&id) {
            return Err(fail::scenario(format!(
                "api call `{id}` is already in flight"
            )));
        }
        if self.in_flight.len() >= API_IN_FLIGHT_MAX {
            return Err(fail::scenario(format!(
                "at most {API_IN_FLIGHT_MAX} asynchronous api calls may be in flight at once"
            )));
        }
        let http = self.http.clone();
        let method = api.call.method.clone();
        let scheme = api.call.scheme.clone();
        let handle = tokio::spawn(async move {
            let auth = token
                .as_deref()
                .map(|t| Auth::with_scheme(scheme.as_deref(), t));
            http.request(&method, &url, auth, body, API_ASYNC_CALL_TIMEOUT)
                .await
        });
        self.in_flight.insert(
            id,
            InFlightCall {
                api: api.clone(),
                handle,
            },
        );
        Ok(())
    }

    /// `api_result:` — awaits the answer of the asynchronous call `id` within the step
    /// deadline, then checks and records it like a synchronous `api:` step.
    pub(super) async fn await_api(&mut self, run: &mut Run, id: &str) -> StepResult {
        let Some(mut call) = self.in_flight.remove(id) else {
            return Err(fail::scenario(format!(
                "no asynchronous api call `{id}` is in flight (never started, or already awaited)"
            )));
        };
        let what = format!("api {} {}", call.api.call.method, call.api.call.path);
        let joined = tokio::time::timeout(run.step_timeout, &mut call.handle)
            .await
            .map_err(|_| {
                fail::timeout(format!(
                    "{what} (`{id}`): no answer within {}",
                    show_duration(run.step_timeout)
                ))
            })?;
        let answer = joined
            .map_err(|e| fail::harness(format!("{what} (`{id}`): the request task failed: {e}")))?
            .map_err(|e| fail::transport(format!("{what} (`{id}`): the request failed: {e}")))?;
        Self::settle_api(run, &call.api, &answer, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::model::Step;

    #[test]
    fn a_turn_in_a_terminal_state_is_final_for_a_poll() {
        let answer = |body: &str| HttpAnswer {
            status: 200,
            body: body.as_bytes().to_vec(),
        };
        for state in TERMINAL_TURN_STATES {
            let body = format!(r#"{{"turn_id":"t-1","state":"{state}"}}"#);
            assert!(terminal_turn(&answer(&body)), "{state}");
        }
        for body in [
            r#"{"turn_id":"t-1","state":"running"}"#,
            r#"{"turn_id":"t-1","state":"queued"}"#,
            r#"{"interaction_id":"i-1","state":"completed"}"#,
            r#"not json"#,
        ] {
            assert!(!terminal_turn(&answer(body)), "{body}");
        }
    }

    /// Whether the concrete `path` (placeholders as `$x`, literal IDs) fits the route
    /// `template` (`{name}` matches one segment).
    fn fits(template: &str, path: &str) -> bool {
        let (t, p): (Vec<&str>, Vec<&str>) =
            (template.split('/').collect(), path.split('/').collect());
        t.len() == p.len()
            && t.iter()
                .zip(&p)
                .all(|(t, p)| (t.starts_with('{') && t.ends_with('}')) || t == p)
    }

    #[test]
    fn every_api_route_the_scenarios_call_is_in_the_core_test_contract() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/core-test-contract.md")).unwrap();
        let routes: Vec<(String, String)> = doc
            .lines()
            .filter_map(|line| {
                let cell = line.strip_prefix("| `")?.split('`').next()?;
                let (method, path) = cell.split_once(' ')?;
                Some((method.to_string(), path.to_string()))
            })
            .collect();
        assert!(routes.len() >= 20, "{routes:?}");
        let scenarios =
            crate::scenario::load_family(&root.join("scenarios"), super::super::FAMILY).unwrap();
        let mut missing = Vec::new();
        for scenario in &scenarios {
            let mut steps: Vec<&Step> = scenario.steps.iter().collect();
            while let Some(step) = steps.pop() {
                match step {
                    Step::Reference { steps: inner, .. } => steps.extend(inner),
                    Step::Api(api) => {
                        let listed = routes
                            .iter()
                            .any(|(m, t)| *m == api.call.method && fits(t, &api.call.path));
                        if !listed {
                            missing.push(format!(
                                "{}: {} {}",
                                scenario.id(),
                                api.call.method,
                                api.call.path
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        assert!(
            missing.is_empty(),
            "not in docs/core-test-contract.md:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        let params = [
            ("path".to_string(), "src/a b/ü~x.py".to_string()),
            ("q".to_string(), "a&b=c?#%".to_string()),
        ];
        assert_eq!(
            encode_query(&params),
            "path=src%2Fa%20b%2F%C3%BC~x.py&q=a%26b%3Dc%3F%23%25"
        );
        assert_eq!(encode_query(&[("path".into(), String::new())]), "path=");
    }
}
