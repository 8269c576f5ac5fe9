//! The contract suite as `cargo test`: one libtest-mimic trial per scenario × side
//! (`core_runtime/<name>::runtime`), run against **our** binaries through exactly the
//! launch contract a third party uses, plus trials that the scenario directory loads,
//! that requirement coverage is clean, and that the Go and Python (3.12+) fixture plugins
//! pass the plugin family's suite (`contract-harness run` against the fixtures
//! `ci/setup.sh` builds; a missing one fails naming `ci/setup.sh`).
//!
//! * Target binary: `$CONTRACT_IMPL_BIN` if set, else `<target dir>/debug/contract-impl`,
//!   built first with `cargo build -p contract-impl --bin contract-impl` (once per test
//!   process; a no-op when it is up to date) so the suite is self-sufficient.
//! * Goldens: checked by default; `CONTRACT_GOLDEN=accept` writes them, `=pending`
//!   writes `.pending` files for review.
//! * Families and sides come from the harness's registry
//!   (`contract_harness::family::FAMILIES`); each side's trials run `contract-impl` with
//!   that side's `impl_args` (`runtime`, `core serve`). A scenario side listed under the
//!   scenario's `pending:` is listed but **ignored** (kind `[pending]`; the reasons are
//!   printed on stderr before the run), so nothing not-yet-ported passes silently.
//!
//! Usual libtest arguments work: `cargo test -p contract-harness --test contract --
//! handshake`, `--exact`, `--ignored`, `--test-threads N`, `--list`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use contract_harness::family::{self, FAMILIES};
use contract_harness::golden::GoldenMode;
use contract_harness::report::console;
use contract_harness::requirements;
use contract_harness::runner::{self, RunOptions};
use contract_harness::scenario::{Side, load_family};
use libtest_mimic::{Arguments, Failed, Trial};

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The `contract-impl` binary, built once per process.
fn impl_binary() -> Result<PathBuf, Failed> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("CONTRACT_IMPL_BIN") {
            return Ok(PathBuf::from(bin));
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(cargo)
            .args(["build", "-p", "contract-impl", "--bin", "contract-impl"])
            .current_dir(workspace_root())
            .output()
            .map_err(|e| format!("cannot run cargo to build contract-impl: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "building contract-impl failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let bin = target_dir().join("debug").join("contract-impl");
        if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("{} does not exist after the build", bin.display()))
        }
    })
    .clone()
    .map_err(Failed::from)
}

fn golden_mode() -> GoldenMode {
    match std::env::var("CONTRACT_GOLDEN").as_deref() {
        Ok("accept") => GoldenMode::Accept,
        Ok("pending") => GoldenMode::Pending,
        _ => GoldenMode::Check,
    }
}

/// The `--target-cmd` for a side of a family (from the registry), with the binary path
/// quoted for the splitter.
fn target_cmd(family_name: &str, side: Side) -> Result<String, Failed> {
    let info = family::family(family_name)
        .and_then(|f| f.side(side.as_str()))
        .ok_or_else(|| format!("family `{family_name}` has no side `{side}` in the registry"))?;
    let bin = impl_binary()?;
    let quoted = shell_words::quote(&bin.display().to_string()).into_owned();
    Ok(format!("{quoted} {}", info.impl_args))
}

fn main() {
    let args = Arguments::from_args();
    let root = workspace_root();
    let scenarios_dir = root.join("scenarios");
    let golden_dir = root.join("golden");
    let mut trials = Vec::new();
    let mut pending_reasons = Vec::new();

    for info in FAMILIES {
        let family = info.name;
        let loaded = load_family(&scenarios_dir, family);
        let load_errors = match &loaded {
            Ok(_) => None,
            Err(errors) => Some(
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        };
        trials.push(Trial::test(
            format!("{family}::scenarios_load"),
            move || match load_errors {
                None => Ok(()),
                Some(text) => Err(text.into()),
            },
        ));

        let scenarios = loaded.unwrap_or_default();
        let catalog = scenarios_dir
            .join("requirements")
            .join(format!("{family}.yaml"));
        let for_coverage = scenarios.clone();
        trials.push(Trial::test(format!("{family}::coverage"), move || {
            let catalog = requirements::load_catalog(&catalog).map_err(|e| e.to_string())?;
            let coverage = requirements::coverage(&catalog, &for_coverage);
            if coverage.is_ok() {
                Ok(())
            } else {
                Err(coverage.errors().join("\n").into())
            }
        }));

        for scenario in scenarios {
            for side in scenario.target_sides() {
                // Our implementation supports every optional feature; a refusal scenario
                // runs lacking exactly what it requires `false`.
                let declared = contract_harness::features::reference_declaration(&scenario, side);
                let pending = scenario.pending_reason(side).map(str::to_string);
                let scenario_id = scenario.id();
                let name = format!("{}::{}", scenario.id(), side.as_str());
                let scenario = scenario.clone();
                let golden_dir = golden_dir.clone();
                let trial = Trial::test(name, move || {
                    let opts = RunOptions {
                        target_cmd: target_cmd(family, side)?,
                        golden_dir,
                        own_goldens: false,
                        golden_mode: golden_mode(),
                        step_timeout: runner::DEFAULT_STEP_TIMEOUT,
                        startup_timeout: runner::DEFAULT_STARTUP_TIMEOUT,
                        mode: runner::Mode::Strict,
                        peer_exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_contract-harness"))),
                        features: declared,
                        wire_dir: None,
                        fail_fast: false,
                    };
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    let result = rt.block_on(runner::run_scenario(&scenario, side, &opts));
                    if result.passed {
                        Ok(())
                    } else {
                        Err(console::result_line(&result).into())
                    }
                });
                // A pending side is listed as ignored; its reason goes to stderr.
                trials.push(match pending {
                    Some(reason) => {
                        pending_reasons.push(format!(
                            "pending (not run): {}::{}: {reason}",
                            scenario_id,
                            side.as_str()
                        ));
                        trial.with_kind("pending").with_ignored_flag(true)
                    }
                    None => trial,
                });
            }
        }
    }

    // An implementation that makes the spec's free choices differently must pass every
    // scenario of its side in vendor mode, its differences reported against the
    // reference requirements, never as failures; in strict mode exactly those runs fail,
    // each naming its requirement.
    for (name, family, side, args) in [
        (
            "core_runtime::vendor_mode_passes_a_different_but_correct_runtime",
            "core_runtime",
            Side::Runtime,
            "runtime --wire-profile different",
        ),
        (
            "worker::vendor_mode_passes_a_different_but_correct_worker",
            "worker",
            Side::Worker,
            "worker python --profile different",
        ),
        (
            "worker::vendor_mode_passes_a_different_but_correct_host",
            "worker",
            Side::Host,
            "worker host --profile different",
        ),
        (
            "plugin::vendor_mode_passes_a_different_but_correct_plugin",
            "plugin",
            Side::Plugin,
            "plugin fixture --profile different",
        ),
        (
            "plugin::vendor_mode_passes_a_different_but_correct_host",
            "plugin",
            Side::Host,
            "plugin host --profile different",
        ),
        (
            "engine::vendor_mode_passes_a_different_but_correct_daemon",
            "engine",
            Side::Daemon,
            "engine serve --profile different",
        ),
        (
            "engine::vendor_mode_passes_a_different_but_correct_client",
            "engine",
            Side::Client,
            "engine controlled --profile different",
        ),
    ] {
        let scenarios = load_family(&scenarios_dir, family).unwrap_or_default();
        trials.push(Trial::test(name, move || {
            vendor_trial(&scenarios, side, args)
        }));
    }

    // "Go and Python 3.12+ fixtures must pass the same black-box conformance suite": the
    // plugin family's scenarios and goldens, as `make contract-plugin-go` and
    // `make contract-plugin-python` run them, against the fixtures ci/setup.sh builds.
    for (name, fixture) in [
        ("plugin::the_go_fixture_passes_the_suite", Fixture::Go),
        (
            "plugin::the_python_fixture_passes_the_suite_on_python_3_12_or_newer",
            Fixture::Python,
        ),
    ] {
        let scenarios = load_family(&scenarios_dir, "plugin").unwrap_or_default();
        trials.push(Trial::test(name, move || {
            fixture_trial(&scenarios, fixture)
        }));
    }

    // A client that does not present the endpoint token fails (never a mere difference).
    {
        let scenarios_dir = scenarios_dir.clone();
        trials.push(Trial::test(
            "engine::a_client_without_the_token_fails",
            move || hostile_client_trial(&scenarios_dir),
        ));
    }

    // A vendor's baseline and a differential run, through the command line.
    trials.push(Trial::test(
        "harness::baselines_and_differential_runs",
        baselines_and_diff_trial,
    ));

    // In vendor mode the reference goldens are advisory, the target's own are strict.
    trials.push(Trial::test(
        "harness::own_goldens_are_strict_in_vendor_mode",
        own_goldens_trial,
    ));

    // A vendor's features file: what a target lacks is not applicable, its refusal runs.
    trials.push(Trial::test(
        "harness::features_select_scenarios",
        features_trial,
    ));

    // Output into a pipe its reader closed (`… | head -1`) is dropped, never a panic.
    trials.push(Trial::test(
        "harness::a_closed_stdout_ends_quietly",
        closed_stdout_trial,
    ));
    trials.push(Trial::test(
        "harness::a_closed_stderr_ends_quietly",
        closed_stderr_trial,
    ));

    // A Core that prints its ready line and then never answers aborts the run.
    trials.push(Trial::test(
        "harness::a_silent_core_aborts_the_run",
        silent_core_trial,
    ));
    trials.push(Trial::test(
        "harness::fail_fast_stops_at_the_first_failure",
        fail_fast_trial,
    ));

    // Goldens must not depend on load: a sample of every side, replayed one at a time
    // and in parallel, writes byte-identical goldens (`make golden-stable` runs all).
    {
        let scenarios_dir = scenarios_dir.clone();
        trials.push(Trial::test(
            "goldens_are_stable_under_parallelism",
            move || stability_trial(&scenarios_dir),
        ));
    }

    if !args.list {
        for line in &pending_reasons {
            eprintln!("{line}");
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

/// Options for a run of our binaries into `golden_dir` (goldens accepted there).
fn accepting(target_cmd: String, golden_dir: &Path, mode: runner::Mode) -> RunOptions {
    RunOptions {
        target_cmd,
        golden_dir: golden_dir.to_path_buf(),
        own_goldens: false,
        golden_mode: GoldenMode::Accept,
        step_timeout: runner::DEFAULT_STEP_TIMEOUT,
        startup_timeout: runner::DEFAULT_STARTUP_TIMEOUT,
        mode,
        peer_exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_contract-harness"))),
        features: Default::default(),
        wire_dir: None,
        fail_fast: false,
    }
}

/// Our client started with another token file (a wrong token on every call) must FAIL
/// in vendor mode, naming the endpoint token.
fn hostile_client_trial(scenarios_dir: &Path) -> Result<(), Failed> {
    let bin = shell_words::quote(&impl_binary()?.display().to_string()).into_owned();
    let all = load_family(scenarios_dir, "engine").map_err(|e| format!("{e:?}"))?;
    let scenario = all
        .into_iter()
        .find(|s| s.name == "client_initialize_as_a_new_owner")
        .ok_or("client_initialize_as_a_new_owner is missing")?;
    let wrong = format!(
        "sh -c 'printf 0123456789abcdef > \"$CONTRACT_ENGINE_STATE_DIR/t\"; \
         CONTRACT_ENGINE_TOKEN_FILE=\"$CONTRACT_ENGINE_STATE_DIR/t\" exec {bin} engine controlled'"
    );
    let goldens = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let opts = accepting(wrong, goldens.path(), runner::Mode::Vendor);
    let r = rt.block_on(runner::run_scenario(&scenario, Side::Client, &opts));
    if r.passed || r.differs || !r.failure_line().contains("endpoint token") {
        return Err(format!("a client with a wrong token: {}", console::result_line(&r)).into());
    }
    Ok(())
}

/// A Runtime whose wire differs from the reference goldens (`--wire-profile different`):
/// in vendor mode against the reference goldens the difference is a `DIFF` (exit 0);
/// against a golden directory of its own (here a copy of the reference) it fails.
fn own_goldens_trial() -> Result<(), Failed> {
    let bin = impl_binary()?.display().to_string();
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let own = dir.path().join("core_runtime");
    std::fs::create_dir_all(&own).map_err(|e| e.to_string())?;
    let name = "handshake_heartbeat.runtime.golden";
    std::fs::copy(
        workspace_root().join("golden/core_runtime").join(name),
        own.join(name),
    )
    .map_err(|e| e.to_string())?;
    let run = |extra: &[&str]| -> Result<(i32, String), Failed> {
        let out = Command::new(harness)
            .current_dir(workspace_root())
            .args([
                "run",
                "--family",
                "core_runtime",
                "--side",
                "runtime",
                "--mode",
                "vendor",
            ])
            .args(["--filter", "core_runtime/handshake_heartbeat"])
            .args([
                "--target-cmd",
                &format!("{bin} runtime --wire-profile different"),
            ])
            .args(extra)
            .output()
            .map_err(|e| e.to_string())?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    };
    let (code, out) = run(&[])?;
    if code != 0 || !out.contains("DIFF core_runtime/handshake_heartbeat") {
        return Err(format!(
            "against the reference goldens: exit {code}
{out}"
        )
        .into());
    }
    let own_dir = dir.path().display().to_string();
    let (code, out) = run(&["--golden-dir", &own_dir])?;
    if code != 1
        || !out.contains("FAIL core_runtime/handshake_heartbeat")
        || !out.contains("golden_mismatch")
        || !out.contains("--golden-dir")
    {
        return Err(format!(
            "against its own goldens: exit {code}
{out}"
        )
        .into());
    }
    Ok(())
}

/// `--features`: a Runtime that declares `mcp_http_tools` (and the two MCP capabilities
/// built on it) unsupported gets the scenarios needing them as `not applicable` and the
/// refusal scenario run (and passed); without the file the refusal is the one not
/// applicable; a features file on a side that declares none is a usage error.
fn features_trial() -> Result<(), Failed> {
    let bin = impl_binary()?.display().to_string();
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let template = Command::new(harness)
        .args(["features", "--family", "core_runtime"])
        .output()
        .map_err(|e| e.to_string())?;
    let mut text = String::from_utf8_lossy(&template.stdout).into_owned();
    for cap in [
        "mcp_http_tools",
        "mcp_http_required",
        "mcp_http_bearer_auth",
    ] {
        text = text.replace(&format!("  {cap}: true"), &format!("  {cap}: false"));
    }
    let file = dir.path().join("acme-features.yaml");
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let file = file.display().to_string();
    let run = |side: &str, target: &str, extra: &[&str]| -> Result<(i32, String), Failed> {
        let out = Command::new(harness)
            .current_dir(workspace_root())
            .args([
                "run",
                "--family",
                "core_runtime",
                "--side",
                side,
                "--filter",
                "mcp",
            ])
            .args(["--mode", "vendor", "--target-cmd", target])
            .args(extra)
            .output()
            .map_err(|e| e.to_string())?;
        Ok((
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    };
    let runtime = format!("{bin} runtime");
    let (code, out) = run("runtime", &runtime, &["--features", &file])?;
    let refusal_ran = out.contains("PASS core_runtime/undeclared_mcp_http_tools_refused")
        || out.contains("DIFF core_runtime/undeclared_mcp_http_tools_refused");
    if code != 0
        || !out.contains("N/A  core_runtime/mcp_core_relay_passthrough")
        || !out.contains("N/A  core_runtime/mcp_connection_origin")
        || !refusal_ran
        || !out.contains("0 failed")
    {
        return Err(format!(
            "with the features file: exit {code}
{out}"
        )
        .into());
    }
    let (code, out) = run("runtime", &runtime, &[])?;
    if code != 0
        || !out.contains("N/A  core_runtime/undeclared_mcp_http_tools_refused")
        || !(out.contains("PASS core_runtime/mcp_core_relay_passthrough")
            || out.contains("DIFF core_runtime/mcp_core_relay_passthrough"))
    {
        return Err(format!(
            "without the features file: exit {code}
{out}"
        )
        .into());
    }
    // `--refusals`: only the refusal scenarios, each launched lacking what it requires
    // `false`. With the file, one that requires `true` what the target lacks does not
    // apply; without it, every one runs, whatever the target supports.
    let (code, out) = run("runtime", &runtime, &["--refusals", "--features", &file])?;
    let ran = |out: &str, name: &str| {
        out.contains(&format!("PASS core_runtime/{name} "))
            || out.contains(&format!("DIFF core_runtime/{name} "))
    };
    if code != 0
        || !ran(&out, "undeclared_mcp_http_tools_refused")
        || !out.contains("N/A  core_runtime/undeclared_mcp_http_required_refused")
        || out.contains("core_runtime/mcp_core_relay_passthrough")
    {
        return Err(format!("--refusals with the features file: exit {code}\n{out}").into());
    }
    let (code, out) = run("runtime", &runtime, &["--refusals"])?;
    if code != 0
        || !ran(&out, "undeclared_mcp_http_tools_refused")
        || !ran(&out, "undeclared_mcp_http_required_refused")
        || !ran(&out, "undeclared_mcp_http_bearer_auth_alone_refused")
        || out.contains("N/A")
        || out.contains("core_runtime/mcp_core_relay_passthrough")
    {
        return Err(format!("--refusals: exit {code}\n{out}").into());
    }
    // A filter that selects no refusal scenario is a usage error that says so.
    let none = Command::new(harness)
        .current_dir(workspace_root())
        .args(["run", "--family", "core_runtime", "--side", "runtime"])
        .args(["--refusals", "--filter", "mcp_core_relay_passthrough"])
        .args(["--target-cmd", &runtime])
        .output()
        .map_err(|e| e.to_string())?;
    let (code, out) = (
        none.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&none.stderr).into_owned(),
    );
    if code != 2 || !out.contains("no core_runtime refusal scenario for side runtime matches") {
        return Err(format!("--refusals selecting none: exit {code}\n{out}").into());
    }
    let (code, out) = run("core", &format!("{bin} core serve"), &["--refusals"])?;
    if code != 2 || !out.contains("--refusals: family `core_runtime` declares no optional") {
        return Err(format!("--refusals on side core: exit {code}\n{out}").into());
    }
    let (code, out) = run("core", &format!("{bin} core serve"), &["--features", &file])?;
    if code != 2 || !out.contains("declares its optional features on side runtime") {
        return Err(format!(
            "features on side core: exit {code}
{out}"
        )
        .into());
    }
    Ok(())
}

/// Every printing subcommand, its stdout a pipe whose reader is gone before it prints:
/// the exit status is the command's own and stderr holds no panic.
fn closed_stdout_trial() -> Result<(), Failed> {
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    for args in [
        &["coverage", "--family", "core_runtime"][..],
        &["list", "--family", "core_runtime"],
        &["features", "--family", "core_runtime"],
        &["sides"],
    ] {
        let (reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
        drop(reader);
        let out = Command::new(harness)
            .current_dir(workspace_root())
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(0) || stderr.contains("panicked") {
            return Err(format!("{args:?}: {:?}\n{stderr}", out.status).into());
        }
    }
    Ok(())
}

/// Diagnostics into a stderr whose reader is already closed (`2>&-`, `2>&1 | head`) are
/// dropped: every command ends with its own exit status (0, or 2 for a usage error),
/// never a panic's 101.
fn closed_stderr_trial() -> Result<(), Failed> {
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    for (args, expected) in [
        (&["list", "--family", "core_runtime"][..], 0),
        (&["coverage", "--family", "plugin"], 0),
        (&["list", "--family", "no_such_family"], 2),
        (
            &[
                "run",
                "--family",
                "plugin",
                "--side",
                "plugin",
                "--target-cmd",
                "/nonexistent/plugin",
            ],
            2,
        ),
    ] {
        let (reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
        drop(reader);
        let out = Command::new(harness)
            .current_dir(workspace_root())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.code() != Some(expected) {
            return Err(format!("{args:?}: {:?}, expected exit {expected}", out.status).into());
        }
    }
    Ok(())
}

/// `--expected-failures` (a listed failure passes the run, an unlisted one fails it, a
/// listed pass is stale) and `diff` (our daemon against itself: no difference; our client
/// against the different one: the differing field named), as a vendor runs them.
fn baselines_and_diff_trial() -> Result<(), Failed> {
    let bin = impl_binary()?.display().to_string();
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let different = format!("{bin} engine controlled --profile different");
    let run = |extra: &[&str]| -> Result<(i32, String), Failed> {
        let out = Command::new(harness)
            .current_dir(workspace_root())
            .args([
                "run", "--family", "engine", "--side", "client", "--filter", "_major_",
            ])
            .args(["--target-cmd", &different])
            .args(extra)
            .output()
            .map_err(|e| e.to_string())?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    };
    let baseline = dir.path().join("expected.yaml");
    let path = baseline.display().to_string();
    let (code, _) = run(&["--write-expected-failures", &path])?;
    let written = std::fs::read_to_string(&baseline).map_err(|e| e.to_string())?;
    if code != 1 || !written.contains("engine/client_incompatible_major_creates_no_run") {
        return Err(format!("the failing run wrote {written:?} (exit {code})").into());
    }
    let (code, out) = run(&["--expected-failures", &path])?;
    if code != 0 || !out.contains("EXPECTED FAIL engine/client_incompatible_major") {
        return Err(format!(
            "with the baseline: exit {code}
{out}"
        )
        .into());
    }
    std::fs::write(
        &baseline,
        "client: {}
",
    )
    .map_err(|e| e.to_string())?;
    let (code, out) = run(&["--expected-failures", &path])?;
    if code != 1 || !out.contains("UNEXPECTED FAIL") {
        return Err(format!(
            "without it in the baseline: exit {code}
{out}"
        )
        .into());
    }
    std::fs::write(
        &baseline,
        "client:
  engine/client_incompatible_major_creates_no_run: known
  engine/client_reports_a_missing_capability: fixed since
",
    )
    .map_err(|e| e.to_string())?;
    let out = Command::new(harness)
        .current_dir(workspace_root())
        .args([
            "run", "--family", "engine", "--side", "client", "--filter", "client_",
        ])
        .args(["--target-cmd", &different, "--expected-failures", &path])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code() != Some(1)
        || !text.contains("STALE engine/client_reports_a_missing_capability")
    {
        return Err(format!(
            "a stale entry: {:?}
{text}",
            out.status.code()
        )
        .into());
    }
    let diff = |target: &str, against: &str, side: &str, filter: &str| {
        let family = if side == "runtime" {
            "core_runtime"
        } else {
            "engine"
        };
        Command::new(harness)
            .current_dir(workspace_root())
            .args([
                "diff", "--family", family, "--side", side, "--filter", filter,
            ])
            .args(["--target-cmd", target, "--against-cmd", against])
            .output()
            .map_err(|e| e.to_string())
    };
    let serve = format!("{bin} engine serve");
    let same = diff(&serve, &serve, "daemon", "reconnect")?;
    let text = String::from_utf8_lossy(&same.stdout);
    if same.status.code() != Some(0) || !text.contains("0 differ, 0 failed") {
        return Err(format!(
            "our daemon against itself:
{text}"
        )
        .into());
    }
    let ours = format!("{bin} engine controlled");
    let differs = diff(&different, &ours, "client", "resumes_a_broken")?;
    let text = String::from_utf8_lossy(&differs.stdout);
    if differs.status.code() != Some(1)
        || !text.contains("`$.request.cursor.maxEvents`: `512` → `100`")
    {
        return Err(format!(
            "another client against ours:
{text}"
        )
        .into());
    }
    // Our Runtime against itself, then against one that names its heartbeats otherwise:
    // the scenario, the step and the field.
    let runtime = format!("{bin} runtime");
    let same = diff(&runtime, &runtime, "runtime", "heartbeat")?;
    let text = String::from_utf8_lossy(&same.stdout);
    if same.status.code() != Some(0) || !text.contains("0 differ, 0 failed") {
        return Err(format!("our Runtime against itself:\n{text}").into());
    }
    let other = format!("{bin} runtime --wire-profile different");
    let differs = diff(&other, &runtime, "runtime", "handshake_heartbeat")?;
    let text = String::from_utf8_lossy(&differs.stdout);
    if differs.status.code() != Some(1)
        || !text.contains("DIFFERS core_runtime/handshake_heartbeat")
        || !text.contains("step 3 runtime frame")
        || !text.contains("`$.id`: `\"hb-1\"` → `\"beat-1\"`")
    {
        return Err(format!("another Runtime against ours:\n{text}").into());
    }
    Ok(())
}

/// Scenarios per side the stability trial replays (twice each).
const STABILITY_SAMPLE: usize = 3;

/// Replays [`STABILITY_SAMPLE`] scenarios of every side with `--jobs 1` and `--jobs 3`
/// into scratch golden directories; the two sets must be byte-identical.
fn stability_trial(scenarios_dir: &Path) -> Result<(), Failed> {
    use contract_harness::stability;
    let bin = impl_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut problems = Vec::new();
    for info in FAMILIES {
        let all = load_family(scenarios_dir, info.name).map_err(|e| format!("{e:?}"))?;
        for side in info.sides {
            let sample = stability::sample(&all, side.side, Some(STABILITY_SAMPLE));
            let opts = accepting(
                format!(
                    "{} {}",
                    shell_words::quote(&bin.display().to_string()),
                    side.impl_args
                ),
                Path::new(""),
                runner::Mode::Strict,
            );
            let found = rt.block_on(stability::check_side(&sample, side.side, &opts, 3))?;
            problems.extend(found.failures);
            problems.extend(found.differences);
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n").into())
    }
}

/// Runs every scenario of `side` against `contract-impl <args>` in vendor mode (all must
/// pass, some must differ), then in strict mode (exactly the differing ones fail, each
/// naming a reference requirement).
fn vendor_trial(
    scenarios: &[contract_harness::scenario::Scenario],
    side: Side,
    args: &str,
) -> Result<(), libtest_mimic::Failed> {
    let bin = impl_binary()?;
    let goldens = tempfile::tempdir().map_err(|e| e.to_string())?;
    let opts = accepting(
        format!("{} {args}", shell_words::quote(&bin.display().to_string())),
        goldens.path(),
        runner::Mode::Vendor,
    );
    let runs: Vec<(contract_harness::scenario::Scenario, Side)> = scenarios
        .iter()
        .filter(|s| s.runs_on(side) && s.pending_reason(side).is_none())
        // Our different-but-correct targets support every optional feature.
        .filter(|s| s.unmet_requirement(side, &Default::default()).is_none())
        .map(|s| (s.clone(), side))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let many = rt.block_on(runner::run_many(runs.clone(), &opts, 2, |_| {}));
    let failed: Vec<String> = many
        .results
        .iter()
        .filter(|r| !r.passed)
        .map(console::result_line)
        .collect();
    let differ = many.results.iter().filter(|r| r.differs).count();
    let vendor = many.results.clone();
    if !failed.is_empty() || many.aborted.is_some() || differ == 0 {
        return Err(format!(
            "{} failed, {differ} differ; {:?}\n{}",
            failed.len(),
            many.aborted,
            failed.join("\n")
        )
        .into());
    }
    let strict = RunOptions {
        mode: runner::Mode::Strict,
        golden_mode: GoldenMode::Check,
        ..opts
    };
    let many = rt.block_on(runner::run_many(runs, &strict, 2, |_| {}));
    let unnamed: Vec<String> = many
        .results
        .iter()
        .filter(|r| !r.passed && r.reference.is_none())
        .map(console::result_line)
        .collect();
    let strict_failed = many.results.iter().filter(|r| !r.passed).count();
    if !unnamed.is_empty() || strict_failed != differ {
        // What the same scenarios did in vendor mode: a scenario that differed there and
        // not here (or the reverse) has a reference step that depends on the run.
        let strict_names: std::collections::HashSet<&str> = many
            .results
            .iter()
            .filter(|r| !r.passed)
            .map(|r| r.scenario.as_str())
            .collect();
        let changed: Vec<String> = vendor
            .iter()
            .filter(|r| r.differs != strict_names.contains(r.scenario.as_str()))
            .map(|r| {
                format!(
                    "vendor mode: {}: {}",
                    console::result_line(r),
                    r.failure.as_deref().unwrap_or("(no difference)")
                )
            })
            .collect();
        return Err(format!(
            "strict mode: {strict_failed} failed ({differ} differ in vendor mode), {} \
             without a reference requirement:\n{}\n{}",
            unnamed.len(),
            unnamed.join("\n"),
            changed.join("\n")
        )
        .into());
    }
    Ok(())
}

/// A fixture plugin of another language than the Rust SDK's.
#[derive(Debug, Clone, Copy)]
enum Fixture {
    /// impl/src/plugin/go/conformance_plugin, built to .tools/go/bin by ci/setup.sh.
    Go,
    /// impl/src/plugin/python/conformance_plugin.py on the interpreter of .tools/py.
    Python,
}

/// The oldest Python the Python fixture must run on (plugin-protocol.md, "Compatibility
/// and language neutrality").
const FIXTURE_PYTHON: (u32, u32) = (3, 12);

/// `contract-harness run --family plugin --side plugin` against a fixture plugin, through
/// the command line: exit 0, and a summary of every scenario of the side passed and none
/// failed.
fn fixture_trial(
    scenarios: &[contract_harness::scenario::Scenario],
    fixture: Fixture,
) -> Result<(), Failed> {
    let root = workspace_root();
    let quote = |p: &Path| shell_words::quote(&p.display().to_string()).into_owned();
    let target_cmd = match fixture {
        Fixture::Go => {
            let bin = root.join(".tools/go/bin/conformance-plugin-go");
            if !bin.is_file() {
                return Err(format!(
                    "{} is missing: run ci/setup.sh (it builds the Go fixture plugin)",
                    bin.display()
                )
                .into());
            }
            quote(&bin)
        }
        Fixture::Python => {
            let python = root.join(".tools/py/bin/python");
            let version = Command::new(&python)
                .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .ok_or_else(|| {
                    format!(
                        "{} is missing or does not run: run ci/setup.sh (it makes the \
                         virtual environment of the Python fixture plugin)",
                        python.display()
                    )
                })?;
            let text = String::from_utf8_lossy(&version.stdout).trim().to_string();
            let parsed = text
                .split_once('.')
                .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
            match parsed {
                Some(v) if v >= FIXTURE_PYTHON => {}
                _ => {
                    return Err(format!(
                        "{} is Python {text}, not {}.{}+: run ci/setup.sh (it makes \
                         .tools/py again from a Python >= {}.{})",
                        python.display(),
                        FIXTURE_PYTHON.0,
                        FIXTURE_PYTHON.1,
                        FIXTURE_PYTHON.0,
                        FIXTURE_PYTHON.1
                    )
                    .into());
                }
            }
            let script = root.join("impl/src/plugin/python/conformance_plugin.py");
            format!("{} {}", quote(&python), quote(&script))
        }
    };
    let expected = scenarios
        .iter()
        .filter(|s| s.runs_on(Side::Plugin) && s.pending_reason(Side::Plugin).is_none())
        .count();
    if expected == 0 {
        return Err("the plugin family has no scenario on side plugin".into());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_contract-harness"))
        .current_dir(&root)
        .args(["run", "--family", "plugin", "--side", "plugin"])
        .args(["--target-cmd", &target_cmd])
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout.lines().last().unwrap_or_default();
    let all_passed = format!("{expected} passed, 0 failed");
    if out.status.code() != Some(0) || summary != all_passed {
        return Err(format!(
            "{fixture:?} fixture ({target_cmd}): {:?}, summary {summary:?}, expected \
             {all_passed:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// A Core target that listens, prints its ready line and never answers an HTTP request:
/// the first 3 scenarios time out having received nothing, and the run stops there
/// (`ABORTED: target never answered: …`, exit 1) instead of waiting out every
/// scenario's step deadline.
fn silent_core_trial() -> Result<(), Failed> {
    let (code, stdout) = run_silent_core(&[])?;
    if code != 1
        || !stdout.contains("ABORTED: target never answered")
        || !stdout.contains("0 passed, 3 failed")
    {
        return Err(format!("a silent Core: exit {code}\n{stdout}").into());
    }
    Ok(())
}

/// `--fail-fast`: the same silent Core, and the run stops after its first failure.
fn fail_fast_trial() -> Result<(), Failed> {
    let (code, stdout) = run_silent_core(&["--fail-fast"])?;
    if code != 1
        || !stdout.contains("ABORTED: stopped at the first failure (--fail-fast)")
        || !stdout.contains("0 passed, 1 failed")
    {
        return Err(format!("--fail-fast: exit {code}\n{stdout}").into());
    }
    Ok(())
}

/// Runs side core against a Core that never answers; the exit code and stdout.
fn run_silent_core(extra: &[&str]) -> Result<(i32, String), Failed> {
    let harness = env!("CARGO_BIN_EXE_contract-harness");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let script = dir.path().join("silent_core.py");
    std::fs::write(
        &script,
        "import json, socket\n\
         s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(64)\n\
         print(json.dumps({'ready': {'base_url': 'http://127.0.0.1:%d' % s.getsockname()[1]}}), flush=True)\n\
         held = []\n\
         while True:\n    held.append(s.accept()[0])\n",
    )
    .map_err(|e| e.to_string())?;
    let out = Command::new(harness)
        .current_dir(workspace_root())
        .args(["run", "--family", "core_runtime", "--side", "core"])
        .args(["--step-timeout", "300ms", "--jobs", "1"])
        .args(["--target-cmd", &format!("python3 {}", script.display())])
        .args(extra)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok((out.status.code().unwrap_or(-1), stdout))
}
