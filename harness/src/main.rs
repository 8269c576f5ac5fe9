//! `contract-harness`: the command-line front of the conformance harness.
//!
//! ```text
//! contract-harness run --family core_runtime --side runtime --target-cmd '…'
//!     [--scenarios DIR] [--golden-dir DIR] [--filter SUBSTR] [--accept | --pending]
//!     [--step-timeout 5s] [--startup-timeout 10s] [--jobs N] [--mode strict|vendor]
//!     [--junit FILE] [--json FILE] [--markdown FILE]
//!     [--expected-failures FILE] [--write-expected-failures FILE] [--conformance FILE]
//!     [--wire-log DIR] [--features FILE] [--refusals]
//! contract-harness features --family core_runtime
//! contract-harness coverage --family core_runtime [--scenarios DIR] [--markdown FILE]
//! contract-harness list --family core_runtime [--scenarios DIR]
//! contract-harness golden review [--golden-dir DIR]
//! contract-harness golden accept [--golden-dir DIR]
//! contract-harness golden refresh [--impl BIN] [--family F]
//! contract-harness golden changes [--base REV] [--json]
//! contract-harness golden audit [--family F]
//! contract-harness golden stable [--impl BIN] [--family F] [--sample N] [--jobs N]
//! contract-harness sides
//! contract-harness diff --family F --side S --target-cmd '…' --against-cmd '…'
//! contract-harness peer relay --socket PATH [-- ARGS…]
//! ```
//!
//! Exit status: 0 success; 1 a scenario failed (or coverage has errors); 2 usage errors
//! and scenario files that do not load (printed as `file:line:column: message`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use contract_harness::golden::{self, GoldenMode};
use contract_harness::report::{self, ScenarioResult};
use contract_harness::requirements;
use contract_harness::runner::{self, Mode, RunOptions};
use contract_harness::scenario::loader::parse_duration;
use contract_harness::scenario::{self, LoadError, Scenario, Side, load_family};
use contract_harness::{baseline, differential, family};

/// Set once stdout is gone (`… | head`): later output is dropped.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `println!` that, when stdout is gone, drops the output instead of panicking: the run
/// goes on, so every target is still stopped and reaped, and the exit status still
/// reports the results.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        use std::sync::atomic::Ordering;
        if !crate::STDOUT_GONE.load(Ordering::Relaxed)
            && writeln!(std::io::stdout(), $($arg)*).is_err()
        {
            crate::STDOUT_GONE.store(true, Ordering::Relaxed);
        }
    }};
}

/// `eprintln!` that, when stderr is gone (`2>&-`, or a closed pipe), drops the text instead
/// of panicking: a diagnostic must never change the exit status or leave a target unreaped.
macro_rules! warn {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` as [`say!`]: the text as is, no newline added.
macro_rules! say_text {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        use std::sync::atomic::Ordering;
        if !crate::STDOUT_GONE.load(Ordering::Relaxed)
            && write!(std::io::stdout(), $($arg)*).is_err()
        {
            crate::STDOUT_GONE.store(true, Ordering::Relaxed);
        }
    }};
}

// After the macros, which it prints with.
mod golden_cli;

/// Scripted-peer conformance harness for the runtime-contract protocols.
#[derive(Debug, Parser)]
#[command(name = "contract-harness", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run scenarios against a target (one line per scenario, then `N passed, M failed`).
    Run(Box<RunArgs>),
    /// Print requirement coverage of a family's scenarios.
    Coverage(CoverageArgs),
    /// List a family's scenarios and the sides they run on.
    List(FamilyArgs),
    /// Print a complete features file of a family (every optional feature `true`) to
    /// edit and pass to `run --features`.
    Features {
        /// Protocol family, e.g. `core_runtime`.
        #[arg(long)]
        family: String,
    },
    /// Review or accept pending golden files.
    Golden {
        #[command(subcommand)]
        action: GoldenAction,
    },
    /// Every family × side of the registry: `family side contract-impl-arguments`.
    Sides,
    /// Run every scenario of a side against two targets and report, per scenario, step
    /// and field, where their normalized transcripts differ (no goldens needed).
    Diff(DiffArgs),
    /// Be the peer a target launches itself, relayed to a running harness.
    Peer {
        #[command(subcommand)]
        mode: PeerMode,
    },
}

#[derive(Debug, Subcommand)]
enum PeerMode {
    /// Connect back to the harness at `--socket` and relay this process's launch, stdio
    /// and sockets to it; exit with the code it says, or at once when it goes away.
    Relay {
        /// The harness's relay socket.
        #[arg(long, env = "CONTRACT_RELAY_SOCKET")]
        socket: PathBuf,
        /// Whatever the target passes after `--` (recorded in the hello).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct FamilyArgs {
    /// Protocol family (scenario subdirectory), e.g. `core_runtime`.
    #[arg(long)]
    family: String,
    /// Scenario root directory.
    #[arg(long, default_value = "scenarios")]
    scenarios: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    family: FamilyArgs,
    /// The side under test, one the family has (`contract-harness list --family F`
    /// names them; core_runtime: `runtime` or `core`).
    #[arg(long)]
    side: String,
    /// Command that starts the target (split like a POSIX shell, no shell involved).
    #[arg(long)]
    target_cmd: String,
    /// Your own golden root directory: golden differences then fail the run in every
    /// mode. Left out: the reference goldens (`golden/`, or those embedded in this
    /// binary), whose differences are advisory (`DIFF`) in vendor mode.
    #[arg(long)]
    golden_dir: Option<PathBuf>,
    /// Only scenarios whose ID (`family/name`) contains this text; a whole scenario ID
    /// selects that scenario alone.
    #[arg(long)]
    filter: Option<String>,
    /// Write the emitted goldens in place (missing and different ones).
    #[arg(long, conflicts_with = "pending")]
    accept: bool,
    /// On a golden difference, write `<golden>.pending` for review (the run still fails).
    #[arg(long)]
    pending: bool,
    /// Deadline of every step (`200ms`, `5s`).
    #[arg(long, default_value = "5s", value_parser = parse_cli_duration)]
    step_timeout: Duration,
    /// Deadline for the target to become ready.
    #[arg(long, default_value = "10s", value_parser = parse_cli_duration)]
    startup_timeout: Duration,
    /// `strict` (default; our own runs): `reference:` steps are asserted like any other.
    /// `vendor` (a third party's run): a failure inside a `reference:` step is reported
    /// as `DIFF` (a difference from the reference behaviour, with the requirement), not
    /// as a failure.
    #[arg(long, default_value = "strict", value_parser = parse_mode)]
    mode: Mode,
    /// Runs at once, at least 1 (default: available parallelism).
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Stop at the first failed scenario: the runs in flight are cancelled (their
    /// targets killed) and the rest is not run (`ABORTED: ...`). For a judge that needs
    /// one failure, such as mutation testing.
    #[arg(long)]
    fail_fast: bool,
    /// Write a JUnit XML report here.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Write a JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a Markdown report here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// A baseline of expected failures (YAML: side → scenario ID → reason): the run
    /// passes while only listed scenarios fail, and fails on a listed one that passes
    /// (stale: remove it from the baseline).
    #[arg(long)]
    expected_failures: Option<PathBuf>,
    /// Write today's failures as a starting baseline here.
    #[arg(long)]
    write_expected_failures: Option<PathBuf>,
    /// Write each scenario's wire log here: `<dir>/<family>/<name>.<side>.wire.jsonl`,
    /// every frame both ways (as sent and received, the family's masks applied and the
    /// secret redacted) with its step and its time since the run started, so a failure
    /// can be read without rerunning.
    #[arg(long)]
    wire_log: Option<PathBuf>,
    /// Write the conformance report here: every requirement of the family's catalog
    /// with its status for this target on this side (`pass`, `fail`, `differs`,
    /// `not applicable`, `not run`, `uncovered`), in both formats: Markdown and JSON,
    /// the named file in its own (JSON when its name ends in `.json`) and the other next
    /// to it (`report.md` and `report.json`).
    #[arg(long)]
    conformance: Option<PathBuf>,
    /// What the target supports (`contract-harness features --family F` prints a
    /// complete file to edit): a scenario that requires a feature declared `false` is
    /// reported `not applicable` (never passed), and a refusal scenario that requires it
    /// `false` runs. Without it, every feature counts as supported (the full suite),
    /// unless the target declares otherwise on the wire (core_runtime: its heartbeat).
    #[arg(long)]
    features: Option<PathBuf>,
    /// Run only the refusal scenarios (those that `requires:` a feature `false`), each
    /// with the target launched lacking exactly the features it requires `false` and
    /// declaring every other as the target does (`--features`, or its heartbeat): proves,
    /// one capability at a time, that the target refuses what it declares unsupported,
    /// whatever it supports. For a family whose target declares what the harness
    /// launches it with (core_runtime side runtime: the launch configuration's agent
    /// kinds, which every heartbeat must declare exactly).
    #[arg(long)]
    refusals: bool,
}

#[derive(Debug, Args)]
struct DiffArgs {
    #[command(flatten)]
    family: FamilyArgs,
    /// The side under test.
    #[arg(long)]
    side: String,
    /// The target.
    #[arg(long)]
    target_cmd: String,
    /// The target it is compared against (ours, or the last release).
    #[arg(long)]
    against_cmd: String,
    /// Only scenarios whose ID contains this text (a whole ID: that scenario alone).
    #[arg(long)]
    filter: Option<String>,
    /// Runs at once (default: available parallelism).
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Deadline of every step (`200ms`, `5s`).
    #[arg(long, default_value = "5s", value_parser = parse_cli_duration)]
    step_timeout: Duration,
    /// Deadline for each target to become ready.
    #[arg(long, default_value = "10s", value_parser = parse_cli_duration)]
    startup_timeout: Duration,
    /// What both targets support (as `run --features`): scenarios requiring a feature
    /// declared `false` are left out, and the refusal scenarios of those are compared.
    #[arg(long)]
    features: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CoverageArgs {
    #[command(flatten)]
    family: FamilyArgs,
    /// Also write the coverage as Markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum GoldenAction {
    /// List pending goldens with their diff against the current golden.
    Review {
        /// Golden root directory.
        #[arg(long, default_value = "golden")]
        golden_dir: PathBuf,
    },
    /// Move every pending golden into place.
    Accept {
        /// Golden root directory.
        #[arg(long, default_value = "golden")]
        golden_dir: PathBuf,
    },
    /// Replay every family × side against our implementation, writing a `.pending`
    /// file for every golden that changed or is missing.
    Refresh(golden_cli::ImplArgs),
    /// The wire-change report: per scenario × side and step, every field that changed
    /// (`path: old → new`), frames added or removed, and the requirements the scenario
    /// covers, between the goldens at `--base` and the working tree (pending files
    /// first). Markdown, or JSON with `--json`.
    Changes {
        #[command(flatten)]
        places: golden_cli::Places,
        /// The base revision (default: the merge base of HEAD with the main branch).
        #[arg(long)]
        base: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List, per golden, the recorded frame fields no step of its scenario asserts
    /// (golden-only checks: in vendor mode they never fail a run).
    Audit {
        #[command(flatten)]
        places: golden_cli::Places,
        /// Only this family.
        #[arg(long)]
        family: Option<String>,
    },
    /// Check that goldens are stable: replay each side's scenarios one at a time and in
    /// parallel; the goldens written must be byte-identical.
    Stable {
        #[command(flatten)]
        args: golden_cli::ImplArgs,
        /// Only this many scenarios per side, spread over the family.
        #[arg(long)]
        sample: Option<usize>,
        /// Runs at once in the parallel replay (default: available parallelism, at
        /// least 2).
        #[arg(long, value_parser = parse_jobs)]
        jobs: Option<usize>,
    },
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    Mode::parse(text).ok_or_else(|| format!("unknown mode `{text}` (use `strict` or `vendor`)"))
}

fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("--jobs must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a number of jobs: {e}")),
    }
}

fn parse_cli_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err("a timeout must be positive".into());
    }
    Ok(d)
}

/// Exit status for usage and load errors.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Coverage(args) => coverage(args),
        Command::List(args) => list(&args),
        Command::Features { family } => {
            match contract_harness::scenario::families::table(&family) {
                Some(table) if table.features.is_empty() => {
                    warn!(
                        "family `{family}` has no optional feature: every scenario applies to \
                         every target (run takes no --features for it)"
                    );
                    ExitCode::from(EXIT_USAGE)
                }
                Some(table) => {
                    say_text!("{}", contract_harness::features::template(table));
                    ExitCode::SUCCESS
                }
                None => {
                    warn!(
                        "--family: unknown family `{family}` (known: {})",
                        contract_harness::scenario::families::family_names()
                    );
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::Golden { action } => golden_action(action),
        Command::Sides => golden_cli::print_sides(),
        Command::Diff(args) => diff(&args),
        Command::Peer {
            mode: PeerMode::Relay { socket, args: _ },
        } => relay_peer(&socket),
    }
}

/// The process's stdout for the relay peer: shutting it down (the harness's
/// `CloseStdout`) flushes it and points fd 1 at `/dev/null`, so the target reading the
/// peer's stdout sees its end (tokio's own shutdown of stdout only flushes).
struct ClosableStdout(tokio::io::Stdout);

impl tokio::io::AsyncWrite for ClosableStdout {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let flushed = std::pin::Pin::new(&mut self.0).poll_flush(cx);
        if let std::task::Poll::Ready(Ok(())) = flushed {
            let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
            nix::unistd::dup2_stdout(&null).map_err(std::io::Error::from)?;
        }
        flushed
    }
}

/// Exit status of a relay peer whose harness went away.
const EXIT_HARNESS_GONE: u8 = 1;

fn relay_peer(socket: &Path) -> ExitCode {
    use contract_harness::transport::relay::{Hello, PeerEnd, run_peer};
    let hello = Hello {
        argv: std::env::args().collect(),
        env: std::env::vars().collect(),
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        pid: std::process::id(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            warn!("contract-harness peer: {e}");
            return ExitCode::from(EXIT_HARNESS_GONE);
        }
    };
    let end = runtime.block_on(run_peer(
        socket,
        hello,
        tokio::io::stdin(),
        ClosableStdout(tokio::io::stdout()),
        tokio::io::stderr(),
    ));
    // Exit now: the stdin reader may still be blocked in a read.
    let code = match end {
        // An exit status is one byte: anything else is a failure, never a wrap to 0.
        Ok(PeerEnd::Exit(code)) if (0..=255).contains(&code) => code,
        Ok(PeerEnd::Exit(_)) => 255,
        Ok(PeerEnd::LinkGone) => i32::from(EXIT_HARNESS_GONE),
        Err(e) => {
            warn!("contract-harness peer: cannot reach the harness: {e}");
            i32::from(EXIT_HARNESS_GONE)
        }
    };
    std::process::exit(code)
}

fn load(args: &FamilyArgs) -> Result<Vec<Scenario>, ExitCode> {
    if family::family(&args.family).is_none() {
        warn!(
            "--family: unknown family `{}`; families: {}",
            args.family,
            family::known()
        );
        return Err(ExitCode::from(EXIT_USAGE));
    }
    load_family(&scenario_root(&args.scenarios), &args.family).map_err(|errors| {
        print_load_errors(&errors);
        ExitCode::from(EXIT_USAGE)
    })
}

fn print_load_errors(errors: &[LoadError]) {
    for e in errors {
        warn!("{e}");
    }
    warn!("{} scenario file error(s)", errors.len());
}

fn run(args: RunArgs) -> ExitCode {
    let side = match family::resolve(&args.family.family, &args.side) {
        Ok((_, side)) => side,
        Err(e) => {
            warn!("--family/--side: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // One usage error up front rather than one launch failure per scenario.
    if let Err(e) = contract_harness::target::resolve_program(&args.target_cmd) {
        warn!("--target-cmd: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let scenarios = match load(&args.family) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // A difference from the reference must name a `level: reference` requirement: a
    // required rule (or an unknown ID) under `reference:` or `$reference` would turn a
    // non-conformance into a mere DIFF in vendor mode.
    if let Ok(catalog) = requirements::load_catalog(&catalog_path(&args.family)) {
        let coverage = requirements::coverage(&catalog, &scenarios);
        if !coverage.misused_references.is_empty() {
            for (scenario, id) in &coverage.misused_references {
                warn!(
                    "scenario {scenario}: {id} is not a `level: reference` requirement of the \
                     catalog; a `reference:` step or `$reference` pattern must name one"
                );
            }
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let declared = match features_of(args.features.as_deref(), &args.family.family, side) {
        Ok(declared) => declared,
        Err(code) => return code,
    };
    if args.refusals
        && scenario::families::table(&args.family.family).and_then(|t| t.feature_side) != Some(side)
    {
        warn!(
            "--refusals: family `{}` declares no optional feature on side {side}, so no \
             scenario of it refuses one",
            args.family.family
        );
        return ExitCode::from(EXIT_USAGE);
    }
    // Every input file and output path is checked before anything runs: a usage error
    // found after a long run would hide its verdict.
    let sides = scenario::families::table(&args.family.family).map_or(&[][..], |t| t.sides);
    let expected = match args
        .expected_failures
        .as_deref()
        .map(|p| baseline::load(p, sides))
    {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => {
            warn!("--expected-failures: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let (Some(read), Some(write)) = (&args.expected_failures, &args.write_expected_failures)
        && same_file(read, write)
    {
        warn!(
            "--write-expected-failures {}: that is the --expected-failures file; writing it \
             would replace its reasons (write elsewhere and compare)",
            write.display()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let (conformance_json, conformance_md) = match &args.conformance {
        Some(path) => {
            let (j, m) = conformance_paths(path);
            (Some(j), Some(m))
        }
        None => (None, None),
    };
    for (flag, path) in [
        ("--junit", &args.junit),
        ("--json", &args.json),
        ("--markdown", &args.markdown),
        ("--conformance", &conformance_json),
        ("--conformance", &conformance_md),
        ("--write-expected-failures", &args.write_expected_failures),
    ] {
        if let Some(path) = path
            && let Err(e) = writable_file(path)
        {
            warn!("{flag} {}: {e}", path.display());
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if let Some(dir) = &args.wire_log
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        warn!("--wire-log {}: {e}", dir.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let golden_dir = golden_root(args.golden_dir.as_deref().unwrap_or(Path::new("golden")));
    if (args.accept || args.pending) && contract_harness::embedded::is_embedded_copy(&golden_dir) {
        warn!(
            "--accept and --pending write goldens, and {} is this harness's embedded reference \
             copy: name a golden directory of your own with --golden-dir",
            golden_dir.display()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match async_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // Without a file, a family that declares its features on the wire is asked once.
    let declared = if args.features.is_some() {
        declared
    } else {
        let probe_opts = contract_harness::drive::DriveOptions {
            target_cmd: args.target_cmd.clone(),
            step_timeout: args.step_timeout,
            startup_timeout: args.startup_timeout,
            vendor: args.mode == Mode::Vendor,
            peer_exe: None,
            features: Default::default(),
        };
        match runtime.block_on(family::probe_features(
            &args.family.family,
            side,
            &probe_opts,
        )) {
            None => declared,
            Some(Ok(found)) => {
                let lacking: Vec<&str> = found
                    .iter()
                    .filter(|(_, supported)| !**supported)
                    .map(|(f, _)| f.as_str())
                    .collect();
                say!(
                    "features (the target's heartbeat, no --features): {}",
                    if lacking.is_empty() {
                        "every optional feature supported".to_string()
                    } else {
                        format!("declared unsupported: {}", lacking.join(", "))
                    }
                );
                found
            }
            Some(Err(e)) => {
                // Nothing is known of the target's features: no scenario may be called
                // applicable or not on a guess.
                say!(
                    "ABORTED: the feature probe failed (the first heartbeat tells which \
                     optional features the target declares): {e}; or name them with \
                     --features FILE"
                );
                return ExitCode::from(1);
            }
        }
    };
    let all_scenarios = scenarios.clone();
    // A filter that is a whole scenario ID selects that scenario alone (another ID may
    // contain it); any other text selects every ID containing it.
    let exact = args
        .filter
        .as_deref()
        .is_some_and(|f| scenarios.iter().any(|s| s.id() == f));
    let (pending, runs): (Vec<Scenario>, Vec<Scenario>) = scenarios
        .into_iter()
        .filter(|s| s.runs_on(side))
        .filter(|s| selected(args.filter.as_deref(), exact, &s.id()))
        .filter(|s| !args.refusals || contract_harness::features::is_refusal(s))
        .partition(|s| s.pending_reason(side).is_some());
    // `--refusals`: each refusal scenario is judged (and launched, by the runner) with
    // the target's declaration less what it requires `false`.
    let launched = |s: &Scenario| {
        if args.refusals {
            contract_harness::features::launch_declaration(&declared, s)
        } else {
            declared.clone()
        }
    };
    let (runs, not_applicable): (Vec<Scenario>, Vec<Scenario>) = runs
        .into_iter()
        .partition(|s| s.unmet_requirement(side, &launched(s)).is_none());
    let not_applicable: Vec<ScenarioResult> = not_applicable
        .iter()
        .map(|s| {
            let (feature, want) = s.unmet_requirement(side, &launched(s)).unwrap_or_default();
            ScenarioResult::not_applicable(
                s.id(),
                side,
                Duration::ZERO,
                format!(
                    "the scenario requires `{feature}` {}; the target declares it {} ({})",
                    if want { "supported" } else { "unsupported" },
                    if want { "unsupported" } else { "supported" },
                    match &args.features {
                        Some(path) => format!("--features {}", path.display()),
                        None => "its heartbeat, asked before the run".into(),
                    }
                ),
            )
        })
        .collect();
    for result in &not_applicable {
        say!("{}", report::console::result_line(result));
    }
    let runs: Vec<(Scenario, Side)> = runs.into_iter().map(|s| (s, side)).collect();
    for s in &pending {
        say!(
            "PENDING {} [{}]: {}",
            s.id(),
            side,
            s.pending_reason(side).unwrap_or("")
        );
    }
    if runs.is_empty()
        && pending.is_empty()
        && not_applicable.is_empty()
        && let Some(filter) = &args.filter
    {
        warn!(
            "no {} {}scenario for side {} matches `{filter}`",
            args.family.family,
            if args.refusals { "refusal " } else { "" },
            side
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let golden_mode = if args.accept {
        GoldenMode::Accept
    } else if args.pending {
        GoldenMode::Pending
    } else {
        GoldenMode::Check
    };
    let opts = RunOptions {
        target_cmd: args.target_cmd.clone(),
        golden_dir,
        own_goldens: args.golden_dir.is_some(),
        golden_mode,
        step_timeout: args.step_timeout,
        startup_timeout: args.startup_timeout,
        mode: args.mode,
        peer_exe: None,
        features: declared,
        wire_dir: args.wire_log.clone(),
        fail_fast: args.fail_fast,
    };
    let jobs = args.jobs.unwrap_or_else(runner::default_jobs);
    let many = runtime.block_on(runner::run_many(runs, &opts, jobs, |result| {
        say!("{}", report::console::result_line(result));
        if !result.passed && !result.differs {
            say!(
                "  rerun alone: {}",
                rerun_command(&args, side, &result.scenario)
            );
        }
    }));
    let mut results = many.results;
    results.extend(not_applicable);
    if let Some(reason) = &many.aborted {
        say!("ABORTED: {reason}");
    }
    say!(
        "{}{}",
        report::console::summary_line(&results),
        if pending.is_empty() {
            String::new()
        } else {
            format!(", {} pending (not run)", pending.len())
        }
    );
    if let Err(message) = write_reports(&args, &results) {
        warn!("{message}");
        return ExitCode::from(EXIT_USAGE);
    }
    if let Some(path) = &args.conformance {
        let catalog = requirements::load_catalog(&catalog_path(&args.family)).unwrap_or_default();
        let lines = report::conformance::lines(&catalog, &all_scenarios, side, &results);
        let family = &args.family.family;
        let (json, markdown) = conformance_paths(path);
        for (file, text) in [
            (
                json,
                report::conformance::json(family, side, &args.target_cmd, &lines),
            ),
            (
                markdown,
                report::conformance::markdown(family, side, &args.target_cmd, &lines),
            ),
        ] {
            if let Err(e) = report::write_file(&file, &text) {
                warn!("--conformance {}: {e}", file.display());
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    // Another side's section of an existing file is kept.
    let kept = args
        .write_expected_failures
        .as_deref()
        .filter(|p| p.exists())
        .and_then(|p| baseline::load(p, sides).ok())
        .unwrap_or_default();
    if let Some(path) = &args.write_expected_failures
        && let Err(e) = report::write_file(path, &baseline::render_keeping(side, &results, &kept))
    {
        warn!("--write-expected-failures {}: {e}", path.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let passed = match &expected {
        Some(listed) => {
            let verdict = baseline::judge(listed, side, &results);
            let known: Vec<String> = all_scenarios
                .iter()
                .filter(|s| s.runs_on(side))
                .map(Scenario::id)
                .collect();
            let unknown = baseline::unknown(listed, side, &known);
            for id in &verdict.not_applicable {
                say!("LISTED BUT NOT APPLICABLE {id} [{side}]: it does not apply to this target");
            }
            for id in &unknown {
                say!(
                    "UNKNOWN {id} [{side}]: no such scenario on this side; remove it from the \
                     baseline"
                );
            }
            for (id, reason) in &verdict.expected {
                say!("EXPECTED FAIL {id} [{side}]: {reason}");
            }
            for id in &verdict.unexpected {
                say!("UNEXPECTED FAIL {id} [{side}] (not in the baseline)");
            }
            for id in &verdict.stale {
                say!("STALE {id} [{side}]: it passes; remove it from the baseline");
            }
            say!(
                "baseline: {} expected failure(s), {} unexpected, {} stale, {} unknown",
                verdict.expected.len(),
                verdict.unexpected.len(),
                verdict.stale.len(),
                unknown.len()
            );
            verdict.ok() && unknown.is_empty()
        }
        None => report::Summary::of(&results).ok(),
    };
    if many.aborted.is_none() && passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn diff(args: &DiffArgs) -> ExitCode {
    let side = match family::resolve(&args.family.family, &args.side) {
        Ok((_, side)) => side,
        Err(e) => {
            warn!("--family/--side: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for cmd in [&args.target_cmd, &args.against_cmd] {
        if let Err(e) = contract_harness::target::resolve_program(cmd) {
            warn!("{cmd}: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let all = match load(&args.family) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let exact = args
        .filter
        .as_deref()
        .is_some_and(|f| all.iter().any(|s| s.id() == f));
    let declared = match features_of(args.features.as_deref(), &args.family.family, side) {
        Ok(declared) => declared,
        Err(code) => return code,
    };
    let scenarios: Vec<Scenario> = all
        .into_iter()
        .filter(|s| s.runs_on(side) && s.pending_reason(side).is_none())
        .filter(|s| s.unmet_requirement(side, &declared).is_none())
        .filter(|s| selected(args.filter.as_deref(), exact, &s.id()))
        .collect();
    if scenarios.is_empty() {
        warn!(
            "no {} scenario for side {side} to compare{}",
            args.family.family,
            args.filter
                .as_deref()
                .map(|f| format!(" matches `{f}`"))
                .unwrap_or_default()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let opts = |cmd: &str| RunOptions {
        target_cmd: cmd.to_string(),
        golden_dir: PathBuf::new(),
        own_goldens: false,
        golden_mode: GoldenMode::Accept,
        step_timeout: args.step_timeout,
        startup_timeout: args.startup_timeout,
        // A reference value the target chose otherwise is a difference to compare.
        mode: Mode::Vendor,
        peer_exe: None,
        features: declared.clone(),
        wire_dir: None,
        fail_fast: false,
    };
    let runtime = match async_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let jobs = args.jobs.unwrap_or_else(runner::default_jobs);
    match runtime.block_on(differential::compare(
        &scenarios,
        side,
        &opts(&args.target_cmd),
        &opts(&args.against_cmd),
        jobs,
    )) {
        Ok(diffs) => {
            say_text!("{}", differential::render(side, &diffs));
            if differential::all_same(&diffs) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            warn!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The one command that reruns `scenario` alone, as this run ran it.
fn rerun_command(args: &RunArgs, side: Side, scenario: &str) -> String {
    let q = |s: &str| shell_words::quote(s).into_owned();
    let mut cmd = format!(
        "contract-harness run --family {} --side {side} --target-cmd {} --filter {}",
        q(&args.family.family),
        q(&args.target_cmd),
        q(scenario)
    );
    if args.mode == Mode::Vendor {
        cmd.push_str(" --mode vendor");
    }
    if args.refusals {
        cmd.push_str(" --refusals");
    }
    for (flag, value, default) in [
        (
            "--step-timeout",
            args.step_timeout,
            runner::DEFAULT_STEP_TIMEOUT,
        ),
        (
            "--startup-timeout",
            args.startup_timeout,
            runner::DEFAULT_STARTUP_TIMEOUT,
        ),
    ] {
        if value != default {
            cmd.push_str(&format!(" {flag} {}ms", value.as_millis()));
        }
    }
    if args.family.scenarios != Path::new("scenarios") {
        cmd.push_str(&format!(
            " --scenarios {}",
            q(&args.family.scenarios.display().to_string())
        ));
    }
    for (flag, path) in [
        ("--golden-dir", &args.golden_dir),
        ("--features", &args.features),
    ] {
        if let Some(path) = path {
            cmd.push_str(&format!(" {flag} {}", q(&path.display().to_string())));
        }
    }
    cmd
}

/// The features `--features FILE` declares (empty without one), or the usage exit: the
/// family must declare its optional features on `side`.
fn features_of(
    path: Option<&Path>,
    family: &str,
    side: Side,
) -> Result<std::collections::BTreeMap<String, bool>, ExitCode> {
    match (path, scenario::families::table(family)) {
        (Some(_), Some(table)) if table.feature_side != Some(side) => {
            warn!(
                "--features: {}",
                match table.feature_side {
                    Some(s) => format!(
                        "family `{}` declares its optional features on side {s}, not {side}",
                        table.family
                    ),
                    None => format!("family `{}` has no optional feature", table.family),
                }
            );
            Err(ExitCode::from(EXIT_USAGE))
        }
        (Some(path), Some(table)) => contract_harness::features::load(path, table).map_err(|e| {
            warn!("--features: {e}");
            ExitCode::from(EXIT_USAGE)
        }),
        _ => Ok(Default::default()),
    }
}

/// The multi-threaded async runtime of a command, or its usage exit.
fn async_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            warn!("cannot start the async runtime: {e}");
            ExitCode::from(EXIT_USAGE)
        })
}

/// Whether `--filter` selects the scenario `id`: every ID containing it, or only the
/// one equal to it when it is a whole ID (`exact`).
fn selected(filter: Option<&str>, exact: bool, id: &str) -> bool {
    filter.is_none_or(|f| if exact { id == f } else { id.contains(f) })
}

/// The JSON and the Markdown conformance report of `--conformance PATH`: PATH in its
/// own format (JSON when it ends in `.json`), the other next to it.
fn conformance_paths(path: &Path) -> (PathBuf, PathBuf) {
    if path.extension().is_some_and(|e| e == "json") {
        (path.to_path_buf(), path.with_extension("md"))
    } else {
        (path.with_extension("json"), path.to_path_buf())
    }
}

/// Whether two paths name the same file (the same path, or the same existing file).
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Checks that `path` can be written as a file (its directory created if missing),
/// leaving no file behind that was not there.
fn writable_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("is a directory".into());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if parent.exists() && !parent.is_dir() {
            return Err(format!("{} is not a directory", parent.display()));
        }
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create its directory: {e}"))?;
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn write_reports(args: &RunArgs, results: &[ScenarioResult]) -> Result<(), String> {
    if let Some(path) = &args.junit {
        let xml = report::junit::render("contract-harness", results).map_err(|e| e.to_string())?;
        report::write_file(path, &xml).map_err(|e| e.to_string())?;
    }
    if let Some(path) = &args.json {
        report::write_file(path, &report::json::render(results)).map_err(|e| e.to_string())?;
    }
    if let Some(path) = &args.markdown {
        report::write_file(path, &report::markdown::render(results)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn catalog_path(args: &FamilyArgs) -> PathBuf {
    scenario_root(&args.scenarios)
        .join("requirements")
        .join(format!("{}.yaml", args.family))
}

/// `--scenarios` as given, or this version's embedded scenarios when the default
/// `scenarios/` is not in the working directory (an installed harness, no checkout).
fn scenario_root(path: &Path) -> PathBuf {
    contract_harness::embedded::resolve(path, "scenarios").unwrap_or_else(|e| {
        warn!("the embedded scenarios cannot be used: {e}");
        path.to_path_buf()
    })
}

/// `--golden-dir` as given, or this version's embedded reference goldens when the
/// default `golden/` is not in the working directory.
fn golden_root(path: &Path) -> PathBuf {
    contract_harness::embedded::resolve(path, "golden").unwrap_or_else(|e| {
        warn!("the embedded goldens cannot be used: {e}");
        path.to_path_buf()
    })
}

fn coverage(args: CoverageArgs) -> ExitCode {
    let scenarios = match load(&args.family) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let catalog = match requirements::load_catalog(&catalog_path(&args.family)) {
        Ok(c) => c,
        Err(e) => {
            print_load_errors(&[e]);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let coverage = requirements::coverage(&catalog, &scenarios);
    say_text!(
        "{}",
        report::coverage::render_text(&args.family.family, &coverage)
    );
    if let Some(path) = &args.markdown {
        let text = report::coverage::render_markdown(&args.family.family, &coverage);
        if let Err(e) = report::write_file(path, &text) {
            warn!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if coverage.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn list(args: &FamilyArgs) -> ExitCode {
    let scenarios = match load(args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(info) = family::family(&args.family) {
        say!("family {} ({})", info.name, info.spec);
        for side in info.sides {
            say!(
                "side {}: the harness plays {}; ours: contract-impl {}",
                side.side,
                side.harness_plays,
                side.impl_args
            );
        }
    }
    for s in &scenarios {
        let sides: Vec<&str> = s.target_sides().iter().map(|side| side.as_str()).collect();
        say!("{} [{}] {}", s.id(), sides.join(","), s.summary);
    }
    say!("{} scenario(s)", scenarios.len());
    ExitCode::SUCCESS
}

fn golden_action(action: GoldenAction) -> ExitCode {
    match action {
        GoldenAction::Refresh(args) => golden_cli::refresh(&args),
        GoldenAction::Changes { places, base, json } => {
            golden_cli::changes(&places, base.as_deref(), json)
        }
        GoldenAction::Stable { args, sample, jobs } => golden_cli::stable(&args, sample, jobs),
        GoldenAction::Audit { places, family } => golden_cli::audit(&places, family.as_deref()),
        GoldenAction::Review { golden_dir } => review(&golden_dir),
        GoldenAction::Accept { golden_dir } => match golden::accept_pending(&golden_dir) {
            Ok(written) => {
                for path in &written {
                    say!("accepted {}", path.display());
                }
                say!("{} golden file(s) accepted", written.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                warn!(
                    "accepting pending goldens under {} failed: {e}",
                    golden_dir.display()
                );
                ExitCode::FAILURE
            }
        },
    }
}

fn review(golden_dir: &Path) -> ExitCode {
    let pending = golden::pending_files(golden_dir);
    for path in &pending {
        let golden_file = path.with_extension("");
        let new_text = std::fs::read_to_string(path).unwrap_or_default();
        match std::fs::read_to_string(&golden_file) {
            Ok(old_text) => {
                say!(
                    "pending {} (changes {})",
                    path.display(),
                    golden_file.display()
                );
                say_text!("{}", golden::unified_diff(&old_text, &new_text));
            }
            Err(_) => say!("pending {} (new golden)", path.display()),
        }
    }
    say!("{} pending golden file(s)", pending.len());
    ExitCode::SUCCESS
}
