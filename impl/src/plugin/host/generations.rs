//! Generations, leases and drain ("Generation lifecycle"): "Candidate activation is
//! atomic and affects future runs only. Starting a run leases the current generation and
//! snapshots its identity/tool definitions. Old processes remain alive until all leases
//! release, then receive bounded drain and shutdown. A failed candidate or drain never
//! mutates the active generation."
//!
//! [`PluginHost::activate`] verifies and launches a candidate, and only once every fact
//! validated swaps it in as the active generation (one lock, one assignment). A
//! [`Lease`] holds its generation (and the snapshot of its tools) for a run; the retired
//! generation is drained when its last lease is released. Each drain's outcome (exit
//! confirmed or not) is kept for [`PluginHost::status`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Mutex as AsyncMutex;

use super::config::PluginConfig;
use super::launch::{Checks, LaunchError, PluginClient, Process, launch_with};
use super::verify::verify;
use crate::plugin::proto::v1::{DrainRequest, ToolDefinition};
use crate::plugin::wire::capability_enforcement;

/// Most drain outcomes kept for status.
pub const DRAIN_HISTORY: usize = 16;

/// One process generation.
#[derive(Debug)]
pub struct Generation {
    /// Its number (1, 2, … in activation order).
    pub id: u64,
    /// The verified digest it runs.
    pub digest: String,
    /// Its tools, as `Initialize` gave them (immutable).
    pub tools: Vec<ToolDefinition>,
    /// The plugin's build identity and manifest, as JSON.
    pub identity: Value,
    /// The client (cheap to clone).
    pub client: PluginClient,
    /// The call bound.
    pub call_timeout: Duration,
    /// The negotiated `max_progress_messages` (the lower of both sides'): a call that
    /// streams more breaks the call's rules.
    pub max_progress_messages: u32,
    process: AsyncMutex<Process>,
    verified: super::verify::Verified,
    leases: AtomicUsize,
    retired: AtomicBool,
    /// Set when a call saw the process gone (crash): future calls go to a restart.
    pub broken: AtomicBool,
}

impl Generation {
    /// Stops the process tree hard (the supervisor kills every descendant); whether its
    /// termination was confirmed.
    pub(super) async fn stop_process(&self) -> bool {
        self.process.lock().await.hard_stop().await
    }

    /// The plugin's output state (stderr tail, contamination).
    pub async fn output(&self) -> Arc<super::launch::Output> {
        self.process.lock().await.output.clone()
    }
}

/// A run's hold on one generation: its tools are the run's snapshot, and the generation
/// stays alive until every lease is released.
#[derive(Debug)]
pub struct Lease {
    generation: Arc<Generation>,
    host: Arc<Inner>,
    /// Released through [`Lease::release`]: dropping it does nothing more.
    released: bool,
}

impl Lease {
    /// The leased generation.
    pub fn generation(&self) -> &Arc<Generation> {
        &self.generation
    }

    /// Releases the lease; when it was the last one of a retired generation, that
    /// generation's drain and shutdown run now and their outcome is returned
    /// (`{generation, drained, termination_confirmed}`).
    pub async fn release(mut self) -> Option<Value> {
        self.released = true;
        let last = self.generation.leases.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.generation.retired.load(Ordering::SeqCst) {
            Some(self.host.drain(self.generation.clone()).await)
        } else {
            None
        }
    }
}

/// Another lease on the same generation (a call made under a run's lease): the
/// generation lives until every clone is dropped too.
impl Clone for Lease {
    fn clone(&self) -> Self {
        self.generation.leases.fetch_add(1, Ordering::SeqCst);
        Self {
            generation: self.generation.clone(),
            host: self.host.clone(),
            released: false,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let last = self.generation.leases.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.generation.retired.load(Ordering::SeqCst) {
            let generation = self.generation.clone();
            let host = self.host.clone();
            tokio::spawn(async move {
                host.drain(generation).await;
            });
        }
    }
}

#[derive(Debug)]
struct Inner {
    config: PluginConfig,
    supervisor: std::path::PathBuf,
    active: Mutex<Option<Arc<Generation>>>,
    next: AtomicU64,
    drains: Mutex<Vec<Value>>,
    activating: AsyncMutex<()>,
    checks: Checks,
}

impl Inner {
    /// Bounded drain and shutdown of a retired generation with no lease left.
    async fn drain(&self, generation: Arc<Generation>) -> Value {
        let mut process = generation.process.lock().await;
        let timeout = self.config.drain_timeout();
        let mut client = process.client.clone();
        // The Drain RPC itself is bounded too: a plugin that never answers it is
        // stopped hard like one that never exits.
        let asked = matches!(
            tokio::time::timeout(
                timeout,
                client.drain(DrainRequest {
                    timeout_ms: self.config.drain_timeout_ms,
                }),
            )
            .await,
            Ok(Ok(_))
        );
        // The plugin exits on its own within its drain timeout; past it (plus a grace)
        // it is stopped hard.
        let exited = asked
            && tokio::time::timeout(timeout + Duration::from_secs(1), process.child.wait())
                .await
                .is_ok();
        let confirmed = exited || process.hard_stop().await;
        let outcome = json!({
            "generation": generation.id,
            "drained": exited,
            "termination_confirmed": confirmed,
        });
        if let Ok(mut drains) = self.drains.lock() {
            if drains.len() == DRAIN_HISTORY {
                drains.remove(0);
            }
            drains.push(outcome.clone());
        }
        outcome
    }
}

/// The plugin host of one configured plugin.
#[derive(Debug, Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

impl PluginHost {
    /// A host for `config`, supervising its processes with `supervisor` (this program).
    pub fn new(config: PluginConfig, supervisor: std::path::PathBuf) -> Self {
        Self::with_checks(config, supervisor, Checks::ALL)
    }

    /// A host for `config` that makes only `checks` of the checks the spec leaves to a
    /// host (another correct host's choices, for the vendor-mode trial).
    pub fn with_checks(
        config: PluginConfig,
        supervisor: std::path::PathBuf,
        checks: Checks,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                supervisor,
                active: Mutex::new(None),
                next: AtomicU64::new(1),
                drains: Mutex::new(Vec::new()),
                activating: AsyncMutex::new(()),
                checks,
            }),
        }
    }

    /// Verifies, launches and validates a candidate, then makes it the active generation
    /// for future leases; the previous one is retired and drained once its leases are
    /// released. Returns the new generation's number.
    ///
    /// # Errors
    /// [`LaunchError`]: the active generation is unchanged.
    pub async fn activate(&self) -> Result<u64, LaunchError> {
        // One candidate at a time: two racing activations each get a generation, in order.
        let _one = self.inner.activating.lock().await;
        let config = &self.inner.config;
        let verified = verify(&config.executable, &config.sha256).map_err(|e| LaunchError {
            code: e.code(),
            message: e.to_string(),
        })?;
        let process =
            launch_with(config, &verified, &self.inner.supervisor, self.inner.checks).await?;
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst);
        let init = &process.initialized;
        let generation = Arc::new(Generation {
            id,
            digest: verified.digest.clone(),
            tools: init.tools.clone(),
            identity: json!({
                "plugin_build": init.plugin_build.as_ref().map(|b| json!({"name": b.name, "version": b.version})),
                "manifest": init.manifest.as_ref().map(|m| json!({"name": m.name, "version": m.version})),
            }),
            client: process.client.clone(),
            call_timeout: config.call_timeout(),
            max_progress_messages: init
                .limits
                .map_or(crate::plugin::wire::MAX_PROGRESS_MESSAGES, |l| {
                    l.max_progress_messages
                }),
            process: AsyncMutex::new(process),
            verified,
            leases: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        });
        let previous = self
            .inner
            .active
            .lock()
            .map_err(|_| LaunchError {
                code: "host_failed",
                message: "state lock poisoned".into(),
            })?
            .replace(generation);
        if let Some(old) = previous {
            old.retired.store(true, Ordering::SeqCst);
            if old.leases.load(Ordering::SeqCst) == 0 {
                self.inner.drain(old).await;
            }
        }
        Ok(id)
    }

    /// Whether a generation is active.
    pub fn is_active(&self) -> bool {
        self.inner.active.lock().is_ok_and(|a| a.is_some())
    }

    /// Leases the active generation for a run (`None`: none is active).
    pub fn lease(&self) -> Option<Lease> {
        let active = self.inner.active.lock().ok()?.clone()?;
        active.leases.fetch_add(1, Ordering::SeqCst);
        Some(Lease {
            generation: active,
            host: self.inner.clone(),
            released: false,
        })
    }

    /// Retires the active generation and drains it once its leases are released (the
    /// host's own shutdown).
    pub async fn shutdown(&self) {
        let active = self.inner.active.lock().ok().and_then(|mut a| a.take());
        if let Some(generation) = active {
            generation.retired.store(true, Ordering::SeqCst);
            if generation.leases.load(Ordering::SeqCst) == 0 {
                self.inner.drain(generation).await;
            }
        }
    }

    /// The host's status: the active generation (number, digest, identity, leases,
    /// drift, stdout contamination, the plugin's process), each approved capability and
    /// whether an enforcing decorator exists ("help/status must state whether an
    /// enforcing decorator exists"), and the last drains' outcomes.
    pub async fn status(&self) -> Value {
        let active = self.inner.active.lock().ok().and_then(|a| a.clone());
        let generation = match &active {
            None => Value::Null,
            Some(g) => {
                let process = g.process.lock().await;
                json!({
                    "generation": g.id,
                    "digest": g.digest,
                    "identity": g.identity,
                    "tools": g.tools.iter().map(|t| json!({"name": t.name, "mutating": t.mutating, "capabilities": t.capabilities})).collect::<Vec<_>>(),
                    "leases": g.leases.load(Ordering::SeqCst),
                    "broken": g.broken.load(Ordering::SeqCst),
                    "supervisor_pid": process.child.id(),
                    "drift": g.verified.drift().map(|d| d.code()),
                    "stdout_contamination": process.output.contaminated(),
                    "stderr_tail": process.output.stderr_text(),
                })
            }
        };
        let capabilities: Vec<Value> = self
            .inner
            .config
            .approved_capabilities
            .iter()
            .map(|c| json!({"capability": c, "enforced": false, "enforcement": capability_enforcement(c)}))
            .collect();
        json!({
            "plugin": self.inner.config.name,
            "executable": self.inner.config.executable,
            "active": generation,
            "capabilities": capabilities,
            "drains": self.inner.drains.lock().map(|d| d.clone()).unwrap_or_default(),
        })
    }
}
