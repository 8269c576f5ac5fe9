//! `AgentKindCapabilities` ("Capability declarations").
//!
//! Every field is a required JSON boolean: `false` must be written, an omitted,
//! `null` or unknown field is a decode error, and there is no default for a future
//! field. [`AgentKindCapabilities::FIELDS`] enumerates the fields one by one so
//! contract tests can walk them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ids::AgentKind;

/// Capability declaration of one Runtime + Harness combination, independent of
/// `available` and of Core's engine profile ("Capability declarations").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentKindCapabilities {
    /// `streaming`: always required for every execution on the Harness.
    pub streaming: bool,
    /// `steering`: always required for every execution on the Harness.
    pub steering: bool,
    /// `durable_turns`: always required for every execution on the Harness.
    pub durable_turns: bool,
    /// `durable_input_receipts`: always required for every execution on the Harness.
    pub durable_input_receipts: bool,
    /// `preparation`: always required for every execution on the Harness.
    pub preparation: bool,
    /// `execution_controls`: always required for every execution on the Harness.
    pub execution_controls: bool,
    /// `tool_observations`: always required for every execution on the Harness.
    pub tool_observations: bool,
    /// `environment_none`: required when the Environment type is `none`.
    pub environment_none: bool,
    /// `local_environment`: required when the Environment type is `openai_hosted` or `self_hosted`.
    pub local_environment: bool,
    /// `workspace_read_preparation`: required for hosted/self-hosted Environments and for idle Files directory reads (read-only preparation).
    pub workspace_read_preparation: bool,
    /// `workspace_output_export`: required when the Environment type is `openai_hosted` or `self_hosted`.
    pub workspace_output_export: bool,
    /// `native_session_recovery`: required when the Session has started Turns but recorded no native Session ID.
    pub native_session_recovery: bool,
    /// `web_search_control`: required when the Harness's engine profile declares that control.
    pub web_search_control: bool,
    /// `text_verbosity`: required when the Harness's engine profile declares that control.
    pub text_verbosity: bool,
    /// `structured_output`: required (with `message_items`) when the Agent requests `json_schema` output.
    pub structured_output: bool,
    /// `message_items`: required (with `structured_output`) when the Agent requests `json_schema` output.
    pub message_items: bool,
    /// `subagent_observations`: required when `multi_agent.enabled` is true.
    pub subagent_observations: bool,
    /// `subagent_control`: required when `multi_agent.enabled` is false.
    pub subagent_control: bool,
    /// `tool_search`: required when the Agent enables tool search or deferred function loading.
    pub tool_search: bool,
    /// `programmatic_tool_calling_disable`: required when the Agent explicitly disables programmatic tool calling.
    pub programmatic_tool_calling_disable: bool,
    /// `function_tools`: required when the Agent declares a function tool.
    pub function_tools: bool,
    /// `message_images`: required when a message carries images.
    pub message_images: bool,
    /// `function_result_images`: required when a function result carries images.
    pub function_result_images: bool,
    /// `mcp_http_tools`: required when the Agent declares an HTTP MCP server.
    pub mcp_http_tools: bool,
    /// `mcp_http_required`: required when one declared HTTP MCP server is required.
    pub mcp_http_required: bool,
    /// `mcp_http_bearer_auth`: required when one declared HTTP MCP server uses a Vault credential.
    pub mcp_http_bearer_auth: bool,
    /// `permissions`: governs permission decisions inside the Runtime; no Core admission rule.
    pub permissions: bool,
    /// `usage`: no Core admission rule.
    pub usage: bool,
    /// `resume`: no Core admission rule.
    pub resume: bool,
}

impl AgentKindCapabilities {
    /// The wire names of every capability field, in declaration order.
    pub const FIELDS: [&'static str; 29] = [
        "streaming",
        "steering",
        "durable_turns",
        "durable_input_receipts",
        "preparation",
        "execution_controls",
        "tool_observations",
        "environment_none",
        "local_environment",
        "workspace_read_preparation",
        "workspace_output_export",
        "native_session_recovery",
        "web_search_control",
        "text_verbosity",
        "structured_output",
        "message_items",
        "subagent_observations",
        "subagent_control",
        "tool_search",
        "programmatic_tool_calling_disable",
        "function_tools",
        "message_images",
        "function_result_images",
        "mcp_http_tools",
        "mcp_http_required",
        "mcp_http_bearer_auth",
        "permissions",
        "usage",
        "resume",
    ];

    /// A declaration with every capability set to `value`.
    pub const fn all(value: bool) -> Self {
        Self {
            streaming: value,
            steering: value,
            durable_turns: value,
            durable_input_receipts: value,
            preparation: value,
            execution_controls: value,
            tool_observations: value,
            environment_none: value,
            local_environment: value,
            workspace_read_preparation: value,
            workspace_output_export: value,
            native_session_recovery: value,
            web_search_control: value,
            text_verbosity: value,
            structured_output: value,
            message_items: value,
            subagent_observations: value,
            subagent_control: value,
            tool_search: value,
            programmatic_tool_calling_disable: value,
            function_tools: value,
            message_images: value,
            function_result_images: value,
            mcp_http_tools: value,
            mcp_http_required: value,
            mcp_http_bearer_auth: value,
            permissions: value,
            usage: value,
            resume: value,
        }
    }

    /// The value of the capability named `field` (a wire name), if it exists.
    pub fn get(&self, field: &str) -> Option<bool> {
        Some(match field {
            "streaming" => self.streaming,
            "steering" => self.steering,
            "durable_turns" => self.durable_turns,
            "durable_input_receipts" => self.durable_input_receipts,
            "preparation" => self.preparation,
            "execution_controls" => self.execution_controls,
            "tool_observations" => self.tool_observations,
            "environment_none" => self.environment_none,
            "local_environment" => self.local_environment,
            "workspace_read_preparation" => self.workspace_read_preparation,
            "workspace_output_export" => self.workspace_output_export,
            "native_session_recovery" => self.native_session_recovery,
            "web_search_control" => self.web_search_control,
            "text_verbosity" => self.text_verbosity,
            "structured_output" => self.structured_output,
            "message_items" => self.message_items,
            "subagent_observations" => self.subagent_observations,
            "subagent_control" => self.subagent_control,
            "tool_search" => self.tool_search,
            "programmatic_tool_calling_disable" => self.programmatic_tool_calling_disable,
            "function_tools" => self.function_tools,
            "message_images" => self.message_images,
            "function_result_images" => self.function_result_images,
            "mcp_http_tools" => self.mcp_http_tools,
            "mcp_http_required" => self.mcp_http_required,
            "mcp_http_bearer_auth" => self.mcp_http_bearer_auth,
            "permissions" => self.permissions,
            "usage" => self.usage,
            "resume" => self.resume,
            _ => return None,
        })
    }

    /// Sets the capability named `field`; returns `false` if no such field exists (the
    /// unit tests' way to turn one capability off; no wire path sets capabilities by name).
    #[cfg(test)]
    pub fn set(&mut self, field: &str, value: bool) -> bool {
        match field {
            "streaming" => self.streaming = value,
            "steering" => self.steering = value,
            "durable_turns" => self.durable_turns = value,
            "durable_input_receipts" => self.durable_input_receipts = value,
            "preparation" => self.preparation = value,
            "execution_controls" => self.execution_controls = value,
            "tool_observations" => self.tool_observations = value,
            "environment_none" => self.environment_none = value,
            "local_environment" => self.local_environment = value,
            "workspace_read_preparation" => self.workspace_read_preparation = value,
            "workspace_output_export" => self.workspace_output_export = value,
            "native_session_recovery" => self.native_session_recovery = value,
            "web_search_control" => self.web_search_control = value,
            "text_verbosity" => self.text_verbosity = value,
            "structured_output" => self.structured_output = value,
            "message_items" => self.message_items = value,
            "subagent_observations" => self.subagent_observations = value,
            "subagent_control" => self.subagent_control = value,
            "tool_search" => self.tool_search = value,
            "programmatic_tool_calling_disable" => self.programmatic_tool_calling_disable = value,
            "function_tools" => self.function_tools = value,
            "message_images" => self.message_images = value,
            "function_result_images" => self.function_result_images = value,
            "mcp_http_tools" => self.mcp_http_tools = value,
            "mcp_http_required" => self.mcp_http_required = value,
            "mcp_http_bearer_auth" => self.mcp_http_bearer_auth = value,
            "permissions" => self.permissions = value,
            "usage" => self.usage = value,
            "resume" => self.resume = value,
            _ => return false,
        }
        true
    }
}

/// One entry of `heartbeat.supported_agent_kinds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentKindDeclaration {
    /// The agent kind this declaration describes.
    pub agent_kind: AgentKind,
    /// Whether the Harness is available now; independent of the capabilities.
    pub available: bool,
    /// The complete capability declaration (required even when unavailable).
    pub capabilities: AgentKindCapabilities,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::decode_strict;

    fn full_json(skip: Option<&str>, extra: Option<&str>) -> String {
        let mut parts: Vec<String> = AgentKindCapabilities::FIELDS
            .iter()
            .filter(|f| Some(**f) != skip)
            .map(|f| format!("\"{f}\":false"))
            .collect();
        if let Some(e) = extra {
            parts.push(e.to_string());
        }
        format!("{{{}}}", parts.join(","))
    }

    #[test]
    fn every_field_round_trips_one_by_one() {
        for field in AgentKindCapabilities::FIELDS {
            let mut caps = AgentKindCapabilities::all(false);
            assert!(caps.set(field, true));
            let json = serde_json::to_string(&caps).unwrap();
            let back: AgentKindCapabilities = decode_strict(json.as_bytes()).unwrap();
            assert_eq!(back.get(field), Some(true), "{field}");
            assert_eq!(
                AgentKindCapabilities::FIELDS
                    .iter()
                    .filter(|f| back.get(f) == Some(true))
                    .count(),
                1
            );
        }
    }

    #[test]
    fn omitted_null_and_unknown_fields_are_rejected() {
        for field in AgentKindCapabilities::FIELDS {
            let err =
                decode_strict::<AgentKindCapabilities>(full_json(Some(field), None).as_bytes())
                    .unwrap_err();
            assert_eq!(err.code(), "missing_field", "{field}");
            let with_null = full_json(Some(field), Some(&format!("\"{field}\":null")));
            assert_eq!(
                decode_strict::<AgentKindCapabilities>(with_null.as_bytes())
                    .unwrap_err()
                    .code(),
                "null_value"
            );
        }
        let err = decode_strict::<AgentKindCapabilities>(
            full_json(None, Some("\"teleport\":true")).as_bytes(),
        )
        .unwrap_err();
        assert_eq!(err.code(), "unknown_field");
    }
}
