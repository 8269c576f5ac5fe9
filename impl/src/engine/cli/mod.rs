//! `contract-impl engine …`: the daemon (`serve`) and the client subcommands (engine
//! issue, "The client"): initialize and reconnect with the compare-and-swap, start a
//! run, follow its events from any sequence through pages and the tail, list and answer
//! interactions, cancel, suspend, resume, export and import.
//!
//! Exit status: 0 done; 1 the daemon refused (a typed result or a status); 2 the daemon
//! could not be reached or the command could not start. Text for people, `--json` for
//! machines (one JSON object per line). The endpoint token is read from its file and
//! never printed.
//!
//! With `--client-state FILE` a command reconnects as the client recorded there (the
//! daemon's compare-and-swap to the next epoch) and records the new epoch (0600);
//! without it each command is a new owner.
//!
//! `engine controlled` is our client driven over the control channel of
//! `docs/engine-client-control.md` ([`super::controlled`]); it keeps its client state in
//! `CONTRACT_ENGINE_STATE_DIR` the same way ([`state`]).
//!
//! This module owns argument parsing and output; the calls are [`super::session`]'s.

mod calls;
pub mod state;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

/// `contract-impl engine`.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// What to do.
    #[command(subcommand)]
    pub what: EngineCommand,
}

/// The engine subcommands.
#[derive(Debug, Subcommand)]
pub enum EngineCommand {
    /// Serve the engine daemon on a Unix socket (no TCP listener); the endpoint token is
    /// written to `<data-dir>/endpoint-token` (0600).
    Serve {
        /// The Unix socket to listen on (its directory is made 0700).
        #[arg(long)]
        socket: PathBuf,
        /// The daemon's durable state (made 0700).
        #[arg(long)]
        data_dir: PathBuf,
        /// Events retained per run for replay (older ones are pruned; a cursor before
        /// them gets `cursor_gap`).
        #[arg(long, default_value_t = crate::engine::daemon::limits::RETAINED_EVENTS_PER_RUN,
              value_parser = clap::value_parser!(u64).range(1..))]
        retained_events: u64,
        /// Most encoded event bytes in one StreamEvents page (advertised as
        /// `max_page_bytes`; a page always holds at least one event).
        #[arg(long, default_value_t = crate::engine::daemon::limits::MAX_PAGE_BYTES,
              value_parser = clap::value_parser!(u64).range(1..))]
        page_bytes: u64,
        /// A snapshot key shared with other daemons (JSON `{scope_id, generation, key}`,
        /// hex, mode 0600); without it the daemon signs with its own key.
        #[arg(long)]
        snapshot_key_file: Option<PathBuf>,
        /// `different`: make every choice the spec leaves free otherwise (status codes and
        /// texts of refusals, sentinels, identifiers), for vendor-mode trials.
        #[arg(long, value_enum, default_value_t = ProfileArg::Reference)]
        profile: ProfileArg,
    },
    /// Measure the daemon against the floor on this machine (unary round trip, event
    /// replay, durable event writes) and print ratios.
    Bench {
        /// Unary calls measured.
        #[arg(long, default_value_t = 2_000)]
        rounds: usize,
        /// Events in the measured run (below the daemon's retention, so all replay).
        #[arg(long, default_value_t = 50_000,
              value_parser = clap::value_parser!(u64).range(1..99_000))]
        events: u64,
    },
    /// Our client driven over a control channel (docs/engine-client-control.md): the
    /// conformance harness plays the daemon and causes every call. Reads
    /// `CONTRACT_ENGINE_SOCKET`, `CONTRACT_ENGINE_TOKEN_FILE`,
    /// `CONTRACT_ENGINE_CONTROL_SOCKET` and `CONTRACT_ENGINE_STATE_DIR`; exits 0 when the
    /// control channel ends or on SIGTERM, 2 when it cannot start.
    Controlled {
        /// `different`: make every choice the spec leaves to a client otherwise (other
        /// refusal codes, no use of our daemon's cursor-gap trailer, smaller pages,
        /// other operation IDs), for the suite's vendor-mode trial.
        #[arg(long, value_enum, default_value_t = ProfileArg::Reference)]
        profile: ProfileArg,
    },
    /// The client calls.
    #[command(flatten)]
    Client(ClientCommand),
}

/// `--profile`, shared by every family's targets.
pub use crate::profile::ProfileArg;

/// Where a client finds the daemon, and who it is.
#[derive(Debug, Clone, Args)]
pub struct Endpoint {
    /// The daemon's Unix socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The daemon's endpoint token file (`<data-dir>/endpoint-token`).
    #[arg(long)]
    pub token_file: PathBuf,
    /// Reconnect as the client recorded in this file and record the new epoch (0600).
    #[arg(long)]
    pub client_state: Option<PathBuf>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The client subcommands.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Claim ownership: as a new owner, or reconnect with `--client-id` and the
    /// `--epoch` last held (the daemon's compare-and-swap); prints the result.
    Initialize {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// Reconnect as this client ID.
        #[arg(long, requires = "epoch")]
        client_id: Option<String>,
        /// The epoch last held (with `--client-id`).
        #[arg(long, requires = "client_id")]
        epoch: Option<u64>,
        /// A capability the daemon must offer (repeatable).
        #[arg(long = "require")]
        required: Vec<String>,
    },
    /// Print the daemon's health.
    Health {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// Start a run and (unless `--detach`) follow it to its end.
    Run {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run's first message (for the `scripted` definition, `#!script` programs).
        #[arg(long)]
        message: String,
        /// The definition, `ID@REVISION` (default: the first one the daemon advertises).
        #[arg(long)]
        definition: Option<String>,
        /// The client operation ID (default: a fresh one); the same ID returns the same run.
        #[arg(long)]
        operation_id: Option<String>,
        /// Print the run ID and return without following.
        #[arg(long)]
        detach: bool,
    },
    /// Follow a run's events after `--after` through pages and the live tail.
    Follow {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// Follow after this sequence (0: from the start).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Events per page.
        #[arg(long, default_value_t = crate::engine::daemon::limits::MAX_PAGE_EVENTS)]
        page: u32,
        /// Stop at the head instead of tailing.
        #[arg(long)]
        no_tail: bool,
    },
    /// List a run's pending interactions.
    Interactions {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Answer a pending interaction.
    Respond {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// The interaction.
        #[arg(long)]
        interaction: String,
        /// The response, JSON (a JSON string for the scripted kernel).
        #[arg(long)]
        response: String,
        /// The client operation ID (default: a fresh one).
        #[arg(long)]
        operation_id: Option<String>,
    },
    /// Cancel a run (says whether it had already ended).
    Cancel {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// The client operation ID (default: a fresh one).
        #[arg(long)]
        operation_id: Option<String>,
    },
    /// Suspend a run at its next completed turn.
    Suspend {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// The client operation ID (default: a fresh one).
        #[arg(long)]
        operation_id: Option<String>,
    },
    /// Resume a suspended run.
    Resume {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// The client operation ID (default: a fresh one).
        #[arg(long)]
        operation_id: Option<String>,
    },
    /// Export a suspended run's signed snapshot to a file (0600, protobuf).
    Export {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The run.
        #[arg(long)]
        run: String,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Import a snapshot file (the run keeps its ID; it arrives suspended).
    Import {
        /// The daemon and the client.
        #[command(flatten)]
        endpoint: Endpoint,
        /// The snapshot file.
        #[arg(long)]
        file: PathBuf,
        /// The client operation ID (default: a fresh one).
        #[arg(long)]
        operation_id: Option<String>,
    },
}

/// Runs `contract-impl engine …`.
pub fn run(args: EngineArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("contract-impl engine: {e}");
            return ExitCode::from(2);
        }
    };
    match args.what {
        EngineCommand::Serve {
            socket,
            data_dir,
            retained_events,
            page_bytes,
            snapshot_key_file,
            profile,
        } => {
            let config = crate::engine::daemon::Config {
                retained_events,
                page_bytes,
                snapshot_key_file,
                profile: match profile {
                    ProfileArg::Reference => crate::engine::daemon::Profile::Reference,
                    ProfileArg::Different => crate::engine::daemon::Profile::Different,
                },
            };
            match runtime.block_on(crate::engine::daemon::serve(&socket, &data_dir, &config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("contract-impl engine serve: {e} ({})", e.code());
                    ExitCode::from(2)
                }
            }
        }
        EngineCommand::Bench { rounds, events } => {
            match runtime.block_on(crate::engine::bench::run(rounds, events)) {
                Ok(r) => {
                    println!("engine bench ({rounds} unary calls, a run of {events} events):");
                    println!(
                        "  unary round trip (Health)  {:10.1} µs    floor (bare tonic, same socket) {:10.1} µs   {:5.2}× the floor",
                        r.unary_us.ours,
                        r.unary_us.floor,
                        r.unary_us.ours / r.unary_us.floor
                    );
                    println!(
                        "  event replay (StreamEvents){:10.0} ev/s  floor (bare tonic, from memory) {:10.0} ev/s {:5.2}× slower",
                        r.replay_eps.ours,
                        r.replay_eps.floor,
                        r.replay_eps.floor / r.replay_eps.ours
                    );
                    println!(
                        "  durable event writes       {:10.0} ev/s  floor (batched SQLite inserts)  {:10.0} ev/s {:5.2}× slower",
                        r.write_eps.ours,
                        r.write_eps.floor,
                        r.write_eps.floor / r.write_eps.ours
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("contract-impl engine bench: {e}");
                    ExitCode::from(1)
                }
            }
        }
        EngineCommand::Controlled { profile } => ExitCode::from(runtime.block_on(
            crate::engine::controlled::run(matches!(profile, ProfileArg::Different)),
        )),
        EngineCommand::Client(call) => runtime.block_on(calls::run(call)),
    }
}
