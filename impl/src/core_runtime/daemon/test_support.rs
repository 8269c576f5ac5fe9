//! Test support for the daemon's unit tests: a Harness adapter whose native operations
//! succeed at once, and a [`Runtime`] driven frame by frame through
//! [`Runtime::dispatch`] with the outbound queue read directly (no sockets).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::config::{DEFAULT_ENVIRONMENT_ID, RuntimeConfig};
use super::dispatcher::Runtime;
use super::outbound::{OutItem, Outbound, OutboundReceiver};
use crate::core_runtime::adapter::{
    AdapterError, CancelSettlement, HarnessAdapter, NativePrepare, NativeStart, RunEventSink,
};
use crate::core_runtime::wire::{
    AgentKindDeclaration, CallId, ExecutorId, InputId, InteractionId, MessageInput,
    PermissionVerdict, PromptForUserChoiceDecision, RunId,
};
use crate::core_runtime::workspace::Workspace;

/// A Harness adapter whose every native operation succeeds immediately.
#[derive(Debug, Default)]
pub struct InstantAdapter;

#[async_trait]
impl HarnessAdapter for InstantAdapter {
    fn declarations(&self) -> Vec<AgentKindDeclaration> {
        Vec::new()
    }
    async fn prepare(&self, _: NativePrepare) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn start(&self, _: NativeStart, _: RunEventSink) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn write_input(
        &self,
        _: &RunId,
        _: &InputId,
        _: &[MessageInput],
    ) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn cancel(&self, _: &RunId) -> Result<CancelSettlement, AdapterError> {
        Ok(CancelSettlement::Stopped)
    }
    async fn resolve_permission(
        &self,
        _: &RunId,
        _: &InteractionId,
        _: PermissionVerdict,
    ) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn resolve_user_choice(
        &self,
        _: &RunId,
        _: &InteractionId,
        _: &PromptForUserChoiceDecision,
    ) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn function_result(
        &self,
        _: &RunId,
        _: &CallId,
        _: &str,
        _: bool,
    ) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn close_executor(&self, _: &ExecutorId) -> Result<(), AdapterError> {
        Ok(())
    }
}

/// A daemon on a temporary workspace with one open connection whose outbound queue the
/// test reads.
pub struct Harness {
    /// The service.
    pub rt: Arc<Runtime>,
    /// The connection generation.
    pub generation: u64,
    /// The connection's queue.
    pub out: Outbound,
    /// The writer's end of the queue (the test plays the writer).
    pub rx: OutboundReceiver,
    /// The workspace directory (removed on drop).
    pub dir: tempfile::TempDir,
}

impl Harness {
    /// A daemon with the default configuration and an outbound budget of `budget`
    /// bytes.
    pub async fn start(budget: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::new(dir.path()).unwrap();
        let rt = Runtime::start(
            RuntimeConfig::default(),
            Arc::new(InstantAdapter),
            workspace,
        );
        let (out, rx) = Outbound::with_budget(budget);
        let generation = rt.connection_opened(out.clone()).await;
        Self {
            rt,
            generation,
            out,
            rx,
            dir,
        }
    }

    /// Dispatches one frame from Core.
    pub async fn core(&self, frame: Value) {
        let text = serde_json::to_vec(&frame).unwrap();
        self.rt.dispatch(self.generation, &text).await.unwrap();
    }

    /// The next frame the daemon queued, as JSON (its queue bytes released).
    pub async fn next(&mut self) -> Value {
        let queued = self.rx.recv().await.expect("the queue is open");
        match &queued.item {
            OutItem::Text(text, _) => serde_json::from_str(text).unwrap(),
            OutItem::Close(code, reason) => panic!("unexpected Close {code} {reason}"),
        }
    }

    /// Prepares an admission handle (`execution_prepare` → `preparing` → `ready`) and
    /// returns it.
    pub async fn ready_handle(&mut self, request_id: &str) -> String {
        self.core(json!({
            "type": "execution_prepare",
            "id": request_id,
            "payload": {
                "session_id": "5e55a000-0000-4000-8000-00000000000a",
                "agent_kind": "controlled",
                "configuration": {
                    "agent_options": { "model": "model-a", "system_prompt": "Be brief." },
                    "execution_controls": {
                        "web_search": "disabled",
                        "text_verbosity": "medium",
                        "programmatic_tool_calling": "disabled"
                    },
                    "disable_subagents": true,
                    "local_environment": {
                        "environment_id": DEFAULT_ENVIRONMENT_ID,
                        "environment_type": "self_hosted"
                    }
                }
            }
        }))
        .await;
        let preparing = self.next().await;
        assert_eq!(preparing["payload"]["status"], "preparing", "{preparing}");
        let ready = self.next().await;
        assert_eq!(ready["payload"]["status"], "ready", "{ready}");
        ready["payload"]["admission_handle"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A `workspace_read` frame of `handle` with `extra` payload fields.
    pub fn read(id: &str, handle: &str, extra: Value) -> Value {
        let mut payload = json!({
            "target": { "admission_handle": handle },
            "environment_id": DEFAULT_ENVIRONMENT_ID,
        });
        for (k, v) in extra.as_object().unwrap() {
            payload[k] = v.clone();
        }
        json!({ "type": "workspace_read", "id": id, "payload": payload })
    }
}
