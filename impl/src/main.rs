//! `contract-impl`: the reference implementations under test.
//!
//! ```text
//! contract-impl runtime [--core-url URL] [--device-id ID] [--config FILE]
//!                       [--control-socket PATH] [--workspace DIR] [--adapter controlled]
//! contract-impl runtime [--core-url URL] [--device-id ID] [--config FILE] [--workspace DIR]
//!                       --adapter command --command-program PROGRAM [--command-arg ARG]...
//!                       [--command-cwd DIR] [--command-protocol plain|jsonl]
//!                       [--command-stdin close|open]
//! contract-impl schema core_runtime|worker
//! contract-impl worker python [--skills PATH]   (see docs/worker-launch-contract.md)
//! contract-impl worker run [--file CELLS] [--json] [-- PROGRAM…]
//! contract-impl worker supervise -- PROGRAM…
//! contract-impl worker host [--data-dir DIR] [--workspace DIR]   (see docs/worker-host-control.md)
//! contract-impl engine serve --socket PATH --data-dir DIR
//! contract-impl engine initialize|health --socket PATH --token-file FILE [--json]
//! contract-impl engine controlled        (see docs/engine-client-control.md)
//! contract-impl plugin fixture           (see docs/plugin-launch-contract.md)
//! contract-impl plugin digest FILE | activate|list|status --config FILE
//! contract-impl plugin call --config FILE --tool T [--args JSON] [--hold]
//! contract-impl plugin bench [--rounds N]
//! contract-impl plugin host              (docs/plugin-host-control.md)
//! contract-impl core serve|credential …   (see docs/core-api.md)
//! ```
//!
//! `runtime` runs the Core ↔ Runtime daemon through the launch contract of
//! `docs/launch-contract.md`. Every flag falls back to its environment variable
//! (`CONTRACT_CORE_URL`, `CONTRACT_DEVICE_ID`, `CONTRACT_RUNTIME_CONFIG`,
//! `CONTRACT_CONTROL_SOCKET`, `CONTRACT_WORKSPACE`). The daemon credential is read
//! **only** from `CONTRACT_DAEMON_CREDENTIAL`: it has no flag (so it never shows in a
//! process listing) and is never printed.
//!
//! `--adapter controlled` (the default) needs `--control-socket`. `--adapter command`
//! runs a real Harness: the local program `PROGRAM` (a path, or a name looked up in
//! `PATH`) once per Turn, with the arguments `--command-arg` gives in order (no shell),
//! in the workspace directory unless `--command-cwd` names another. `--command-protocol
//! plain` (the default) writes the input text to stdin and forwards stdout lines as
//! deltas, with stdin closed after the Turn input (`--command-stdin close`, the default
//! in plain mode) or kept open for active input (`open`). `--command-protocol jsonl`
//! speaks one JSON record per line in both directions (input records in; `delta`,
//! `accepted`, `tool_call`, `usage`, `error` records out), keeps stdin open (an explicit
//! `--command-stdin close` is a usage error) and declares the capabilities that makes
//! honest (`durable_turns`, `durable_input_receipts`, `tool_observations`, `usage`); an
//! example program is `impl/tests/fixtures/echo_agent.py`. At most
//! `limits.active_executions` programs run at once. See
//! `contract_impl::core_runtime::adapter::command`. With it, the registered agent kinds
//! are the adapter's own declaration (kind `command`); `agent_kinds` in the launch
//! configuration is ignored, so a configuration can never over-declare the program.
//!
//! Logs go to stderr through `tracing` (`RUST_LOG`, default `info`).
//!
//! # Exit codes
//! | code | meaning |
//! |---|---|
//! | 0 | `device_shutdown` completed (every Executor closed, WebSocket closed 1000); SIGTERM or SIGINT and every Executor closed; or `schema` printed |
//! | 1 | runtime failure: Executors still owned `SIGNAL_SHUTDOWN_BOUND` after SIGTERM or SIGINT; the workspace cannot be bound, the controlled adapter cannot connect, the command adapter's program or working directory is unusable |
//! | 2 | usage error (missing or invalid arguments, missing credential, `--control-socket` missing with `--adapter controlled`, `--command-program` missing with `--adapter command`, `--command-stdin close` with `--command-protocol jsonl`) |
//! | 3 | invalid launch configuration, including `invalid_capability_declaration` (the message names the key or field) |
//!
//! A permanent connection rejection (`incompatible_version`, 401, 403) closes every
//! Executor and does not exit:
//! the daemon logs it once and idles until killed, as the launch contract expects.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use contract_impl::core_runtime::adapter::HarnessAdapter;
use contract_impl::core_runtime::adapter::command::{
    CommandAdapter, CommandConfig, ProgramProtocol, StdinMode,
};
use contract_impl::core_runtime::adapter::controlled::ControlledAdapter;
use contract_impl::core_runtime::daemon::{self, ConnectOptions, Credential, RuntimeConfig};
use contract_impl::core_runtime::workspace::Workspace;

/// Exit code: runtime failure.
const EXIT_FAILURE: u8 = 1;
/// Exit code: usage error.
const EXIT_USAGE: u8 = 2;
/// Exit code: invalid launch configuration.
const EXIT_CONFIG: u8 = 3;

/// Environment variable holding the daemon credential (the only source of it).
const CREDENTIAL_ENV: &str = "CONTRACT_DAEMON_CREDENTIAL";

#[derive(Debug, Parser)]
#[command(
    name = "contract-impl",
    version,
    about = "Reference implementations of the runtime-contract protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the Core ↔ Runtime daemon (docs/launch-contract.md).
    Runtime(RuntimeArgs),
    /// Run Core (`core serve`) or administer daemon credentials (`core credential …`).
    Core(contract_impl::core_runtime::gateway::cli::CoreArgs),
    /// Worker protocol programs (`worker python`: the Python worker, exec'd in place).
    Worker {
        /// What to run.
        #[command(subcommand)]
        what: WorkerCommand,
    },
    /// The local engine protocol (`engine serve`: the daemon).
    Engine(contract_impl::engine::cli::EngineArgs),
    /// The tool plugin protocol (`plugin fixture`: the conformance fixture plugin).
    Plugin(contract_impl::plugin::cli::PluginArgs),
    /// Print a protocol's JSON Schema.
    Schema {
        /// The protocol family.
        #[arg(value_enum)]
        family: Family,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Family {
    /// The Core ↔ Runtime protocol.
    #[value(name = "core_runtime")]
    CoreRuntime,
    /// The worker protocol.
    Worker,
}

#[derive(Debug, Subcommand)]
enum WorkerCommand {
    /// Replace this process with the Python worker (docs/worker-launch-contract.md).
    Python {
        /// `different`: the worker makes every choice the spec leaves free otherwise
        /// (exit statuses, texts, record grouping), for vendor-mode trials.
        #[arg(long, value_enum, default_value_t = WireProfileArg::Reference)]
        profile: WireProfileArg,
        /// The skills set the host materialized (docs/worker-launch-contract.md, "Skills").
        #[arg(long)]
        skills: Option<PathBuf>,
    },
    /// Start a workbench and run cells: from `--file` (cells separated by lines `# %%`),
    /// else from stdin; print each cell's output (`--json`: one JSON object per cell).
    Run {
        /// Cells to run.
        #[arg(long)]
        file: Option<PathBuf>,
        /// One JSON object per cell on stdout instead of text.
        #[arg(long)]
        json: bool,
        /// Bound of each cell in seconds (past it the worker is stopped).
        #[arg(long)]
        cell_timeout: Option<f64>,
        /// The worker program and its arguments (default: this binary's Python worker).
        #[arg(last = true)]
        program: Vec<std::ffi::OsString>,
    },
    /// Measure the host ↔ worker round trip against a bare socket ping-pong (`make bench`).
    Bench {
        /// Round trips per figure.
        #[arg(long, default_value_t = 2000)]
        rounds: usize,
    },
    /// The controlled host: driven over `CONTRACT_HOST_CONTROL_SOCKET`, its workers run
    /// `CONTRACT_WORKER_PROGRAM` (docs/worker-host-control.md).
    Host {
        /// Where the activation epoch, the operator lane and the managed skills
        /// (`<data>/skills`) live (made 0700).
        #[arg(
            long,
            env = "CONTRACT_HOST_DATA_DIR",
            default_value = "worker-host-data"
        )]
        data_dir: PathBuf,
        /// The workspace: the cells' source work (`workspace.run`; made 0700 when
        /// missing) and the builtin skills (`<workspace>/skills` unless
        /// `KLBR_SKILLS_DIR` names them); default `workspace` under the data directory.
        #[arg(long, env = "CONTRACT_WORKSPACE")]
        workspace: Option<PathBuf>,
        /// `different`: every choice the spec leaves free made otherwise (operation IDs,
        /// codes, session and generation names), for vendor-mode trials.
        #[arg(long, value_enum, default_value_t = WireProfileArg::Reference)]
        profile: WireProfileArg,
    },
    /// Run PROGRAM as a supervised worker (what the host spawns; docs/worker-launch-contract.md).
    Supervise {
        /// End by the worker's signal when a signal ended it (instead of exiting 128 +
        /// signal): what the command adapter asks for.
        #[arg(long)]
        reraise_signal: bool,
        /// The worker program and its arguments.
        #[arg(last = true, required = true)]
        program: Vec<std::ffi::OsString>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AdapterKind {
    /// The controlled Harness adapter, driven over the control channel.
    Controlled,
    /// The command adapter: runs `--command-program` once per Turn.
    Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CommandStdin {
    /// Close stdin after the Turn input (the program sees EOF).
    Close,
    /// Keep stdin open for active input.
    Open,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CommandProtocol {
    /// Input text on stdin, stdout lines as deltas, exit status as the outcome.
    Plain,
    /// One JSON record per line in both directions (see the command adapter's docs).
    Jsonl,
}

#[derive(Debug, clap::Args)]
struct RuntimeArgs {
    /// Base URL of Core (bootstrap is POSTed to {core-url}/api/v1/agent-daemon/bootstrap).
    #[arg(long, env = "CONTRACT_CORE_URL")]
    core_url: String,
    /// Device ID to present.
    #[arg(long, env = "CONTRACT_DEVICE_ID")]
    device_id: String,
    /// Launch configuration (JSON); absent = every spec default.
    #[arg(long, env = "CONTRACT_RUNTIME_CONFIG")]
    config: Option<PathBuf>,
    /// Unix socket of the controlled adapter's control channel (required with
    /// `--adapter controlled`).
    #[arg(long, env = "CONTRACT_CONTROL_SOCKET")]
    control_socket: Option<PathBuf>,
    /// Workspace directory the Runtime is bound to.
    #[arg(long, env = "CONTRACT_WORKSPACE")]
    workspace: PathBuf,
    /// Harness adapter.
    #[arg(long, value_enum, default_value = "controlled")]
    adapter: AdapterKind,
    /// Program the command adapter runs per Turn (a path, or a name found in PATH).
    #[arg(long)]
    command_program: Option<PathBuf>,
    /// One argument of the program (repeat in order; no shell is involved).
    #[arg(long = "command-arg", allow_hyphen_values = true)]
    command_args: Vec<std::ffi::OsString>,
    /// Working directory of the program (default: the workspace directory).
    #[arg(long)]
    command_cwd: Option<PathBuf>,
    /// Program protocol.
    #[arg(long, value_enum, default_value = "plain")]
    command_protocol: CommandProtocol,
    /// Stdin of the program after the Turn input (default: `close` with the plain
    /// protocol, `open` with jsonl, which refuses `close`).
    #[arg(long, value_enum)]
    command_stdin: Option<CommandStdin>,
    /// How to make the choices the spec leaves free: `reference` (ours: revisions from
    /// 1 in steps of 1, heartbeat IDs `hb-<n>`) or `different` (another conformant
    /// Runtime: revisions from 100 in steps of 7, heartbeat IDs `beat-<n>`).
    #[arg(long, value_enum, default_value = "reference")]
    wire_profile: WireProfileArg,
}

/// `--wire-profile`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum WireProfileArg {
    /// Our reference choices.
    Reference,
    /// Another conformant set of choices.
    Different,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Schema { family } => {
            let schema = match family {
                Family::CoreRuntime => contract_impl::core_runtime::wire::json_schema(),
                Family::Worker => contract_impl::worker::wire::json_schema(),
            };
            match serde_json::to_string_pretty(&schema) {
                Ok(text) => {
                    // A closed stdout (`| head`) is not an error of ours.
                    let _ = writeln!(std::io::stdout(), "{text}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("cannot render the schema: {err}");
                    ExitCode::from(EXIT_FAILURE)
                }
            }
        }
        Command::Worker {
            what:
                WorkerCommand::Supervise {
                    program,
                    reraise_signal,
                },
        } => ExitCode::from(
            u8::try_from(contract_impl::process::supervise::run_with(
                &program,
                reraise_signal,
            ))
            .unwrap_or(1),
        ),
        Command::Worker {
            what:
                WorkerCommand::Run {
                    file,
                    json,
                    cell_timeout,
                    program,
                },
        } => worker_run(file, json, cell_timeout, program),
        Command::Worker {
            what: WorkerCommand::Bench { rounds },
        } => worker_bench(rounds),
        Command::Engine(args) => contract_impl::engine::cli::run(args),
        Command::Plugin(args) => contract_impl::plugin::cli::run(args),
        Command::Worker {
            what:
                WorkerCommand::Host {
                    data_dir,
                    workspace,
                    profile,
                },
        } => worker_host(
            &data_dir,
            workspace.as_deref(),
            matches!(profile, WireProfileArg::Different),
        ),
        Command::Worker {
            what: WorkerCommand::Python { profile, skills },
        } => {
            let err = contract_impl::worker::python::exec(
                matches!(profile, WireProfileArg::Different),
                skills.as_deref(),
            );
            eprintln!(
                "error: cannot start {}: {err}",
                contract_impl::worker::python::interpreter().to_string_lossy()
            );
            ExitCode::from(EXIT_FAILURE)
        }
        Command::Runtime(args) => runtime(args),
        Command::Core(args) => contract_impl::core_runtime::gateway::cli::run(args),
    }
}

/// The Tokio runtime of a command, or the exit code after saying why there is none.
fn async_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Runtime::new().map_err(|err| {
        eprintln!("error: cannot start the async runtime: {err}");
        ExitCode::from(EXIT_FAILURE)
    })
}

/// `worker host`: the controlled host until its control channel ends or SIGTERM.
fn worker_host(
    data_dir: &std::path::Path,
    workspace: Option<&std::path::Path>,
    different: bool,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("contract-impl worker host: {e}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(contract_impl::worker::controlled::run(
        data_dir, workspace, different,
    ));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `worker bench`: the three figures of `contract_impl::worker::bench`, with ratios.
fn worker_bench(rounds: usize) -> ExitCode {
    use contract_impl::worker::bench;
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::from(EXIT_FAILURE);
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let program = vec![exe.into_os_string(), "worker".into(), "python".into()];
        let floor = bench::floor(rounds).await;
        let protocol = bench::protocol(program, rounds).await;
        match (floor, protocol) {
            (Ok(floor), Ok((cell, request))) => {
                let f = floor.median_us;
                println!("worker bench ({rounds} rounds, medians):");
                println!("  floor: framed ping-pong with a Python echo  {f:9.1} µs");
                println!(
                    "  empty cell (execute → completed)           {:9.1} µs   {:5.1}× the floor",
                    cell.median_us,
                    cell.median_us / f
                );
                println!(
                    "  host request (host_request → host_reply)   {:9.1} µs   {:5.1}× the floor",
                    request.median_us,
                    request.median_us / f
                );
                ExitCode::SUCCESS
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_FAILURE)
            }
        }
    })
}

/// `worker run`: a workbench, the cells of `file` (or stdin) in order, their outputs.
/// Exit 0 when every cell ended `ok`, 1 otherwise, 2 when the worker cannot start.
fn worker_run(
    file: Option<PathBuf>,
    json: bool,
    cell_timeout: Option<f64>,
    program: Vec<std::ffi::OsString>,
) -> ExitCode {
    use contract_impl::worker::host::{BasicServices, HostConfig, SHUTDOWN_GRACE, Worker};
    use contract_impl::worker::wire::{CellStatus, Stream};
    let source = match &file {
        Some(path) => std::fs::read_to_string(path),
        None => std::io::read_to_string(std::io::stdin()),
    };
    let source = match source {
        Ok(source) => source,
        Err(err) => {
            eprintln!("error: cannot read the cells: {err}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut cells: Vec<String> = vec![String::new()];
    for line in source.split_inclusive('\n') {
        if line.trim_end() == "# %%" {
            cells.push(String::new());
        } else if let Some(last) = cells.last_mut() {
            last.push_str(line);
        }
    }
    cells.retain(|c| !c.trim().is_empty());
    let program = if program.is_empty() {
        match std::env::current_exe() {
            Ok(exe) => vec![exe.into_os_string(), "worker".into(), "python".into()],
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::from(EXIT_FAILURE);
            }
        }
    } else {
        program
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        // The user's cells run where the user runs them (relative paths mean theirs).
        let mut config = HostConfig::workbench(program);
        config.cwd = std::env::current_dir().ok();
        config.cell_timeout = cell_timeout
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(std::time::Duration::from_secs_f64);
        let mut worker = match Worker::spawn(config).await {
            Ok(worker) => worker,
            Err(err) => {
                eprintln!("error: {err} ({})", err.code());
                return ExitCode::from(EXIT_USAGE);
            }
        };
        let mut all_ok = true;
        let mut services = BasicServices;
        for (index, code) in cells.iter().enumerate() {
            // SIGINT or SIGTERM: stop the worker (every process of it) and say so.
            let interrupted = async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async {
                        match term.as_mut() {
                            Some(t) => {
                                t.recv().await;
                            }
                            None => std::future::pending::<()>().await,
                        }
                    } => {}
                }
            };
            let outcome = tokio::select! {
                outcome = worker.execute(code, &mut services) => Some(outcome),
                () = interrupted => None,
            };
            let Some(outcome) = outcome else {
                worker.hard_stop().await;
                eprintln!(
                    "interrupted: the worker was stopped; {} cell(s) not run",
                    cells.len() - index
                );
                drop(worker);
                return ExitCode::from(130);
            };
            let record = match outcome {
                Ok(record) => record,
                Err(err) => {
                    eprintln!("error: {err} ({})", err.code());
                    all_ok = false;
                    break;
                }
            };
            all_ok &= record.status == Some(CellStatus::Ok);
            if json {
                let line = serde_json::json!({
                    "id": record.id,
                    "status": record.status,
                    "output": record.output,
                    "truncated_bytes": record.truncated_bytes,
                    "error": record.error,
                    "observed_by_host": record.observed_by_host,
                });
                let _ = writeln!(std::io::stdout(), "{line}");
            } else {
                let mut stdout = std::io::stdout();
                for out in &record.output {
                    let _ = match out.stream {
                        Stream::Stdout => write!(stdout, "{}", out.text),
                        Stream::Stderr => write!(std::io::stderr(), "{}", out.text),
                        Stream::Result => writeln!(stdout, "{}", out.text),
                    };
                }
                let _ = stdout.flush();
                if record.truncated_bytes > 0 {
                    eprintln!("[{} bytes of output discarded]", record.truncated_bytes);
                }
                if let Some(error) = &record.error {
                    eprint!("{error}");
                    if !error.ends_with('\n') {
                        eprintln!();
                    }
                }
            }
            if record.observed_by_host {
                let left = cells.len() - index - 1;
                if left > 0 {
                    eprintln!("the worker is gone: {left} cell(s) not run");
                }
                break;
            }
        }
        worker.shutdown(SHUTDOWN_GRACE).await;
        if all_ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILURE)
        }
    })
}

fn runtime(args: RuntimeArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let credential = match std::env::var(CREDENTIAL_ENV) {
        Ok(value) if !value.is_empty() => Credential::new(value),
        _ => {
            eprintln!("error: {CREDENTIAL_ENV} must be set to the daemon credential");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let config = match &args.config {
        Some(path) => RuntimeConfig::load(path),
        None => Ok(RuntimeConfig::default()),
    };
    let mut config = match config {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {} ({})", err, err.code());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let WireProfileArg::Different = args.wire_profile {
        config.profile = contract_impl::core_runtime::daemon::config::WireProfile::different();
    }
    let workspace = match Workspace::new(&args.workspace) {
        Ok(workspace) => workspace,
        Err(err) => {
            eprintln!(
                "error: cannot bind the workspace {}: {err}",
                args.workspace.display()
            );
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let adapter: Arc<dyn HarnessAdapter> = match args.adapter {
            AdapterKind::Controlled => {
                let Some(control_socket) = &args.control_socket else {
                    eprintln!("error: --adapter controlled needs --control-socket (or CONTRACT_CONTROL_SOCKET)");
                    return ExitCode::from(EXIT_USAGE);
                };
                match ControlledAdapter::connect(control_socket, config.agent_kinds.clone()).await
                {
                    Ok(adapter) => adapter,
                    Err(err) => {
                        eprintln!(
                            "error: cannot connect the controlled adapter to {}: {err}",
                            control_socket.display()
                        );
                        return ExitCode::from(EXIT_FAILURE);
                    }
                }
            }
            AdapterKind::Command => {
                let Some(program) = &args.command_program else {
                    eprintln!("error: --adapter command needs --command-program");
                    return ExitCode::from(EXIT_USAGE);
                };
                let cwd = args
                    .command_cwd
                    .clone()
                    .unwrap_or_else(|| workspace.root().to_path_buf());
                let mut command = CommandConfig::new(program, cwd);
                command.args = args.command_args.clone();
                match std::env::current_exe() {
                    Ok(exe) => command.supervisor = Some(exe),
                    Err(e) => {
                        eprintln!("error: cannot find this executable to supervise programs: {e}");
                        return ExitCode::from(EXIT_USAGE);
                    }
                }
                (command.protocol, command.stdin) =
                    match (args.command_protocol, args.command_stdin) {
                        (CommandProtocol::Plain, None | Some(CommandStdin::Close)) => {
                            (ProgramProtocol::Plain, StdinMode::Close)
                        }
                        (CommandProtocol::Plain, Some(CommandStdin::Open)) => {
                            (ProgramProtocol::Plain, StdinMode::Open)
                        }
                        (CommandProtocol::Jsonl, None | Some(CommandStdin::Open)) => {
                            (ProgramProtocol::Jsonl, StdinMode::Open)
                        }
                        (CommandProtocol::Jsonl, Some(CommandStdin::Close)) => {
                            eprintln!(
                                "error: --command-protocol jsonl keeps stdin open for active input; drop --command-stdin close"
                            );
                            return ExitCode::from(EXIT_USAGE);
                        }
                    };
                command.max_processes = config.limits.active_executions;
                match CommandAdapter::new(command) {
                    Ok(adapter) => {
                        config.agent_kinds = adapter.declarations();
                        adapter
                    }
                    Err(err) => {
                        eprintln!("error: command adapter: {err} ({})", err.code());
                        return ExitCode::from(EXIT_FAILURE);
                    }
                }
            }
        };
        let options = ConnectOptions {
            core_url: args.core_url,
            device_id: args.device_id,
            credential,
        };
        let end = daemon::run_daemon(config, adapter.clone(), workspace, options).await;
        adapter.finish().await;
        match end {
            daemon::DaemonEnd::DeviceShutdown => {
                tracing::info!("device_shutdown completed; exiting");
                ExitCode::SUCCESS
            }
            daemon::DaemonEnd::Signalled => {
                tracing::info!("every Executor closed; exiting");
                ExitCode::SUCCESS
            }
            daemon::DaemonEnd::SignalledUndrained => ExitCode::from(EXIT_FAILURE),
        }
    })
}
