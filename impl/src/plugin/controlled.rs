//! The controlled plugin host (`contract-impl plugin host`, `docs/plugin-host-control.md`):
//! our [`super::host`] driven over a control channel, so that a scripted plugin (the
//! conformance harness, launched by this host as its plugin) can be activated, leased,
//! called, cancelled and retired on cue, and what the host decided read back.
//!
//! * The host connects to [`CONTROL_ENV`], sends [`HELLO_LINE`], then answers one request
//!   per line through the shared [`crate::control`] (framing, argument checks, outcomes of
//!   long operations, `await`).
//! * `configure` records the plugin's configuration (the fields of a configuration
//!   file, [`PluginConfig`]); the next `activate` checks it (a refusal is that
//!   activation's outcome); it can change only while no generation is active.
//! * SIGTERM or the end of the control channel retires every generation (a bounded drain,
//!   then a hard stop) and ends the process.
//!
//! This module maps ops onto [`PluginHost`] and [`Lease`]; it never speaks the plugin wire
//! itself and never decides anything the host does not.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::host::launch::Checks;
use super::host::{CallError, Lease, PluginConfig, PluginHost, ToolOutcome};
use crate::control::{OpError, Ops, Outcomes, bad, required, str_arg};

/// The first line the host sends on the control channel.
pub const HELLO_LINE: &str = r#"{"hello":{"adapter":"plugin-host","protocol":1}}"#;

/// The variable naming the control socket.
pub const CONTROL_ENV: &str = "CONTRACT_PLUGIN_HOST_CONTROL_SOCKET";

/// Leases held by name at once (`lease`); past it `lease` is refused `too_many_leases`.
pub const LEASES_MAX: usize = 64;

/// The configuration keys `configure` takes (those of a configuration file).
const CONFIG_KEYS: &[&str] = &[
    "name",
    "executable",
    "sha256",
    "args",
    "env",
    "approved_capabilities",
    "startup_timeout_ms",
    "call_timeout_ms",
    "drain_timeout_ms",
];

/// The controlled host's state.
struct Controlled {
    supervisor: PathBuf,
    host: Mutex<Option<PluginHost>>,
    /// The configuration `configure` recorded, checked by the next `activate`.
    pending: Mutex<Option<Map<String, Value>>>,
    leases: Mutex<HashMap<String, Lease>>,
    /// Calls running now, by call ID: their cancel trigger.
    running: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    outcomes: Outcomes,
    /// Name refusals and call outcomes differently ([`code_name`]).
    different: bool,
}

/// A stable code as this host reports it: ours, or (`different`) another name for it, as
/// another correct host may choose: the spec fixes the outcomes, not their names.
fn code_name(different: bool, ours: &str) -> String {
    if different {
        format!("host-{}", ours.replace('_', "-"))
    } else {
        ours.to_string()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Controlled {
    fn host(&self) -> Result<PluginHost, OpError> {
        lock(&self.host)
            .clone()
            .ok_or_else(|| OpError::new("not_configured", "`configure` the plugin first"))
    }
}

/// What a call ended with, as the control channel reports it.
fn call_outcome(
    different: bool,
    outcome: Result<ToolOutcome, CallError>,
    progress: Vec<Value>,
) -> Value {
    match outcome {
        Ok(ToolOutcome::Result(output)) => json!({
            "progress": progress,
            "result": serde_json::from_str::<Value>(&output).unwrap_or(Value::String(output)),
        }),
        Ok(ToolOutcome::Failure { code, message }) => json!({
            "progress": progress,
            "failure": {"code": code.as_str_name(), "message": message},
        }),
        Err(e) => {
            let mut error =
                json!({"code": code_name(different, e.code()), "message": e.to_string()});
            match &e {
                CallError::Interrupted { uncertain } => error["uncertain"] = json!(uncertain),
                CallError::Cancelled {
                    acknowledged,
                    confirmed,
                    uncertain,
                } => {
                    error["uncertain"] = json!(uncertain);
                    error["acknowledged"] = json!(acknowledged);
                    error["termination_confirmed"] = json!(confirmed);
                }
                CallError::Violation { rule, .. } => {
                    error["rule"] = json!(code_name(different, rule))
                }
                _ => {}
            }
            json!({"progress": progress, "error": error})
        }
    }
}

impl Ops for Controlled {
    fn allowed(&self, op: &str) -> Option<&'static [&'static str]> {
        Some(match op {
            "configure" => CONFIG_KEYS,
            "activate" | "shutdown" => &["as"],
            "lease" => &["as"],
            "release" => &["lease", "as"],
            "call" => &["tool", "arguments", "call_id", "lease", "as"],
            "cancel" => &["call_id"],
            "status" => &[],
            _ => return None,
        })
    }

    fn outcomes(&self) -> &Outcomes {
        &self.outcomes
    }

    async fn apply(
        self: &Arc<Self>,
        op: &str,
        name: String,
        args: &Map<String, Value>,
    ) -> Result<Value, OpError> {
        match op {
            "configure" => {
                // Recorded now, checked when the next activation starts (as a host
                // checks its configuration file when it loads a plugin).
                let active = lock(&self.host).as_ref().is_some_and(PluginHost::is_active);
                if active {
                    return Err(OpError::new(
                        "already_configured",
                        "a generation is active: the configuration cannot change under it",
                    ));
                }
                *lock(&self.pending) = Some(args.clone());
                Ok(json!({"status": "accepted"}))
            }
            "activate" => {
                let different = self.different;
                let refused = move |code: &str, message: String| json!({"status": "refused", "code": code_name(different, code), "message": message});
                let pending = lock(&self.pending).take();
                let host = match pending {
                    Some(args) => {
                        let config = serde_json::from_value::<PluginConfig>(Value::Object(args))
                            .map_err(|e| ("invalid_config", e.to_string()))
                            .and_then(|c| {
                                c.validate()
                                    .map(|()| c)
                                    .map_err(|e| (e.code(), e.to_string()))
                            });
                        match config {
                            Ok(config) => {
                                // Another correct host need not ask ListTools at activation.
                                let checks = Checks {
                                    list_tools: !self.different,
                                };
                                let host = PluginHost::with_checks(
                                    config,
                                    self.supervisor.clone(),
                                    checks,
                                );
                                *lock(&self.host) = Some(host.clone());
                                host
                            }
                            Err((code, message)) => {
                                let outcome = refused(code, message);
                                return self.outcomes.spawn(name, async move { outcome });
                            }
                        }
                    }
                    None => self.host()?,
                };
                self.outcomes.spawn(name, async move {
                    match host.activate().await {
                        Ok(generation) => json!({"status": "active", "generation": generation}),
                        Err(e) => refused(e.code, e.message),
                    }
                })
            }
            "shutdown" => {
                let host = self.host()?;
                self.outcomes.spawn(name, async move {
                    host.shutdown().await;
                    json!({})
                })
            }
            "lease" => {
                let host = self.host()?;
                let mut leases = lock(&self.leases);
                if leases.len() >= LEASES_MAX && !leases.contains_key(&name) {
                    return Err(OpError::new(
                        "too_many_leases",
                        format!("{LEASES_MAX} leases are held; release some first"),
                    ));
                }
                let lease = host.lease().ok_or_else(|| {
                    OpError::new("no_active_generation", "no generation is active")
                })?;
                let answer = json!({
                    "generation": lease.generation().id,
                    "tools": lease.generation().tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
                });
                leases.insert(name, lease);
                Ok(answer)
            }
            "release" => {
                let lease_name = str_arg(args, "lease")?;
                let lease = lock(&self.leases).remove(lease_name).ok_or_else(|| {
                    OpError::new("unknown_lease", format!("no lease `{lease_name}`"))
                })?;
                self.outcomes
                    .spawn(name, async move { json!({"drain": lease.release().await}) })
            }
            "call" => self.call(name, args),
            "cancel" => {
                let call_id = str_arg(args, "call_id")?;
                let trigger = lock(&self.running).remove(call_id);
                Ok(json!({"cancelled": trigger.is_some_and(|t| t.send(()).is_ok())}))
            }
            "status" => {
                let host = lock(&self.host).clone();
                match host {
                    None => Ok(json!({"active": null, "capabilities": [], "drains": []})),
                    Some(host) => {
                        let mut status = host.status().await;
                        if let Some(Value::String(drift)) = status.pointer("/active/drift") {
                            let renamed = code_name(self.different, drift);
                            status["active"]["drift"] = Value::String(renamed);
                        }
                        Ok(status)
                    }
                }
            }
            other => Err(bad(format!("unknown op `{other}`"))),
        }
    }

    async fn stop(&self) {
        lock(&self.leases).clear();
        let host = lock(&self.host).clone();
        if let Some(host) = host {
            host.shutdown().await;
        }
    }
}

impl Controlled {
    /// `call`: on the named lease, or on a lease of its own for the call's duration.
    fn call(self: &Arc<Self>, name: String, args: &Map<String, Value>) -> Result<Value, OpError> {
        let tool = str_arg(args, "tool")?.to_string();
        let call_id = str_arg(args, "call_id")?.to_string();
        let arguments = required("arguments", args.get("arguments"))?.to_string();
        let lease = match args.get("lease") {
            None => self
                .host()?
                .lease()
                .ok_or_else(|| OpError::new("no_active_generation", "no generation is active"))?,
            Some(_) => {
                let lease_name = str_arg(args, "lease")?;
                let leases = lock(&self.leases);
                let held = leases.get(lease_name).ok_or_else(|| {
                    OpError::new("unknown_lease", format!("no lease `{lease_name}`"))
                })?;
                held.clone()
            }
        };
        let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
        {
            let mut running = lock(&self.running);
            if running.contains_key(&call_id) {
                return Err(OpError::new(
                    "call_running",
                    format!("a call `{call_id}` is running"),
                ));
            }
            running.insert(call_id.clone(), cancel_tx);
        }
        let running = self.running.clone();
        let different = self.different;
        self.outcomes.spawn(name, async move {
            let mut progress = Vec::new();
            let outcome = lease
                .execute(
                    &call_id,
                    &tool,
                    &arguments,
                    |sequence, message| {
                        progress.push(json!({"sequence": sequence, "message": message}));
                    },
                    async {
                        let _ = cancel_rx.await;
                    },
                )
                .await;
            lock(&running).remove(&call_id);
            drop(lease);
            call_outcome(different, outcome, progress)
        })
    }
}

/// Runs the controlled host until the control channel ends or SIGTERM; retires every
/// generation before it returns. Returns the process exit code (0; 2 when it cannot
/// start). `different`: refusals and call outcomes are named otherwise (`host-` and dashes)
/// and activation does not ask `ListTools`, as another correct host may.
pub async fn run(different: bool) -> i32 {
    let socket = match std::env::var(CONTROL_ENV) {
        Ok(s) => s,
        Err(_) => {
            eprintln!("contract-impl plugin host: {CONTROL_ENV} is not set");
            return 2;
        }
    };
    let supervisor = match super::host::launch::this_program() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("contract-impl plugin host: {}", e.message);
            return 2;
        }
    };
    let controlled = Arc::new(Controlled {
        supervisor,
        host: Mutex::new(None),
        pending: Mutex::new(None),
        leases: Mutex::new(HashMap::new()),
        running: Arc::new(Mutex::new(HashMap::new())),
        outcomes: Outcomes::new(),
        different,
    });
    match crate::control::serve(std::path::Path::new(&socket), HELLO_LINE, controlled).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("contract-impl plugin host: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::proto::v1::FailureCode;

    #[test]
    fn outcomes_name_their_kind() {
        let ok = call_outcome(false, Ok(ToolOutcome::Result(r#"{"a":1}"#.into())), vec![]);
        assert_eq!(ok, json!({"progress": [], "result": {"a": 1}}));
        let failed = call_outcome(
            false,
            Ok(ToolOutcome::Failure {
                code: FailureCode::Busy,
                message: "m".into(),
            }),
            vec![json!({"sequence": 1, "message": "x"})],
        );
        assert_eq!(failed["failure"]["code"], "FAILURE_CODE_BUSY");
        let cut = call_outcome(
            true,
            Err(CallError::Interrupted { uncertain: true }),
            vec![],
        );
        assert_eq!(cut["error"]["code"], "host-interrupted");
        assert_eq!(cut["error"]["uncertain"], true);
        let cancelled = call_outcome(
            false,
            Err(CallError::Cancelled {
                acknowledged: false,
                confirmed: false,
                uncertain: false,
            }),
            vec![],
        );
        assert_eq!(cancelled["error"]["termination_confirmed"], false);
    }
}
