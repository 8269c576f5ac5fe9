//! `contract-harness golden refresh | changes | stable` and `contract-harness sides`: the
//! golden work that spans every family and side of the registry.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use contract_harness::changes::{self, Covered};
use contract_harness::family::FAMILIES;
use contract_harness::golden::GoldenMode;
use contract_harness::runner::{self, RunOptions};
use contract_harness::scenario::{Side, load_family, load_scenario};
use contract_harness::{requirements, stability};

/// Where the scenarios, the goldens and our implementation are.
#[derive(Debug, Args)]
pub struct Places {
    /// Scenario root directory.
    #[arg(long, default_value = "scenarios")]
    pub scenarios: PathBuf,
    /// Golden root directory.
    #[arg(long, default_value = "golden")]
    pub golden_dir: PathBuf,
}

/// `golden refresh` / `golden stable`: our implementation's binary.
#[derive(Debug, Args)]
pub struct ImplArgs {
    #[command(flatten)]
    pub places: Places,
    /// Our implementation (`contract-impl`); each side runs it with the registry's
    /// arguments (`contract-harness sides`).
    #[arg(long = "impl", default_value = "target/debug/contract-impl")]
    pub impl_bin: PathBuf,
    /// Only this family.
    #[arg(long)]
    pub family: Option<String>,
}

fn rt() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn options(args: &ImplArgs, impl_args: &str) -> RunOptions {
    RunOptions {
        target_cmd: format!(
            "{} {impl_args}",
            shell_words::quote(&args.impl_bin.display().to_string())
        ),
        golden_dir: args.places.golden_dir.clone(),
        own_goldens: false,
        golden_mode: GoldenMode::Pending,
        step_timeout: runner::DEFAULT_STEP_TIMEOUT,
        startup_timeout: runner::DEFAULT_STARTUP_TIMEOUT,
        mode: runner::Mode::Strict,
        peer_exe: std::env::current_exe().ok(),
        features: Default::default(),
        wire_dir: None,
        fail_fast: false,
    }
}

/// Every family × side of the registry with the sides' `contract-impl` arguments.
fn sides(only: Option<&str>) -> Vec<(&'static str, Side, &'static str)> {
    FAMILIES
        .iter()
        .filter(|f| only.is_none_or(|o| o == f.name))
        .flat_map(|f| f.sides.iter().map(move |s| (f.name, s.side, s.impl_args)))
        .collect()
}

/// `contract-harness sides`: `family side contract-impl-arguments`, one per line.
pub fn print_sides() -> ExitCode {
    for (family, side, impl_args) in sides(None) {
        say!("{family} {side} {impl_args}");
    }
    ExitCode::SUCCESS
}

/// `golden refresh`: replays every family × side against our implementation, writing a
/// `.pending` file for every golden that changed or is missing (side-core goldens too).
pub fn refresh(args: &ImplArgs) -> ExitCode {
    if !args.impl_bin.exists() {
        warn!(
            "--impl {}: no such file (build it first)",
            args.impl_bin.display()
        );
        return ExitCode::from(2);
    }
    let rt = match rt() {
        Ok(rt) => rt,
        Err(e) => {
            warn!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = 0;
    for (family, side, impl_args) in sides(args.family.as_deref()) {
        let scenarios = match load_family(&args.places.scenarios, family) {
            Ok(s) => s,
            Err(errors) => {
                for e in errors {
                    warn!("{e}");
                }
                return ExitCode::from(2);
            }
        };
        let runs: Vec<_> = stability::sample(&scenarios, side, None)
            .into_iter()
            .map(|s| (s, side))
            .collect();
        let opts = options(args, impl_args);
        let many = rt.block_on(runner::run_many(
            runs,
            &opts,
            runner::default_jobs(),
            |_| {},
        ));
        let pending = |r: &&contract_harness::report::ScenarioResult| {
            r.code == Some(contract_harness::drive::FailureCode::GoldenMismatch)
        };
        let golden = many.results.iter().filter(pending).count();
        let other: Vec<_> = many
            .results
            .iter()
            .filter(|r| !r.passed && !pending(r))
            .collect();
        failed += other.len();
        say!(
            "{family} [{side}]: {} replayed, {golden} golden(s) pending, {} failed otherwise",
            many.results.len(),
            other.len()
        );
        // A step that no longer matches writes no golden: name it with what the
        // scenario covers, so the wire change is still told in the spec's terms.
        for r in other {
            let covers = scenarios
                .iter()
                .find(|s| s.id() == r.scenario)
                .map(|s| s.covers.join(", "))
                .unwrap_or_default();
            say!(
                "  FAIL {} [{}] (covers {covers}): {}",
                r.scenario,
                r.side,
                r.failure_line()
            );
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `golden changes`: the wire-change report since `base`.
pub fn changes(places: &Places, base: Option<&str>, json: bool) -> ExitCode {
    let repo = Path::new(".");
    let base = base.map_or_else(|| changes::default_base(repo), str::to_string);
    let (pairs, sources) = match changes::collect(repo, &places.golden_dir, &base) {
        Ok(found) => found,
        Err(e) => {
            warn!("golden changes: {e}");
            return ExitCode::from(2);
        }
    };
    let generated: std::cell::RefCell<
        std::collections::BTreeMap<String, Vec<contract_harness::scenario::Scenario>>,
    > = Default::default();
    let covers = |family: &str, name: &str| -> Vec<Covered> {
        let sections: Vec<requirements::Requirement> = requirements::load_catalog(
            &places
                .scenarios
                .join("requirements")
                .join(format!("{family}.yaml")),
        )
        .unwrap_or_default();
        let path = places.scenarios.join(family).join(format!("{name}.yaml"));
        // A scenario generated from the family's value table has no file of its own: the
        // family's generated scenarios are read once.
        load_scenario(&path)
            .map(|s| s.covers)
            .ok()
            .or_else(|| {
                let mut cache = generated.borrow_mut();
                let loaded = cache.entry(family.to_string()).or_insert_with(|| {
                    let table =
                        contract_harness::scenario::tables::table_path(&places.scenarios, family);
                    contract_harness::scenario::tables::load_table(&table, family)
                        .unwrap_or_default()
                });
                loaded
                    .iter()
                    .find(|s| s.name == name)
                    .map(|s| s.covers.clone())
            })
            .unwrap_or_default()
            .into_iter()
            .map(|id| Covered {
                section: sections
                    .iter()
                    .find(|r| r.id == id)
                    .map(|r| r.section.clone())
                    .unwrap_or_default(),
                id,
            })
            .collect()
    };
    let report = changes::report(base, &pairs, sources, &covers);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => say!("{text}"),
            Err(e) => {
                warn!("{e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        say_text!("{}", changes::markdown(&report));
    }
    ExitCode::SUCCESS
}

/// `golden stable`: every side's scenarios (or a sample of each) replayed one at a time
/// and with `jobs` at once must write byte-identical goldens.
pub fn stable(args: &ImplArgs, sample: Option<usize>, jobs: Option<usize>) -> ExitCode {
    let rt = match rt() {
        Ok(rt) => rt,
        Err(e) => {
            warn!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let jobs = jobs.unwrap_or_else(runner::default_jobs).max(2);
    let mut ok = true;
    for (family, side, impl_args) in sides(args.family.as_deref()) {
        let scenarios = match load_family(&args.places.scenarios, family) {
            Ok(s) => stability::sample(&s, side, sample),
            Err(errors) => {
                for e in errors {
                    warn!("{e}");
                }
                return ExitCode::from(2);
            }
        };
        let opts = options(args, impl_args);
        match rt.block_on(stability::check_side(&scenarios, side, &opts, jobs)) {
            Ok(found) => {
                say!(
                    "{family} [{side}]: {} replayed with --jobs 1 and --jobs {jobs}: {}",
                    found.replayed,
                    if found.is_ok() {
                        "goldens identical"
                    } else {
                        "NOT STABLE"
                    }
                );
                for line in found.failures.iter().chain(&found.differences) {
                    say!("  {line}");
                }
                ok &= found.is_ok();
            }
            Err(e) => {
                warn!("{family} [{side}]: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `golden audit`: per family × side of the registry, every recorded frame field that no
/// step of its scenario asserts (`crate::audit`), one line each, then a count per side.
/// A report, never a failure: exit 0 unless a scenario or golden cannot be read.
pub fn audit(places: &Places, family: Option<&str>) -> ExitCode {
    if let Some(name) = family
        && contract_harness::family::family(name).is_none()
    {
        warn!(
            "--family: unknown family `{name}`; families: {}",
            contract_harness::family::known()
        );
        return ExitCode::from(2);
    }
    if !places.golden_dir.is_dir() {
        warn!(
            "--golden-dir {}: not a directory of goldens",
            places.golden_dir.display()
        );
        return ExitCode::from(2);
    }
    let mut unreadable = 0;
    for (family, side, _) in sides(family) {
        let scenarios = match load_family(&places.scenarios, family) {
            Ok(s) => s,
            Err(errors) => {
                errors.iter().for_each(|e| warn!("{e}"));
                return ExitCode::from(2);
            }
        };
        let (mut fields, mut family_steps) = (0, std::collections::BTreeMap::new());
        for scenario in scenarios.iter().filter(|s| s.runs_on(side)) {
            let path = contract_harness::golden::golden_path(
                &places.golden_dir,
                family,
                &scenario.name,
                side,
            );
            let Ok(text) = std::fs::read_to_string(&path) else {
                // A pending side or a refusal scenario of another declaration may have
                // no golden of this name; anything else is worth saying.
                if scenario.pending_reason(side).is_none() && path.exists() {
                    warn!("{}: unreadable", path.display());
                    unreadable += 1;
                }
                continue;
            };
            let findings = contract_harness::audit::audit(scenario, &text);
            fields += findings.iter().map(|f| f.fields.len()).sum::<usize>();
            for step in findings.iter().filter_map(|f| f.family_step.as_deref()) {
                *family_steps.entry(step.to_string()).or_insert(0usize) += 1;
            }
            let fields_only: Vec<_> = findings
                .into_iter()
                .filter(|f| f.family_step.is_none())
                .collect();
            say_text!(
                "{}",
                contract_harness::audit::render(side.as_str(), &fields_only)
            );
        }
        let by_steps: Vec<String> = family_steps
            .iter()
            .map(|(step, n)| format!("{n} by `{step}`"))
            .collect();
        say!(
            "{family} [{side}]: {fields} golden-only field(s); frames recorded by family steps \
             (checked as each step documents): {}",
            if by_steps.is_empty() {
                "none".to_string()
            } else {
                by_steps.join(", ")
            }
        );
    }
    if unreadable == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
