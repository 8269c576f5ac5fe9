//! `contract-impl core …`: the Core server, its credential administration and the
//! operator settlement of write reservations.
//!
//! ```text
//! contract-impl core serve [--listen ADDR] [--data-dir DIR] [--config FILE]
//! contract-impl core credential issue  --data-dir DIR --device-id ID
//! contract-impl core credential revoke --data-dir DIR --credential-id ID
//! contract-impl core credential list   --data-dir DIR
//! contract-impl core write settle --data-dir DIR --write-id ID --state committed|rejected
//! ```
//!
//! `write settle` is the operator's explicit settlement of an `unknown` write
//! reservation ("Workspace operations": blocked "until exactly settled"; Core never
//! replays the write): the operator attests, from the workspace, whether the file was
//! installed. Exit code 2 when the reservation is not `reserved`.
//!
//! `serve` reads `CONTRACT_LISTEN`, `CONTRACT_DATA_DIR`, `CONTRACT_CORE_CONFIG` when the
//! flags are absent, provisions `CONTRACT_DEVICE_ID` / `CONTRACT_DAEMON_CREDENTIAL`
//! (stored hashed) when both are set, and prints
//! `{"ready":{"base_url":"http://127.0.0.1:<port>"}}` on stdout once listening. The
//! daemon credential is never logged; `issue` prints the new secret once, on stdout.
//!
//! Exit codes: 0 success; 1 runtime failure (storage, bind); 2 usage error (unknown
//! credential ID, refused secret); 3 invalid configuration.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{CoreConfig, now_ms};
use crate::core_runtime::store::credential::{generate_credential_id, generate_secret};
use crate::core_runtime::store::{CoreStore, SqliteStore, StoreError, WriteState};

/// Environment variable of the device provisioned at start-up.
pub const DEVICE_ENV: &str = "CONTRACT_DEVICE_ID";
/// Environment variable of the daemon credential provisioned at start-up (secret).
pub const CREDENTIAL_ENV: &str = "CONTRACT_DAEMON_CREDENTIAL";

/// The Project API key of the public `/v1` API (no flag: it never shows in a process
/// listing). Absent: Core keeps one in [`API_KEY_FILE`] of its data directory, minted on
/// first start (mode 0600), and logs the file's path, never the key.
pub const API_KEY_ENV: &str = "CONTRACT_API_KEY";

/// The file of the minted Project API key, in the data directory.
pub const API_KEY_FILE: &str = "api-key";

/// The Project API key: [`API_KEY_ENV`], else the data directory's [`API_KEY_FILE`]
/// (minted, 0600, when missing).
///
/// # Errors
/// The key file cannot be read or written.
pub fn api_key(data_dir: &std::path::Path) -> Result<String, String> {
    if let Ok(key) = std::env::var(API_KEY_ENV)
        && !key.is_empty()
    {
        return Ok(key);
    }
    let path = data_dir.join(API_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(key) if !key.trim().is_empty() => return Ok(key.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let key = format!("cpk-{}", uuid::Uuid::new_v4().simple());
    crate::private_fs::create_private(&path, format!("{key}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    tracing::info!(path = %path.display(), "minted the Project API key of the public API");
    Ok(key)
}
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:0";

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_CONFIG: u8 = 3;

/// `contract-impl core` arguments.
#[derive(Debug, Args)]
pub struct CoreArgs {
    #[command(subcommand)]
    command: CoreCommand,
}

#[derive(Debug, Subcommand)]
enum CoreCommand {
    /// Run the Core server.
    Serve(ServeArgs),
    /// Issue, revoke or list daemon credentials.
    #[command(subcommand)]
    Credential(CredentialCommand),
    /// Settle durable write reservations.
    #[command(subcommand)]
    Write(WriteCommand),
    /// A burst Turn through Core, the Runtime and the command adapter against its floors
    /// (`make bench`; a benchmark, not a test).
    Bench {
        /// Lines of 100 bytes the program writes at once.
        #[arg(long, default_value_t = crate::core_runtime::bench::DEFAULT_LINES)]
        lines: usize,
    },
}

#[derive(Debug, Subcommand)]
enum WriteCommand {
    /// Explicitly settle an `unknown` write reservation (it stays blocking until then).
    Settle {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Write reservation ID (`write-…`).
        #[arg(long)]
        write_id: String,
        /// The attested outcome.
        #[arg(long, value_enum)]
        state: SettledState,
    },
}

/// The outcome an operator can attest for an `unknown` write.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SettledState {
    /// The file was installed.
    Committed,
    /// Nothing was installed.
    Rejected,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "CONTRACT_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: String,
    /// Directory of Core's durable records.
    #[arg(long, env = "CONTRACT_DATA_DIR")]
    data_dir: PathBuf,
    /// Core launch configuration (JSON).
    #[arg(long, env = "CONTRACT_CORE_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum CredentialCommand {
    /// Issue a daemon credential (`rcd_…`) for a device; prints the secret once.
    Issue {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Device ID.
        #[arg(long)]
        device_id: String,
    },
    /// Revoke a credential by ID.
    Revoke {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Credential ID (`cred_…`).
        #[arg(long)]
        credential_id: String,
    },
    /// List credentials (IDs, devices, prefixes; never secrets).
    List {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
    },
}

fn open(dir: &std::path::Path) -> Result<SqliteStore, ExitCode> {
    SqliteStore::open(dir).map_err(|e| {
        eprintln!(
            "error: cannot open the Core store in {}: {e} ({})",
            dir.display(),
            e.code()
        );
        ExitCode::from(EXIT_FAILURE)
    })
}

/// Runs `contract-impl core …`.
pub fn run(args: CoreArgs) -> ExitCode {
    match args.command {
        CoreCommand::Serve(args) => serve(args),
        CoreCommand::Credential(cmd) => credential(cmd),
        CoreCommand::Write(cmd) => write(cmd),
        CoreCommand::Bench { lines } => bench(lines),
    }
}

fn bench(lines: usize) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(crate::core_runtime::bench::run(lines)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn write(cmd: WriteCommand) -> ExitCode {
    let WriteCommand::Settle {
        data_dir,
        write_id,
        state,
    } = cmd;
    let mut store = match open(&data_dir) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let state = match state {
        SettledState::Committed => WriteState::Committed,
        SettledState::Rejected => WriteState::Rejected,
    };
    match store.settle_write(&write_id, state) {
        Ok(()) => {
            println!(
                "{}",
                serde_json::json!({ "write_id": write_id, "state": state.as_str() })
            );
            ExitCode::SUCCESS
        }
        Err(e @ StoreError::InvalidState(_)) => {
            eprintln!("error: {e} ({})", e.code());
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("error: {e} ({})", e.code());
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn credential(cmd: CredentialCommand) -> ExitCode {
    match cmd {
        CredentialCommand::Issue {
            data_dir,
            device_id,
        } => {
            let mut store = match open(&data_dir) {
                Ok(s) => s,
                Err(c) => return c,
            };
            let secret = generate_secret();
            match store.add_credential(&generate_credential_id(), &device_id, &secret, now_ms()) {
                Ok(id) => {
                    println!(
                        "{}",
                        serde_json::json!({ "credential_id": id, "device_id": device_id, "secret": secret })
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e} ({})", e.code());
                    ExitCode::from(EXIT_FAILURE)
                }
            }
        }
        CredentialCommand::Revoke {
            data_dir,
            credential_id,
        } => {
            let mut store = match open(&data_dir) {
                Ok(s) => s,
                Err(c) => return c,
            };
            match store.revoke_credential(&credential_id, now_ms()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("error: no active credential `{credential_id}`");
                    ExitCode::from(EXIT_USAGE)
                }
                Err(e) => {
                    eprintln!("error: {e} ({})", e.code());
                    ExitCode::from(EXIT_FAILURE)
                }
            }
        }
        CredentialCommand::List { data_dir } => {
            let mut store = match open(&data_dir) {
                Ok(s) => s,
                Err(c) => return c,
            };
            match store.list_credentials() {
                Ok(list) => {
                    for c in list {
                        println!("{}", serde_json::to_string(&c).unwrap_or_default());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e} ({})", e.code());
                    ExitCode::from(EXIT_FAILURE)
                }
            }
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let config = match &args.config {
        Some(path) => CoreConfig::load(path),
        None => Ok(CoreConfig::default()),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e} ({})", e.code());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut store = match open(&args.data_dir) {
        Ok(s) => s,
        Err(c) => return c,
    };
    if let Some(max) = config.events_per_turn {
        store = store.with_events_max(max);
    }
    if let (Ok(device), Ok(secret)) = (std::env::var(DEVICE_ENV), std::env::var(CREDENTIAL_ENV))
        && !device.is_empty()
        && !secret.is_empty()
        && let Err(e) = store.add_credential(&generate_credential_id(), &device, &secret, now_ms())
    {
        eprintln!(
            "error: cannot provision the daemon credential from {CREDENTIAL_ENV}: {e} ({})",
            e.code()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let key = match api_key(&args.data_dir) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("error: cannot read or mint the Project API key: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let result = runtime.block_on(super::serve(
        &args.listen,
        Box::new(store),
        config,
        &key,
        |base_url| {
            use std::io::Write;
            let mut out = std::io::stdout();
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({ "ready": { "base_url": base_url } })
            );
            let _ = out.flush();
        },
    ));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
