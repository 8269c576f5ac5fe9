//! `contract-impl plugin …`: the fixture plugin (`fixture`), run under the launch contract
//! of `docs/plugin-launch-contract.md` by whichever host launches it, and our host driven
//! from the command line: `digest FILE` (the SHA-256 a configuration pins), `activate`
//! (verify, launch, validate, print the status, drain), `list` (the tools), `call`
//! (one call on a leased generation, its progress and outcome as JSON lines) and
//! `status`. Each host command reads the plugin's configuration (`--config FILE`, see
//! [`crate::plugin::host::config`]).
//!
//! Exit status of `fixture`: 0 after its host went away or a drain ended; 2 when the
//! launch environment is missing or wrong; 70 when its `crash` tool ran. Of the host
//! commands: 0 done; 1 the candidate or the call failed (the JSON says why, with a stable
//! code); 2 the configuration is refused.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use super::host::{CallError, PluginConfig, PluginHost, ToolOutcome};

use clap::{Args, Subcommand};

/// `contract-impl plugin`.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// What to do.
    #[command(subcommand)]
    pub what: PluginCommand,
}

/// The plugin subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Serve the conformance tool set as a plugin (the launch environment names the
    /// socket and carries the secret; see docs/plugin-launch-contract.md).
    Fixture {
        /// `different`: refusals encoded as another correct plugin would (other gRPC
        /// codes and launch exit status; the vendor-mode trial of the suite).
        #[arg(long, value_enum, default_value = "reference")]
        profile: crate::profile::ProfileArg,
    },
    /// Print the SHA-256 of FILE (the value a configuration's `sha256` pins).
    Digest {
        /// The executable.
        file: PathBuf,
    },
    /// Our host driven over the control channel of docs/plugin-host-control.md
    /// (`CONTRACT_PLUGIN_HOST_CONTROL_SOCKET`), for the conformance harness's side `host`.
    Host {
        /// `different`: the host names its refusals and call outcomes differently, as
        /// another correct host may (the vendor-mode trial of the suite).
        #[arg(long, value_enum, default_value = "reference")]
        profile: crate::profile::ProfileArg,
    },
    /// Verify, launch and validate the configured plugin, print the host's status, drain.
    Activate {
        /// The plugin's configuration (JSON).
        #[arg(long)]
        config: PathBuf,
    },
    /// Activate, print the leased generation's tools, drain.
    List {
        /// The plugin's configuration (JSON).
        #[arg(long)]
        config: PathBuf,
    },
    /// Activate, run one call, print its progress and outcome, drain.
    Call {
        /// The plugin's configuration (JSON).
        #[arg(long)]
        config: PathBuf,
        /// The tool.
        #[arg(long)]
        tool: String,
        /// The arguments (JSON text).
        #[arg(long, default_value = "{}")]
        args: String,
        /// The call's ID.
        #[arg(long, default_value = "call-1")]
        call_id: String,
        /// After the outcome, print the status and keep the host (and its plugin) running
        /// until SIGTERM or SIGINT.
        #[arg(long)]
        hold: bool,
    },
    /// Measure the Execute round trip through our host and SDK against a bare tonic
    /// unary call (`make bench`).
    Bench {
        /// Calls per measurement.
        #[arg(long, default_value_t = 2000)]
        rounds: usize,
    },
    /// Activate and print the host's status (generation, digest, drift, capabilities and
    /// whether an enforcing decorator exists), then drain.
    Status {
        /// The plugin's configuration (JSON).
        #[arg(long)]
        config: PathBuf,
    },
}

fn line(value: &serde_json::Value) {
    println!("{value}");
}

async fn host_command(what: PluginCommand) -> u8 {
    let (config_path, action) = match what {
        PluginCommand::Activate { config } | PluginCommand::Status { config } => (config, None),
        PluginCommand::List { config } => (config, Some(None)),
        PluginCommand::Call {
            config,
            tool,
            args,
            call_id,
            hold,
        } => (config, Some(Some((tool, args, call_id, hold)))),
        PluginCommand::Fixture { .. }
        | PluginCommand::Host { .. }
        | PluginCommand::Digest { .. }
        | PluginCommand::Bench { .. } => {
            return 2;
        }
    };
    let config = match PluginConfig::load(&config_path) {
        Ok(c) => c,
        Err(e) => {
            line(&json!({"error": e.code(), "message": e.to_string()}));
            return 2;
        }
    };
    let supervisor = match super::host::launch::this_program() {
        Ok(p) => p,
        Err(e) => {
            line(&json!({"error": e.code, "message": e.message}));
            return 1;
        }
    };
    let host = PluginHost::new(config, supervisor);
    if let Err(e) = host.activate().await {
        line(&json!({"error": e.code, "message": e.message}));
        return 1;
    }
    let mut status = 0;
    match action {
        None => line(&host.status().await),
        Some(None) => {
            if let Some(lease) = host.lease() {
                let tools: Vec<_> = lease
                    .generation()
                    .tools
                    .iter()
                    .map(|t| json!({"name": t.name, "description": t.description, "mutating": t.mutating, "capabilities": t.capabilities, "input_schema": serde_json::from_str::<serde_json::Value>(&t.input_schema_json).unwrap_or_default()}))
                    .collect();
                line(&json!({"generation": lease.generation().id, "tools": tools}));
            }
        }
        Some(Some((tool, args, call_id, hold))) => {
            if let Some(lease) = host.lease() {
                let outcome = lease
                    .execute(
                        &call_id,
                        &tool,
                        &args,
                        |sequence, message| {
                            line(&json!({"progress": {"sequence": sequence, "message": message}}))
                        },
                        std::future::pending(),
                    )
                    .await;
                match outcome {
                    Ok(ToolOutcome::Result(output)) => line(
                        &json!({"result": serde_json::from_str::<serde_json::Value>(&output).unwrap_or(serde_json::Value::String(output))}),
                    ),
                    Ok(ToolOutcome::Failure { code, message }) => {
                        status = 1;
                        line(&json!({"failure": {"code": code.as_str_name(), "message": message}}));
                    }
                    Err(e) => {
                        status = 1;
                        let uncertain = matches!(
                            e,
                            CallError::Interrupted { uncertain: true }
                                | CallError::Cancelled {
                                    uncertain: true,
                                    ..
                                }
                        );
                        line(
                            &json!({"error": e.code(), "message": e.to_string(), "uncertain": uncertain}),
                        );
                    }
                }
                if hold {
                    line(&host.status().await);
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .ok();
                    tokio::select! {
                        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                drop(lease);
            }
        }
    }
    host.shutdown().await;
    status
}

/// Runs `contract-impl plugin …`.
pub fn run(args: PluginArgs) -> ExitCode {
    match args.what {
        PluginCommand::Fixture { profile } => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("plugin: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let fixture = super::fixture::Fixture {
                different: matches!(profile, crate::profile::ProfileArg::Different),
            };
            let status = runtime.block_on(super::sdk::serve(fixture));
            // The tool tasks of a drained or abandoned process are not waited for.
            runtime.shutdown_background();
            ExitCode::from(u8::try_from(status).unwrap_or(1))
        }
        PluginCommand::Host { profile } => match tokio::runtime::Runtime::new() {
            Ok(runtime) => {
                let different = matches!(profile, crate::profile::ProfileArg::Different);
                let code = runtime.block_on(super::controlled::run(different));
                runtime.shutdown_background();
                ExitCode::from(u8::try_from(code).unwrap_or(1))
            }
            Err(e) => {
                eprintln!("plugin host: cannot start the runtime: {e}");
                ExitCode::from(2)
            }
        },
        PluginCommand::Digest { file } => match super::host::verify::sha256_of(&file) {
            Ok(digest) => {
                println!("{digest}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("plugin digest: {}: {e}", file.display());
                ExitCode::from(2)
            }
        },
        PluginCommand::Bench { rounds } => match tokio::runtime::Runtime::new()
            .map_err(|e| e.to_string())
            .and_then(|r| r.block_on(super::bench::run(rounds.max(1))))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plugin bench: {e}");
                ExitCode::from(1)
            }
        },
        other => match tokio::runtime::Runtime::new() {
            Ok(runtime) => ExitCode::from(runtime.block_on(host_command(other))),
            Err(e) => {
                eprintln!("plugin: cannot start the runtime: {e}");
                ExitCode::from(1)
            }
        },
    }
}
