//! The facts of `Initialize`, validated before a candidate becomes visible to runs ("A
//! candidate is not visible to runs until all facts validate"; "Unknown capabilities,
//! duplicate names, oversized schemas ... fail the candidate").
//!
//! Pure: no I/O. Every refusal has a stable code.

use std::collections::HashSet;

use crate::plugin::proto::v1::{InitializeResponse, PluginLimits, ToolDefinition};
use crate::plugin::wire::{
    KNOWN_CAPABILITIES, MAX_CAPABILITIES, MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES, MAX_TOOLS,
    PROTOCOL_MAJOR, check_tool_name, proofs_equal,
};

/// Why a candidate failed (stable `code`, message for people).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CandidateFault {
    /// Stable code (`proof_mismatch`, `duplicate_tool`, …).
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

fn fault(code: &'static str, message: impl Into<String>) -> CandidateFault {
    CandidateFault {
        code,
        message: message.into(),
    }
}

/// What the host checks an answer against.
#[derive(Debug, Clone)]
pub struct Expectations<'a> {
    /// The configured plugin name.
    pub name: &'a str,
    /// The proof this launch's secret gives for the challenge sent.
    pub proof: &'a str,
    /// The configured approved capabilities.
    pub approved: &'a [String],
    /// The limits the host sent.
    pub host_limits: PluginLimits,
}

fn check_tool(tool: &ToolDefinition, declared: &[String]) -> Result<(), CandidateFault> {
    check_tool_name(&tool.name).map_err(|e| fault("invalid_tool_name", e.message))?;
    if tool.description.len() > MAX_DESCRIPTION_BYTES {
        return Err(fault(
            "oversized_description",
            format!(
                "tool {}: {} bytes, at most {MAX_DESCRIPTION_BYTES}",
                tool.name,
                tool.description.len()
            ),
        ));
    }
    if tool.input_schema_json.len() > MAX_SCHEMA_BYTES {
        return Err(fault(
            "oversized_schema",
            format!(
                "tool {}: its schema is {} bytes, at most {MAX_SCHEMA_BYTES}",
                tool.name,
                tool.input_schema_json.len()
            ),
        ));
    }
    match crate::wire::strict::parse_strict(tool.input_schema_json.as_bytes()) {
        Ok(serde_json::Value::Object(_)) => {}
        _ => {
            return Err(fault(
                "invalid_schema",
                format!("tool {}: its schema is not a JSON object", tool.name),
            ));
        }
    }
    if tool.capabilities.len() > MAX_CAPABILITIES {
        return Err(fault(
            "too_many_capabilities",
            format!("tool {}", tool.name),
        ));
    }
    if let Some(c) = tool.capabilities.iter().find(|c| !declared.contains(c)) {
        return Err(fault(
            "undeclared_capability",
            format!(
                "tool {} uses {c}, which the plugin does not declare",
                tool.name
            ),
        ));
    }
    Ok(())
}

/// Checks every fact of `answer`.
///
/// # Errors
/// The first fault, in the order: proof, version, name, capabilities, tools, limits.
pub fn check_initialize(
    answer: &InitializeResponse,
    expect: &Expectations<'_>,
) -> Result<(), CandidateFault> {
    if !proofs_equal(&answer.secret_proof, expect.proof) {
        return Err(fault(
            "proof_mismatch",
            "the plugin's proof is not this launch's secret for this challenge",
        ));
    }
    let major = answer.protocol.map(|p| p.major).unwrap_or_default();
    if major != PROTOCOL_MAJOR {
        return Err(fault(
            "incompatible_protocol",
            format!("the plugin answered major {major}; the host speaks {PROTOCOL_MAJOR}"),
        ));
    }
    let name = answer
        .manifest
        .as_ref()
        .map(|m| m.name.as_str())
        .unwrap_or_default();
    if name != expect.name {
        return Err(fault(
            "name_mismatch",
            format!(
                "the manifest names {name:?}; the configuration names {:?}",
                expect.name
            ),
        ));
    }
    if answer.capabilities.len() > MAX_CAPABILITIES {
        return Err(fault(
            "too_many_capabilities",
            format!("{} declared", answer.capabilities.len()),
        ));
    }
    for c in &answer.capabilities {
        if !KNOWN_CAPABILITIES.contains(&c.as_str()) {
            return Err(fault("unknown_capability", format!("{c:?}")));
        }
        if !expect.approved.contains(c) {
            return Err(fault(
                "capability_not_approved",
                format!("{c} is not approved by the configuration"),
            ));
        }
    }
    if answer.tools.len() > MAX_TOOLS {
        return Err(fault(
            "too_many_tools",
            format!("{} tools, at most {MAX_TOOLS}", answer.tools.len()),
        ));
    }
    let mut names = HashSet::new();
    for tool in &answer.tools {
        check_tool(tool, &answer.capabilities)?;
        if !names.insert(tool.name.as_str()) {
            return Err(fault(
                "duplicate_tool",
                format!("tool {} is defined twice", tool.name),
            ));
        }
    }
    let limits = answer.limits.unwrap_or_default();
    let host = expect.host_limits;
    if limits.max_payload_bytes == 0
        || limits.max_payload_bytes > host.max_payload_bytes
        || limits.max_progress_messages == 0
        || limits.max_progress_messages > host.max_progress_messages
        || limits.max_concurrent_calls == 0
        || limits.max_concurrent_calls > host.max_concurrent_calls
    {
        return Err(fault(
            "invalid_limits",
            format!("the plugin's limits {limits:?} are not within the host's {host:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::common::v1::ProtocolVersion;
    use crate::plugin::proto::v1::Manifest;

    fn limits() -> PluginLimits {
        PluginLimits {
            max_payload_bytes: 10,
            max_progress_messages: 10,
            max_concurrent_calls: 2,
        }
    }

    fn good() -> InitializeResponse {
        InitializeResponse {
            protocol: Some(ProtocolVersion { major: 1, minor: 0 }),
            plugin_build: None,
            manifest: Some(Manifest {
                name: "p".into(),
                ..Manifest::default()
            }),
            tools: vec![ToolDefinition {
                name: "t".into(),
                input_schema_json: "{}".into(),
                capabilities: vec!["process.spawn".into()],
                ..ToolDefinition::default()
            }],
            capabilities: vec!["process.spawn".into()],
            limits: Some(limits()),
            secret_proof: "proof".into(),
        }
    }

    fn check(answer: &InitializeResponse) -> Result<(), CandidateFault> {
        let approved = vec!["process.spawn".to_string()];
        check_initialize(
            answer,
            &Expectations {
                name: "p",
                proof: "proof",
                approved: &approved,
                host_limits: limits(),
            },
        )
    }

    #[test]
    fn every_fact_is_checked() {
        assert_eq!(check(&good()), Ok(()));
        let code = |f: &dyn Fn(&mut InitializeResponse)| {
            let mut a = good();
            f(&mut a);
            check(&a).unwrap_err().code
        };
        assert_eq!(code(&|a| a.secret_proof = "other".into()), "proof_mismatch");
        assert_eq!(
            code(&|a| a.protocol = Some(ProtocolVersion { major: 2, minor: 0 })),
            "incompatible_protocol"
        );
        assert_eq!(
            code(&|a| a.manifest.as_mut().unwrap().name = "q".into()),
            "name_mismatch"
        );
        assert_eq!(
            code(&|a| a.capabilities.push("network.listen".into())),
            "unknown_capability"
        );
        assert_eq!(
            code(&|a| a.capabilities.push("network.connect".into())),
            "capability_not_approved"
        );
        assert_eq!(
            code(&|a| a.tools.push(a.tools[0].clone())),
            "duplicate_tool"
        );
        assert_eq!(
            code(&|a| a.tools[0].input_schema_json = "[]".into()),
            "invalid_schema"
        );
        assert_eq!(
            code(&|a| a.tools[0].input_schema_json =
                format!("{{\"d\":\"{}\"}}", "x".repeat(MAX_SCHEMA_BYTES))),
            "oversized_schema"
        );
        assert_eq!(
            code(&|a| a.tools[0].capabilities = vec!["filesystem.read".into()]),
            "undeclared_capability"
        );
        assert_eq!(
            code(&|a| a.limits.as_mut().unwrap().max_concurrent_calls = 3),
            "invalid_limits"
        );
        assert_eq!(
            code(&|a| a.tools[0].name = "Bad".into()),
            "invalid_tool_name"
        );
    }

    #[test]
    fn a_schema_at_its_bound_passes_and_one_past_fails() {
        let mut a = good();
        let fill = MAX_SCHEMA_BYTES - "{\"d\":\"\"}".len();
        a.tools[0].input_schema_json = format!("{{\"d\":\"{}\"}}", "x".repeat(fill));
        assert_eq!(a.tools[0].input_schema_json.len(), MAX_SCHEMA_BYTES);
        assert_eq!(check(&a), Ok(()));
        a.tools[0].input_schema_json = format!("{{\"d\":\"{}\"}}", "x".repeat(fill + 1));
        assert_eq!(check(&a).unwrap_err().code, "oversized_schema");
        let mut a = good();
        a.tools = (0..MAX_TOOLS)
            .map(|i| ToolDefinition {
                name: format!("t{i}"),
                input_schema_json: "{}".into(),
                ..ToolDefinition::default()
            })
            .collect();
        assert_eq!(check(&a), Ok(()));
        a.tools.push(ToolDefinition {
            name: "extra".into(),
            input_schema_json: "{}".into(),
            ..ToolDefinition::default()
        });
        assert_eq!(check(&a).unwrap_err().code, "too_many_tools");
    }
}
