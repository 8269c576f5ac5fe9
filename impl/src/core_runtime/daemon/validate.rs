//! Validation of an `execution_prepare` request before any native call
//! ("Capability declarations", "MCP connection permissions", "Workspace operations":
//! "unsupported capability or invalid binding: reject before starting the operation;
//! never fall back to another Harness").
//!
//! Pure functions: no I/O, no state. The order of checks (and so which code wins when
//! several apply) is:
//!
//! 1. agent kind not registered → `unknown_agent_kind`; declared unavailable →
//!    `agent_unavailable`;
//! 2. shape: `agent_options` keys outside [`AGENT_OPTION_KEYS`], the read-only profile
//!    with anything beside `local_environment`, or not exactly one of
//!    `local_environment` / `disable_execution_environment: true` →
//!    `unsupported_configuration`;
//! 3. an MCP server whose `connection_origin` is missing or unknown →
//!    `invalid_mcp_connection_origin`;
//! 4. `local_environment` different from the Runtime's own binding → `invalid_binding`;
//! 5. a configuration needing a capability the kind does not declare →
//!    `unsupported_capability` (see [`required_capabilities`]).

use crate::core_runtime::wire::{
    AGENT_OPTION_KEYS, AgentKindCapabilities, AgentKindDeclaration, ConnectionOrigin,
    ExecutionConfiguration, LocalEnvironment, OutputFormat, PreparationErrorCode, WebSearch,
};

/// Whether the configuration selects the read-only preparation profile.
pub fn is_read_only(configuration: &ExecutionConfiguration) -> bool {
    configuration.workspace_read_only == Some(true)
}

/// The capabilities a configuration needs, as wire field names, in a fixed order.
///
/// | configuration | capability |
/// |---|---|
/// | `disable_execution_environment: true` | `environment_none` |
/// | `local_environment` | `local_environment` |
/// | `workspace_read_only: true` | `workspace_read_preparation` |
/// | `observe_messages: true` | `message_items` |
/// | `observe_subagent_identities: true` | `subagent_observations` |
/// | `disable_subagents: true` | `subagent_control` |
/// | `execution_controls.web_search: enabled` | `web_search_control` |
/// | `execution_controls.output_format: json_schema` | `structured_output`, `message_items` |
/// | any `mcp_servers` | `mcp_http_tools` |
/// | an MCP server with `required: true` | `mcp_http_required` |
/// | an MCP server with `bearer_credential_ref` | `mcp_http_bearer_auth` |
/// | `require_existing_native_session` | `native_session_recovery` |
pub fn required_capabilities(configuration: &ExecutionConfiguration) -> Vec<&'static str> {
    let mut out = Vec::new();
    if configuration.disable_execution_environment == Some(true) {
        out.push("environment_none");
    }
    if configuration.local_environment.is_some() {
        out.push("local_environment");
    }
    if is_read_only(configuration) {
        out.push("workspace_read_preparation");
    }
    if configuration.observe_messages == Some(true) {
        out.push("message_items");
    }
    if configuration.observe_subagent_identities == Some(true) {
        out.push("subagent_observations");
    }
    if configuration.disable_subagents == Some(true) {
        out.push("subagent_control");
    }
    if let Some(controls) = &configuration.execution_controls {
        if controls.web_search == WebSearch::Enabled {
            out.push("web_search_control");
        }
        if let Some(OutputFormat::JsonSchema { .. }) = controls.output_format {
            out.push("structured_output");
            out.push("message_items");
        }
    }
    if let Some(servers) = &configuration.mcp_servers
        && !servers.is_empty()
    {
        out.push("mcp_http_tools");
        if servers.iter().any(|s| s.required) {
            out.push("mcp_http_required");
        }
        if servers.iter().any(|s| s.bearer_credential_ref.is_some()) {
            out.push("mcp_http_bearer_auth");
        }
    }
    if configuration.require_existing_native_session.is_some() {
        out.push("native_session_recovery");
    }
    out
}

/// Checks the configuration's shape (step 2 of the module order).
fn check_shape(configuration: &ExecutionConfiguration) -> Result<(), PreparationErrorCode> {
    if let Some(options) = &configuration.agent_options
        && options
            .keys()
            .any(|k| !AGENT_OPTION_KEYS.contains(&k.as_str()))
    {
        return Err(PreparationErrorCode::UnsupportedConfiguration);
    }
    let local = configuration.local_environment.is_some();
    let none = configuration.disable_execution_environment == Some(true);
    if local == none {
        return Err(PreparationErrorCode::UnsupportedConfiguration);
    }
    if is_read_only(configuration) {
        // "Only the bound Environment and resource identity are accepted; no execution
        // options, model or MCP credentials, native Session continuation, model or tool
        // input" ("Workspace operations").
        let only_binding = ExecutionConfiguration {
            local_environment: configuration.local_environment.clone(),
            workspace_read_only: Some(true),
            ..ExecutionConfiguration::default()
        };
        if *configuration != only_binding {
            return Err(PreparationErrorCode::UnsupportedConfiguration);
        }
    }
    Ok(())
}

/// Validates a preparation request against the registry and the Runtime's binding.
///
/// `declaration` is the registered declaration of the requested kind (`None` when the
/// kind is not registered).
///
/// # Errors
/// The bounded [`PreparationErrorCode`] of the first failing check, in the module's
/// order.
pub fn validate_prepare(
    configuration: &ExecutionConfiguration,
    declaration: Option<&AgentKindDeclaration>,
    binding: &LocalEnvironment,
) -> Result<(), PreparationErrorCode> {
    let declaration = declaration.ok_or(PreparationErrorCode::UnknownAgentKind)?;
    if !declaration.available {
        return Err(PreparationErrorCode::AgentUnavailable);
    }
    check_shape(configuration)?;
    if let Some(servers) = &configuration.mcp_servers {
        let valid = servers.iter().all(|s| {
            s.connection_origin
                .as_deref()
                .and_then(ConnectionOrigin::parse)
                .is_some()
        });
        if !valid {
            return Err(PreparationErrorCode::InvalidMcpConnectionOrigin);
        }
    }
    if let Some(local) = &configuration.local_environment
        && local != binding
    {
        return Err(PreparationErrorCode::InvalidBinding);
    }
    check_capabilities(configuration, &declaration.capabilities)
}

/// Step 5: every required capability is declared.
///
/// # Errors
/// [`PreparationErrorCode::UnsupportedCapability`].
pub fn check_capabilities(
    configuration: &ExecutionConfiguration,
    capabilities: &AgentKindCapabilities,
) -> Result<(), PreparationErrorCode> {
    if required_capabilities(configuration)
        .into_iter()
        .all(|field| capabilities.get(field) == Some(true))
    {
        Ok(())
    } else {
        Err(PreparationErrorCode::UnsupportedCapability)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::wire::{
        AgentKind, EnvironmentType, ExecutionControls, McpHttpServer, NativeSessionId,
        NativeSessionRef, ProgrammaticToolCalling, TextVerbosity, Uuid,
    };
    use crate::wire::bounded::{BoundedString, BoundedVec};
    use serde_json::json;

    fn binding() -> LocalEnvironment {
        LocalEnvironment {
            environment_id: Uuid::new("00000000-0000-4000-8000-000000000001").unwrap(),
            environment_type: EnvironmentType::SelfHosted,
        }
    }

    fn declaration(caps: AgentKindCapabilities) -> AgentKindDeclaration {
        AgentKindDeclaration {
            agent_kind: AgentKind::new("controlled").unwrap(),
            available: true,
            capabilities: caps,
        }
    }

    fn local() -> ExecutionConfiguration {
        ExecutionConfiguration {
            local_environment: Some(binding()),
            ..Default::default()
        }
    }

    fn server(origin: Option<&str>) -> McpHttpServer {
        McpHttpServer {
            name: BoundedString::new("s").unwrap(),
            url: BoundedString::new("http://x").unwrap(),
            required: false,
            bearer_credential_ref: None,
            connection_origin: origin.map(|o| BoundedString::new(o).unwrap()),
        }
    }

    #[test]
    fn kind_checks_come_first() {
        let all = declaration(AgentKindCapabilities::all(true));
        assert_eq!(
            validate_prepare(&local(), None, &binding()),
            Err(PreparationErrorCode::UnknownAgentKind)
        );
        let mut unavailable = all.clone();
        unavailable.available = false;
        assert_eq!(
            validate_prepare(&local(), Some(&unavailable), &binding()),
            Err(PreparationErrorCode::AgentUnavailable)
        );
        assert_eq!(validate_prepare(&local(), Some(&all), &binding()), Ok(()));
    }

    #[test]
    fn shape_rules() {
        let all = declaration(AgentKindCapabilities::all(true));
        let neither = ExecutionConfiguration::default();
        assert_eq!(
            validate_prepare(&neither, Some(&all), &binding()),
            Err(PreparationErrorCode::UnsupportedConfiguration)
        );
        let both = ExecutionConfiguration {
            disable_execution_environment: Some(true),
            ..local()
        };
        assert_eq!(
            validate_prepare(&both, Some(&all), &binding()),
            Err(PreparationErrorCode::UnsupportedConfiguration)
        );
        let mut options = serde_json::Map::new();
        options.insert("model".into(), json!("m"));
        options.insert("temperature".into(), json!(1));
        let extra = ExecutionConfiguration {
            agent_options: Some(options),
            ..local()
        };
        assert_eq!(
            validate_prepare(&extra, Some(&all), &binding()),
            Err(PreparationErrorCode::UnsupportedConfiguration)
        );
        let read_only = ExecutionConfiguration {
            workspace_read_only: Some(true),
            ..local()
        };
        assert_eq!(validate_prepare(&read_only, Some(&all), &binding()), Ok(()));
        let read_only_with_model = ExecutionConfiguration {
            observe_messages: Some(true),
            ..read_only
        };
        assert_eq!(
            validate_prepare(&read_only_with_model, Some(&all), &binding()),
            Err(PreparationErrorCode::UnsupportedConfiguration)
        );
    }

    #[test]
    fn mcp_origin_and_binding() {
        let all = declaration(AgentKindCapabilities::all(true));
        for origin in [None, Some("elsewhere")] {
            let config = ExecutionConfiguration {
                mcp_servers: Some(BoundedVec::new(vec![server(origin)]).unwrap()),
                ..local()
            };
            assert_eq!(
                validate_prepare(&config, Some(&all), &binding()),
                Err(PreparationErrorCode::InvalidMcpConnectionOrigin)
            );
        }
        let config = ExecutionConfiguration {
            mcp_servers: Some(BoundedVec::new(vec![server(Some("core_relay"))]).unwrap()),
            ..local()
        };
        assert_eq!(validate_prepare(&config, Some(&all), &binding()), Ok(()));
        let other = ExecutionConfiguration {
            local_environment: Some(LocalEnvironment {
                environment_id: Uuid::new("00000000-0000-4000-8000-000000000002").unwrap(),
                environment_type: EnvironmentType::SelfHosted,
            }),
            ..Default::default()
        };
        assert_eq!(
            validate_prepare(&other, Some(&all), &binding()),
            Err(PreparationErrorCode::InvalidBinding)
        );
        let other_type = ExecutionConfiguration {
            local_environment: Some(LocalEnvironment {
                environment_type: EnvironmentType::OpenaiHosted,
                ..binding()
            }),
            ..Default::default()
        };
        assert_eq!(
            validate_prepare(&other_type, Some(&all), &binding()),
            Err(PreparationErrorCode::InvalidBinding)
        );
    }

    #[test]
    fn capabilities_are_checked_one_by_one() {
        let cases: Vec<(ExecutionConfiguration, &str)> = vec![
            (
                ExecutionConfiguration {
                    disable_execution_environment: Some(true),
                    ..Default::default()
                },
                "environment_none",
            ),
            (local(), "local_environment"),
            (
                ExecutionConfiguration {
                    workspace_read_only: Some(true),
                    ..local()
                },
                "workspace_read_preparation",
            ),
            (
                ExecutionConfiguration {
                    execution_controls: Some(ExecutionControls {
                        web_search: WebSearch::Disabled,
                        text_verbosity: TextVerbosity::Medium,
                        programmatic_tool_calling: ProgrammaticToolCalling::Disabled,
                        output_format: Some(OutputFormat::JsonSchema {
                            name: BoundedString::new("n").unwrap(),
                            schema: json!({}),
                        }),
                    }),
                    ..local()
                },
                "structured_output",
            ),
            (
                ExecutionConfiguration {
                    mcp_servers: Some(
                        BoundedVec::new(vec![server(Some("runtime_direct"))]).unwrap(),
                    ),
                    ..local()
                },
                "mcp_http_tools",
            ),
            (
                ExecutionConfiguration {
                    require_existing_native_session: Some(NativeSessionRef {
                        native_session_id: NativeSessionId::new("n").unwrap(),
                    }),
                    ..local()
                },
                "native_session_recovery",
            ),
        ];
        for (config, field) in cases {
            let mut caps = AgentKindCapabilities::all(true);
            assert!(caps.set(field, false));
            assert_eq!(
                validate_prepare(&config, Some(&declaration(caps)), &binding()),
                Err(PreparationErrorCode::UnsupportedCapability),
                "{field}"
            );
            assert_eq!(
                validate_prepare(
                    &config,
                    Some(&declaration(AgentKindCapabilities::all(true))),
                    &binding()
                ),
                Ok(()),
                "{field}"
            );
        }
    }
}
