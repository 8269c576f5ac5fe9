//! `contract-impl plugin …`: the fixture plugin (`fixture`), run under the launch contract
//! of `docs/plugin-launch-contract.md` by whichever host launches it.
//!
//! Exit status of `fixture`: 0 after its host went away or a drain ended; 2 when the
//! launch environment is missing or wrong; 70 when its `crash` tool ran.

use std::process::ExitCode;

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
    Fixture,
}

/// Runs `contract-impl plugin …`.
pub fn run(args: PluginArgs) -> ExitCode {
    match args.what {
        PluginCommand::Fixture => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("plugin: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let status = runtime.block_on(super::sdk::serve(super::fixture::Fixture));
            // The tool tasks of a drained or abandoned process are not waited for.
            runtime.shutdown_background();
            ExitCode::from(u8::try_from(status).unwrap_or(1))
        }
    }
}
