//! Admission decisions of Core, I/O-free ("Capability declarations").
//!
//! * [`AgentDefinition`]: the public Agent shape (validated once at the API edge).
//! * [`CAPABILITY_TABLE`]: the spec's capability table as data, one [`CapabilityRule`]
//!   per row; [`check_admission`] applies it at device selection and again in the final
//!   check before claiming a Turn.
//! * [`execution_configuration`]: the `execution_prepare` configuration with exactly
//!   the opt-ins of the spec's opt-in table.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::core_runtime::store::EnvironmentKind;
use crate::core_runtime::wire::{
    AgentKindCapabilities, AgentKindDeclaration, ConnectionOrigin, EnvironmentType,
    ExecutionConfiguration, ExecutionControls, LocalEnvironment, McpHttpServer, NativeSessionId,
    NativeSessionRef, OutputFormat, ProgrammaticToolCalling, TextVerbosity, Uuid, WebSearch,
};
use crate::wire::bounded::{BoundedString, BoundedVec};

/// Bound on function tools one Agent declares.
pub const FUNCTION_TOOLS_MAX: usize = 128;

/// The `connection_origin` Core freezes when an Agent's MCP server names none ("MCP
/// connection permissions": "Core freezes the public default before dispatch"). Our
/// Core relays no connections, so the default is `runtime_direct`.
pub const DEFAULT_CONNECTION_ORIGIN: ConnectionOrigin = ConnectionOrigin::RuntimeDirect;

/// `x_agents_core` extension block of an Agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XAgentsCore {
    /// Opaque Harness configuration forwarded as `agent_options.harness_config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_config: Option<Value>,
}

/// Structured output request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// `json_schema` output (requires `structured_output` and `message_items`).
    pub json_schema: JsonSchemaSpec,
}

/// A named JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaSpec {
    /// Schema name (≤ 128 bytes).
    pub name: BoundedString<128>,
    /// The schema (a JSON object).
    pub schema: Map<String, Value>,
}

/// `multi_agent` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiAgent {
    /// Whether subagents are enabled.
    pub enabled: bool,
}

/// Kind of a tool declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolType {
    /// A function tool answered through `function_call` / `function_result`.
    Function,
}

/// One declared tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Tool type.
    #[serde(rename = "type")]
    pub kind: ToolType,
    /// Function name.
    pub name: BoundedString<128>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<BoundedString<4096>>,
    /// JSON Schema of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
}

/// One public HTTP MCP server of an Agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// Server name.
    pub name: BoundedString<128>,
    /// Server URL.
    pub url: BoundedString<2048>,
    /// Whether the server is required.
    #[serde(default)]
    pub required: bool,
    /// Vault credential reference (bearer auth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_credential_ref: Option<BoundedString<256>>,
    /// `core_relay` or `runtime_direct`; frozen to [`DEFAULT_CONNECTION_ORIGIN`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_origin: Option<ConnectionOrigin>,
}

/// The public Agent definition (`POST /v1/agents`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// The Harness (agent kind) that runs this Agent.
    pub agent_kind: crate::core_runtime::wire::AgentKind,
    /// Model name.
    pub model: BoundedString<256>,
    /// System prompt.
    pub system_prompt: BoundedString<65536>,
    /// Model provider, frozen into Sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_provider: Option<BoundedString<256>>,
    /// Extension block (`harness_config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_agents_core: Option<XAgentsCore>,
    /// Structured output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
    /// Subagents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_agent: Option<MultiAgent>,
    /// Function tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<BoundedVec<ToolSpec, FUNCTION_TOOLS_MAX>>,
    /// Tool search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_search: Option<bool>,
    /// Deferred function loading (needs `tool_search`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred_function_loading: Option<bool>,
    /// `disabled` = the Agent explicitly disables programmatic tool calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programmatic_tool_calling: Option<ProgrammaticToolCalling>,
    /// Text verbosity (default `medium`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_verbosity: Option<TextVerbosity>,
    /// HTTP MCP servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers:
        Option<BoundedVec<McpServerSpec, { crate::core_runtime::wire::limits::MCP_SERVERS_MAX }>>,
}

impl AgentDefinition {
    /// Whether subagents are enabled (`multi_agent.enabled`, default false).
    pub fn multi_agent_enabled(&self) -> bool {
        self.multi_agent.is_some_and(|m| m.enabled)
    }

    /// The definition with every MCP `connection_origin` frozen.
    pub fn frozen(mut self) -> Self {
        if let Some(servers) = self.mcp_servers.take() {
            let servers: Vec<McpServerSpec> = servers
                .into_inner()
                .into_iter()
                .map(|mut s| {
                    s.connection_origin.get_or_insert(DEFAULT_CONNECTION_ORIGIN);
                    s
                })
                .collect();
            self.mcp_servers = BoundedVec::new(servers).ok();
        }
        self
    }
}

/// The Harness's engine profile: which optional controls it declares (Core config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineProfile {
    /// The profile declares the web search control.
    #[serde(default)]
    pub web_search_control: bool,
    /// The profile declares the text verbosity control.
    #[serde(default)]
    pub text_verbosity: bool,
}

/// Everything the capability table looks at, for one admission decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionContext {
    /// Environment type of the Session.
    pub environment: Option<EnvironmentKind>,
    /// An idle Files directory read needs read-only preparation.
    pub idle_directory_read: bool,
    /// The Session has started Turns but recorded no native Session ID.
    pub needs_native_session_recovery: bool,
    /// The Harness's engine profile.
    pub profile: EngineProfile,
    /// The Agent requests `json_schema` output.
    pub json_schema_output: bool,
    /// `multi_agent.enabled`.
    pub multi_agent_enabled: bool,
    /// Tool search or deferred function loading.
    pub tool_search: bool,
    /// The Agent explicitly disables programmatic tool calling.
    pub disables_programmatic_tool_calling: bool,
    /// The Agent declares a function tool.
    pub function_tools: bool,
    /// A message carries images.
    pub message_images: bool,
    /// A function result carries images.
    pub function_result_images: bool,
    /// The Agent declares an HTTP MCP server.
    pub mcp_http: bool,
    /// One declared HTTP MCP server is required.
    pub mcp_http_required: bool,
    /// One declared HTTP MCP server uses a Vault credential.
    pub mcp_http_bearer: bool,
}

impl AdmissionContext {
    /// The context of a Turn execution of `agent` in an Environment of type `env`.
    pub fn for_execution(
        agent: &AgentDefinition,
        env: EnvironmentKind,
        profile: EngineProfile,
        needs_native_session_recovery: bool,
        message_images: bool,
    ) -> Self {
        let servers: &[McpServerSpec] = agent.mcp_servers.as_deref().unwrap_or(&[]);
        Self {
            environment: Some(env),
            idle_directory_read: false,
            needs_native_session_recovery,
            profile,
            json_schema_output: agent.output.is_some(),
            multi_agent_enabled: agent.multi_agent_enabled(),
            tool_search: agent.tool_search == Some(true)
                || agent.deferred_function_loading == Some(true),
            disables_programmatic_tool_calling: agent.programmatic_tool_calling
                == Some(ProgrammaticToolCalling::Disabled),
            function_tools: agent
                .tools
                .as_deref()
                .is_some_and(|t| t.iter().any(|t| t.kind == ToolType::Function)),
            message_images,
            function_result_images: false,
            mcp_http: !servers.is_empty(),
            mcp_http_required: servers.iter().any(|s| s.required),
            mcp_http_bearer: servers.iter().any(|s| s.bearer_credential_ref.is_some()),
        }
    }
}

/// One row of the spec's capability table.
#[derive(Debug, Clone, Copy)]
pub struct CapabilityRule {
    /// Capabilities the row requires (wire names).
    pub capabilities: &'static [&'static str],
    /// The spec's "when Core requires it" text.
    pub when: &'static str,
    /// Whether the row applies to a context.
    pub applies: fn(&AdmissionContext) -> bool,
}

/// The capability table of "Capability declarations", one entry per row, in order.
pub const CAPABILITY_TABLE: &[CapabilityRule] = &[
    CapabilityRule {
        capabilities: &[
            "streaming",
            "steering",
            "durable_turns",
            "durable_input_receipts",
            "preparation",
            "execution_controls",
            "tool_observations",
        ],
        when: "always, for every execution on that Harness",
        applies: |c| c.environment.is_some(),
    },
    CapabilityRule {
        capabilities: &["environment_none"],
        when: "Environment type is none",
        applies: |c| c.environment == Some(EnvironmentKind::None),
    },
    CapabilityRule {
        capabilities: &[
            "local_environment",
            "workspace_read_preparation",
            "workspace_output_export",
        ],
        when: "Environment type is openai_hosted or self_hosted",
        applies: |c| {
            matches!(
                c.environment,
                Some(EnvironmentKind::OpenaiHosted | EnvironmentKind::SelfHosted)
            )
        },
    },
    CapabilityRule {
        capabilities: &["workspace_read_preparation"],
        when: "an idle Files directory read needs read-only preparation",
        applies: |c| c.idle_directory_read,
    },
    CapabilityRule {
        capabilities: &["native_session_recovery"],
        when: "the Session has started Turns but recorded no native Session ID",
        applies: |c| c.needs_native_session_recovery,
    },
    CapabilityRule {
        capabilities: &["web_search_control"],
        when: "the Harness's engine profile declares that control",
        applies: |c| c.profile.web_search_control,
    },
    CapabilityRule {
        capabilities: &["text_verbosity"],
        when: "the Harness's engine profile declares that control",
        applies: |c| c.profile.text_verbosity,
    },
    CapabilityRule {
        capabilities: &["structured_output", "message_items"],
        when: "the Agent requests json_schema output",
        applies: |c| c.json_schema_output,
    },
    CapabilityRule {
        capabilities: &["subagent_observations"],
        when: "multi_agent.enabled is true",
        applies: |c| c.environment.is_some() && c.multi_agent_enabled,
    },
    CapabilityRule {
        capabilities: &["subagent_control"],
        when: "multi_agent.enabled is false",
        applies: |c| c.environment.is_some() && !c.multi_agent_enabled,
    },
    CapabilityRule {
        capabilities: &["tool_search"],
        when: "the Agent enables tool search or deferred function loading",
        applies: |c| c.tool_search,
    },
    CapabilityRule {
        capabilities: &["programmatic_tool_calling_disable"],
        when: "the Agent explicitly disables programmatic tool calling",
        applies: |c| c.disables_programmatic_tool_calling,
    },
    CapabilityRule {
        capabilities: &["function_tools"],
        when: "the Agent declares a function tool",
        applies: |c| c.function_tools,
    },
    CapabilityRule {
        capabilities: &["message_images"],
        when: "a message carries images",
        applies: |c| c.message_images,
    },
    CapabilityRule {
        capabilities: &["function_result_images"],
        when: "a function result carries images",
        applies: |c| c.function_result_images,
    },
    CapabilityRule {
        capabilities: &["mcp_http_tools"],
        when: "the Agent declares an HTTP MCP server",
        applies: |c| c.mcp_http,
    },
    CapabilityRule {
        capabilities: &["mcp_http_required"],
        when: "one declared HTTP MCP server is required",
        applies: |c| c.mcp_http_required,
    },
    CapabilityRule {
        capabilities: &["mcp_http_bearer_auth"],
        when: "one declared HTTP MCP server uses a Vault credential",
        applies: |c| c.mcp_http_bearer,
    },
];

/// Why a declaration does not admit a context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionRefusal {
    /// The agent kind is declared unavailable.
    #[error("agent kind is declared unavailable")]
    Unavailable,
    /// A required capability is unsupported.
    #[error("capability `{capability}` is required when {when}")]
    Missing {
        /// The capability (wire name).
        capability: &'static str,
        /// The table row's condition.
        when: &'static str,
    },
}

impl AdmissionRefusal {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            AdmissionRefusal::Unavailable => "agent_unavailable",
            AdmissionRefusal::Missing { .. } => "unsupported_capability",
        }
    }
}

/// Every capability a context requires, with the row that requires it.
pub fn required_capabilities(ctx: &AdmissionContext) -> Vec<(&'static str, &'static str)> {
    CAPABILITY_TABLE
        .iter()
        .filter(|rule| (rule.applies)(ctx))
        .flat_map(|rule| rule.capabilities.iter().map(move |c| (*c, rule.when)))
        .collect()
}

/// Applies the capability table to one declaration: the check at device selection and
/// the final check before claiming a Turn.
///
/// # Errors
/// [`AdmissionRefusal`] naming the first unsupported capability in table order.
pub fn check_admission(
    decl: &AgentKindDeclaration,
    ctx: &AdmissionContext,
) -> Result<(), AdmissionRefusal> {
    if !decl.available {
        return Err(AdmissionRefusal::Unavailable);
    }
    check_capabilities(&decl.capabilities, ctx)
}

/// The outcome of device selection ([`select_device`]).
#[derive(Debug, PartialEq)]
pub enum DeviceChoice<T> {
    /// This device's declaration admits the work.
    Admit(T, AgentKindDeclaration),
    /// No device admits it and at least one declares the kind available but refuses it:
    /// the work fails with this refusal (never another Harness).
    Refuse(AdmissionRefusal),
    /// No device declares the kind available: the work stays queued.
    Wait,
}

/// Device selection (docs/core-api.md, "Execution semantics"): the `candidates` are the
/// connected devices' declarations of the agent kind, in device-ID order. The first
/// whose declaration admits `ctx` is chosen; when none does, the refusal of the first
/// (lowest device ID) that declares the kind available and refuses is the outcome, so
/// the same devices always give the same answer; a kind declared unavailable everywhere
/// (or not declared) waits.
pub fn select_device<T>(
    candidates: impl IntoIterator<Item = (T, AgentKindDeclaration)>,
    ctx: &AdmissionContext,
) -> DeviceChoice<T> {
    let mut refusal = None;
    for (device, decl) in candidates {
        match check_admission(&decl, ctx) {
            Ok(()) => return DeviceChoice::Admit(device, decl),
            Err(AdmissionRefusal::Unavailable) => {}
            Err(r) => refusal = refusal.or(Some(r)),
        }
    }
    refusal.map_or(DeviceChoice::Wait, DeviceChoice::Refuse)
}

/// The capability part of [`check_admission`].
///
/// # Errors
/// [`AdmissionRefusal::Missing`].
pub fn check_capabilities(
    caps: &AgentKindCapabilities,
    ctx: &AdmissionContext,
) -> Result<(), AdmissionRefusal> {
    for (capability, when) in required_capabilities(ctx) {
        if caps.get(capability) != Some(true) {
            return Err(AdmissionRefusal::Missing { capability, when });
        }
    }
    Ok(())
}

/// The immutable `execution_prepare` configuration of the opt-in table.
///
/// `environment_id` is the Session's Environment; `native_session` the Session's
/// recorded native Session ID (sets `require_existing_native_session`).
pub fn execution_configuration(
    agent: &AgentDefinition,
    env: EnvironmentKind,
    environment_id: &Uuid,
    caps: &AgentKindCapabilities,
    native_session: Option<&NativeSessionId>,
) -> ExecutionConfiguration {
    let mut options = Map::new();
    options.insert("model".into(), Value::String(agent.model.to_string()));
    options.insert(
        "system_prompt".into(),
        Value::String(agent.system_prompt.to_string()),
    );
    if let Some(provider) = &agent.model_provider {
        options.insert("model_provider".into(), Value::String(provider.to_string()));
    }
    if let Some(config) = agent
        .x_agents_core
        .as_ref()
        .and_then(|x| x.harness_config.clone())
    {
        options.insert("harness_config".into(), config);
    }
    let output_format = agent.output.as_ref().map(|o| OutputFormat::JsonSchema {
        name: o.json_schema.name.clone(),
        schema: Value::Object(o.json_schema.schema.clone()),
    });
    let multi = agent.multi_agent_enabled();
    let local = !matches!(env, EnvironmentKind::None);
    let mcp = agent.mcp_servers.as_ref().map(|servers| {
        let list: Vec<McpHttpServer> = servers
            .iter()
            .map(|s| McpHttpServer {
                name: s.name.clone(),
                url: s.url.clone(),
                required: s.required,
                bearer_credential_ref: s.bearer_credential_ref.clone(),
                connection_origin: Some(
                    BoundedString::new(
                        match s.connection_origin.unwrap_or(DEFAULT_CONNECTION_ORIGIN) {
                            ConnectionOrigin::CoreRelay => "core_relay",
                            ConnectionOrigin::RuntimeDirect => "runtime_direct",
                        },
                    )
                    .expect("constant fits"),
                ),
            })
            .collect();
        BoundedVec::new(list).expect("bounded by the Agent definition")
    });
    ExecutionConfiguration {
        agent_options: Some(options),
        execution_controls: Some(ExecutionControls {
            web_search: WebSearch::Disabled,
            text_verbosity: agent.text_verbosity.unwrap_or(TextVerbosity::Medium),
            programmatic_tool_calling: ProgrammaticToolCalling::Disabled,
            output_format,
        }),
        observe_messages: caps.message_items.then_some(true),
        observe_subagent_identities: multi.then_some(true),
        disable_subagents: (!multi).then_some(true),
        disable_execution_environment: (!local).then_some(true),
        local_environment: local.then(|| LocalEnvironment {
            environment_id: environment_id.clone(),
            environment_type: match env {
                EnvironmentKind::OpenaiHosted => EnvironmentType::OpenaiHosted,
                _ => EnvironmentType::SelfHosted,
            },
        }),
        require_existing_native_session: native_session.map(|id| NativeSessionRef {
            native_session_id: id.clone(),
        }),
        mcp_servers: mcp.filter(|m| !m.is_empty()),
        workspace_read_only: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::wire::AgentKind;

    fn agent() -> AgentDefinition {
        crate::wire::decode_strict(
            br#"{"agent_kind":"controlled","model":"m","system_prompt":"p"}"#,
        )
        .unwrap()
    }

    fn base() -> AdmissionContext {
        AdmissionContext::for_execution(
            &agent(),
            EnvironmentKind::SelfHosted,
            EngineProfile::default(),
            false,
            false,
        )
    }

    fn decl(caps: AgentKindCapabilities) -> AgentKindDeclaration {
        AgentKindDeclaration {
            agent_kind: AgentKind::new("controlled").unwrap(),
            available: true,
            capabilities: caps,
        }
    }

    /// Asserts that `ctx` requires exactly `fields` beyond `base`, by turning each off.
    fn row_requires(ctx: AdmissionContext, fields: &[&str]) {
        assert!(check_admission(&decl(AgentKindCapabilities::all(true)), &ctx).is_ok());
        for field in fields {
            let mut caps = AgentKindCapabilities::all(true);
            caps.set(field, false);
            match check_admission(&decl(caps), &ctx) {
                Err(AdmissionRefusal::Missing { capability, .. }) => assert_eq!(capability, *field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn device_selection_takes_the_first_admitting_device_else_the_first_refusal() {
        let refusing = |field: &str| {
            let mut caps = AgentKindCapabilities::all(true);
            caps.set(field, false);
            decl(caps)
        };
        let unavailable = AgentKindDeclaration {
            available: false,
            ..decl(AgentKindCapabilities::all(true))
        };
        let missing = |capability: &'static str| {
            let Err(AdmissionRefusal::Missing { when, .. }) =
                check_admission(&refusing(capability), &base())
            else {
                panic!("{capability} is required by the base context");
            };
            DeviceChoice::<&str>::Refuse(AdmissionRefusal::Missing { capability, when })
        };
        // The first admitting device, even after refusing and unavailable ones.
        let all = decl(AgentKindCapabilities::all(true));
        assert_eq!(
            select_device(
                [
                    ("a", refusing("streaming")),
                    ("b", unavailable.clone()),
                    ("c", all.clone())
                ],
                &base()
            ),
            DeviceChoice::Admit("c", all)
        );
        // None admits: the first refusal in device order, whatever follows it.
        assert_eq!(
            select_device(
                [
                    ("a", unavailable.clone()),
                    ("b", refusing("steering")),
                    ("c", refusing("streaming"))
                ],
                &base()
            ),
            missing("steering")
        );
        // Only unavailable declarations (or none): wait.
        assert_eq!(
            select_device([("a", unavailable)], &base()),
            DeviceChoice::Wait
        );
        assert_eq!(
            select_device(Vec::<(&str, AgentKindDeclaration)>::new(), &base()),
            DeviceChoice::Wait
        );
    }

    #[test]
    fn row_always() {
        row_requires(
            base(),
            &[
                "streaming",
                "steering",
                "durable_turns",
                "durable_input_receipts",
                "preparation",
                "execution_controls",
                "tool_observations",
            ],
        );
    }

    #[test]
    fn row_environment_none() {
        let ctx = AdmissionContext {
            environment: Some(EnvironmentKind::None),
            ..base()
        };
        row_requires(ctx.clone(), &["environment_none"]);
        // A none Environment does not need the local-environment capabilities.
        let mut caps = AgentKindCapabilities::all(true);
        caps.local_environment = false;
        caps.workspace_output_export = false;
        assert!(check_capabilities(&caps, &ctx).is_ok());
    }

    #[test]
    fn row_local_environment() {
        for env in [EnvironmentKind::OpenaiHosted, EnvironmentKind::SelfHosted] {
            let ctx = AdmissionContext {
                environment: Some(env),
                ..base()
            };
            row_requires(
                ctx.clone(),
                &[
                    "local_environment",
                    "workspace_read_preparation",
                    "workspace_output_export",
                ],
            );
            let mut caps = AgentKindCapabilities::all(true);
            caps.environment_none = false;
            assert!(check_capabilities(&caps, &ctx).is_ok());
        }
    }

    #[test]
    fn row_idle_directory_read() {
        let ctx = AdmissionContext {
            environment: None,
            idle_directory_read: true,
            ..AdmissionContext::default()
        };
        assert_eq!(
            required_capabilities(&ctx),
            vec![(
                "workspace_read_preparation",
                "an idle Files directory read needs read-only preparation"
            )]
        );
    }

    #[test]
    fn row_native_session_recovery() {
        let mut caps = AgentKindCapabilities::all(true);
        caps.native_session_recovery = false;
        assert!(check_capabilities(&caps, &base()).is_ok());
        row_requires(
            AdmissionContext {
                needs_native_session_recovery: true,
                ..base()
            },
            &["native_session_recovery"],
        );
    }

    #[test]
    fn row_engine_profile_controls() {
        let mut caps = AgentKindCapabilities::all(true);
        caps.web_search_control = false;
        caps.text_verbosity = false;
        assert!(check_capabilities(&caps, &base()).is_ok());
        row_requires(
            AdmissionContext {
                profile: EngineProfile {
                    web_search_control: true,
                    text_verbosity: false,
                },
                ..base()
            },
            &["web_search_control"],
        );
        row_requires(
            AdmissionContext {
                profile: EngineProfile {
                    web_search_control: false,
                    text_verbosity: true,
                },
                ..base()
            },
            &["text_verbosity"],
        );
    }

    #[test]
    fn row_json_schema_output() {
        row_requires(
            AdmissionContext {
                json_schema_output: true,
                ..base()
            },
            &["structured_output", "message_items"],
        );
    }

    #[test]
    fn rows_multi_agent() {
        row_requires(
            AdmissionContext {
                multi_agent_enabled: true,
                ..base()
            },
            &["subagent_observations"],
        );
        row_requires(base(), &["subagent_control"]);
        let mut caps = AgentKindCapabilities::all(true);
        caps.subagent_control = false;
        assert!(
            check_capabilities(
                &caps,
                &AdmissionContext {
                    multi_agent_enabled: true,
                    ..base()
                }
            )
            .is_ok()
        );
    }

    #[test]
    fn row_tool_search() {
        row_requires(
            AdmissionContext {
                tool_search: true,
                ..base()
            },
            &["tool_search"],
        );
    }

    #[test]
    fn row_programmatic_tool_calling_disable() {
        row_requires(
            AdmissionContext {
                disables_programmatic_tool_calling: true,
                ..base()
            },
            &["programmatic_tool_calling_disable"],
        );
    }

    #[test]
    fn row_function_tools() {
        row_requires(
            AdmissionContext {
                function_tools: true,
                ..base()
            },
            &["function_tools"],
        );
    }

    #[test]
    fn rows_images() {
        row_requires(
            AdmissionContext {
                message_images: true,
                ..base()
            },
            &["message_images"],
        );
        row_requires(
            AdmissionContext {
                function_result_images: true,
                ..base()
            },
            &["function_result_images"],
        );
    }

    #[test]
    fn rows_mcp_http() {
        row_requires(
            AdmissionContext {
                mcp_http: true,
                ..base()
            },
            &["mcp_http_tools"],
        );
        row_requires(
            AdmissionContext {
                mcp_http: true,
                mcp_http_required: true,
                ..base()
            },
            &["mcp_http_tools", "mcp_http_required"],
        );
        row_requires(
            AdmissionContext {
                mcp_http: true,
                mcp_http_bearer: true,
                ..base()
            },
            &["mcp_http_tools", "mcp_http_bearer_auth"],
        );
    }

    #[test]
    fn no_rule_for_permissions_usage_resume_and_unavailable_refused() {
        let mut caps = AgentKindCapabilities::all(true);
        caps.permissions = false;
        caps.usage = false;
        caps.resume = false;
        assert!(check_capabilities(&caps, &base()).is_ok());
        let mut d = decl(AgentKindCapabilities::all(true));
        d.available = false;
        assert_eq!(
            check_admission(&d, &base()),
            Err(AdmissionRefusal::Unavailable)
        );
    }

    #[test]
    fn agent_context_is_derived_from_the_definition() {
        let a: AgentDefinition = crate::wire::decode_strict(
            br#"{"agent_kind":"controlled","model":"m","system_prompt":"p",
                "output":{"json_schema":{"name":"n","schema":{"type":"object"}}},
                "multi_agent":{"enabled":true},"tools":[{"type":"function","name":"f"}],
                "tool_search":true,"programmatic_tool_calling":"disabled",
                "mcp_servers":[{"name":"s","url":"https://x","required":true,"bearer_credential_ref":"v"}]}"#,
        )
        .unwrap();
        let c = AdmissionContext::for_execution(
            &a,
            EnvironmentKind::None,
            EngineProfile::default(),
            true,
            true,
        );
        assert!(c.json_schema_output && c.multi_agent_enabled && c.function_tools && c.tool_search);
        assert!(
            c.disables_programmatic_tool_calling
                && c.mcp_http
                && c.mcp_http_required
                && c.mcp_http_bearer
        );
        assert!(c.needs_native_session_recovery && c.message_images);
    }

    #[test]
    fn configuration_follows_the_opt_in_table() {
        let env = Uuid::new("00000000-0000-4000-8000-000000000001").unwrap();
        let caps = AgentKindCapabilities::all(true);
        let c = execution_configuration(&agent(), EnvironmentKind::SelfHosted, &env, &caps, None);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "agent_options": {"model": "m", "system_prompt": "p"},
                "execution_controls": {"web_search": "disabled", "text_verbosity": "medium", "programmatic_tool_calling": "disabled"},
                "observe_messages": true,
                "disable_subagents": true,
                "local_environment": {"environment_id": "00000000-0000-4000-8000-000000000001", "environment_type": "self_hosted"}
            })
        );
        let mut caps = AgentKindCapabilities::all(true);
        caps.message_items = false;
        let a: AgentDefinition = crate::wire::decode_strict(
            br#"{"agent_kind":"controlled","model":"m","system_prompt":"p","model_provider":"prov",
                "x_agents_core":{"harness_config":{"k":1}},"multi_agent":{"enabled":true},"text_verbosity":"high",
                "mcp_servers":[{"name":"s","url":"https://x"}]}"#,
        )
        .unwrap();
        let native = NativeSessionId::new("ns-1").unwrap();
        let c = execution_configuration(
            &a.frozen(),
            EnvironmentKind::None,
            &env,
            &caps,
            Some(&native),
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v["agent_options"],
            serde_json::json!({"model": "m", "system_prompt": "p", "model_provider": "prov", "harness_config": {"k": 1}})
        );
        assert_eq!(v["execution_controls"]["text_verbosity"], "high");
        assert!(v.get("observe_messages").is_none());
        assert_eq!(v["observe_subagent_identities"], true);
        assert!(v.get("disable_subagents").is_none());
        assert_eq!(v["disable_execution_environment"], true);
        assert!(v.get("local_environment").is_none());
        assert_eq!(
            v["require_existing_native_session"]["native_session_id"],
            "ns-1"
        );
        assert_eq!(v["mcp_servers"][0]["connection_origin"], "runtime_direct");
    }
}
