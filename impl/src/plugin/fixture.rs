//! The Rust fixture plugin (`contract-impl plugin fixture`), built on the SDK: the
//! conformance tool set every plugin under test exposes (`docs/plugin-launch-contract.md`,
//! "The conformance tools"), so one black-box suite runs against any language's plugin.
//!
//! | tool | arguments | what it does |
//! |---|---|---|
//! | `echo` | `{text}` | answers `{text}` |
//! | `progress` | `{count}` (0..=1000) | streams `count` progress messages, answers `{count}` |
//! | `slow` | `{}` | runs until cancelled, then fails `CANCELLED` |
//! | `mutate` | `{key, outcome}` | mutating: answers `{applied: key}`, or fails `UNCERTAIN` when `outcome` is `uncertain` |
//! | `output` | `{bytes}` | answers `{data}` with `bytes` characters (the output bound) |
//! | `crash` | `{}` | the process exits at once (status 70) without answering |
//! | `spawn_detached` | `{}` | starts `sleep 3600` in a session of its own (`setsid`), answers `{pid}` |

use async_trait::async_trait;
use serde_json::{Value, json};

use super::proto::v1::{FailureCode, Manifest, ToolDefinition};
use super::sdk::{Call, Conventions, Plugin, ToolError};
use crate::grpc::common::v1::BuildIdentity;

/// The fixture's plugin name (the host's configuration must name it).
pub const NAME: &str = "conformance-fixture";

/// The version of the conformance tool set (the manifest's `version`, the same in every
/// language's fixture).
pub const TOOL_SET_VERSION: &str = "1.0.0";

/// The manifest's description, the same in every language's fixture.
pub const DESCRIPTION: &str = "The plugin.v1 conformance tool set.";

/// Exit status of the `crash` tool.
pub const CRASH_STATUS: i32 = 70;

/// The fixture plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fixture {
    /// Make every choice the launch contract leaves free as another correct plugin
    /// would: refusals encoded by [`Conventions::DIFFERENT`], the tools and the
    /// capabilities in the reverse order, results other than `output`'s written with
    /// whitespace, and a `progress` call over the progress bound refused before it
    /// streams anything (ours streams what the bound allows, then fails).
    pub different: bool,
}

fn tool(
    name: &str,
    description: &str,
    schema: Value,
    mutating: bool,
    caps: &[&str],
) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: description.into(),
        input_schema_json: schema.to_string(),
        mutating,
        capabilities: caps.iter().map(|c| (*c).to_string()).collect(),
    }
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({
        "type": "object",
        "required": required,
        "additionalProperties": false,
        "properties": properties,
    })
}

/// The conformance tools, in their stable order.
pub fn tools() -> Vec<ToolDefinition> {
    vec![
        tool(
            "echo",
            "Answers its text.",
            object(&["text"], json!({"text": {"type": "string"}})),
            false,
            &[],
        ),
        tool(
            "progress",
            "Streams `count` progress messages, then answers the count.",
            object(
                &["count"],
                json!({"count": {"type": "integer", "minimum": 0, "maximum": 1000}}),
            ),
            false,
            &[],
        ),
        tool(
            "slow",
            "Reports progress once it runs, then runs until cancelled.",
            object(&[], json!({})),
            false,
            &[],
        ),
        tool(
            "mutate",
            "Applies a change named `key`; with outcome `uncertain` it loses track of whether it did.",
            object(
                &["key", "outcome"],
                json!({
                    "key": {"type": "string", "maxLength": 64},
                    "outcome": {"type": "string", "enum": ["applied", "uncertain"]},
                }),
            ),
            true,
            &["filesystem.write"],
        ),
        tool(
            "output",
            "Answers `bytes` characters of output.",
            object(
                &["bytes"],
                json!({"bytes": {"type": "integer", "minimum": 0, "maximum": 1048576}}),
            ),
            false,
            &[],
        ),
        tool(
            "crash",
            "Exits the process at once without answering.",
            object(&[], json!({})),
            false,
            &[],
        ),
        tool(
            "spawn_detached",
            "Starts a process in a session of its own and answers its PID.",
            object(&[], json!({})),
            false,
            &["process.spawn"],
        ),
    ]
}

#[async_trait]
impl Plugin for Fixture {
    fn manifest(&self) -> Manifest {
        Manifest {
            name: NAME.into(),
            version: TOOL_SET_VERSION.into(),
            description: DESCRIPTION.into(),
        }
    }

    fn build(&self) -> BuildIdentity {
        BuildIdentity {
            name: "contract-impl plugin fixture".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            revision: String::new(),
        }
    }

    fn tools(&self) -> Vec<ToolDefinition> {
        let mut all = tools();
        if self.different {
            all.reverse();
            for tool in &mut all {
                tool.capabilities.reverse();
            }
        }
        all
    }

    fn capabilities(&self) -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        for c in tools().into_iter().flat_map(|t| t.capabilities) {
            if !all.contains(&c) {
                all.push(c);
            }
        }
        if self.different {
            all.reverse();
        }
        all
    }

    fn spell(&self, tool: &str, output: &Value) -> String {
        // `output`'s spelling is the conformance tool's definition (`bytes` + 11 bytes).
        if self.different && tool != "output" {
            serde_json::to_string_pretty(output).unwrap_or_else(|_| output.to_string())
        } else {
            output.to_string()
        }
    }

    fn conventions(&self) -> Conventions {
        if self.different {
            Conventions::DIFFERENT
        } else {
            Conventions::REFERENCE
        }
    }

    async fn execute(&self, mut call: Call) -> Result<Value, ToolError> {
        let args = call.arguments.clone();
        match call.tool.as_str() {
            "echo" => Ok(json!({"text": args["text"]})),
            "progress" => {
                let count = args["count"].as_u64().unwrap_or(0);
                if self.different && count > call.max_progress() {
                    return Err(ToolError::failed(format!(
                        "{count} progress messages exceed the call's bound of {}",
                        call.max_progress()
                    )));
                }
                for i in 1..=count {
                    call.progress(&format!("step {i} of {count}"))
                        .await
                        .map_err(|e| ToolError::failed(e.to_string()))?;
                }
                Ok(json!({"count": count}))
            }
            "slow" => {
                // One report once it runs: the event a host waits for before it cancels.
                let _ = call.progress("running").await;
                call.cancelled().await;
                Err(ToolError::cancelled())
            }
            "mutate" => match args["outcome"].as_str() {
                Some("applied") => Ok(json!({"applied": args["key"]})),
                Some("uncertain") => Err(ToolError::new(
                    FailureCode::Uncertain,
                    "the change was sent but its acknowledgement was lost",
                )),
                _ => Err(ToolError::new(
                    FailureCode::InvalidArguments,
                    "outcome is `applied` or `uncertain`",
                )),
            },
            "output" => {
                let n = usize::try_from(args["bytes"].as_u64().unwrap_or(0)).unwrap_or(0);
                Ok(json!({"data": "x".repeat(n)}))
            }
            "crash" => std::process::exit(CRASH_STATUS),
            "spawn_detached" => {
                let child = super::sdk::command("setsid")
                    .args(["sleep", "3600"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| ToolError::failed(format!("setsid sleep: {e}")))?;
                Ok(json!({"pid": child.id()}))
            }
            other => Err(ToolError::new(
                FailureCode::UnknownTool,
                format!("no tool {other:?}"),
            )),
        }
    }
}
