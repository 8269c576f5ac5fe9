//! The test command of `make mutants`: the core_runtime scenario suite of both sides
//! (`runtime` and `core`, side runtime also with its refusal scenarios, as `make
//! contract-refusals`), and the worker family's host side, against this build of
//! `contract-impl`, which cargo-mutants has mutated. The checker is not: the harness binary comes from the unmutated tree
//! (`CONTRACT_MUTANTS_HARNESS`, built and copied by `make mutants`), so a mutation of
//! the shared wire code cannot weaken the checks it is judged by.
//!
//! Ignored in ordinary runs (`make check` runs the same suite through the harness's own
//! contract test); `make mutants` runs it with `-- --ignored`.

use std::path::Path;
use std::process::Command;

/// The suites run against each mutant: (family, side, `contract-impl` arguments, extra
/// harness arguments). Both sides of core_runtime, whose modules are mutated, and our
/// worker host, the only user of the shared length-prefixed framing
/// (`impl/src/wire/framing.rs`); the rest of `impl/src/wire` is on core_runtime's path.
/// Then the refusal scenarios, as `make contract-refusals` runs them (`run --refusals`:
/// each launched lacking exactly what it requires `false`); against the full
/// declaration they are not applicable, so a mutant of a capability check (an
/// undeclared export performed, or a read refused for the owner's missing export) would
/// survive. Last, the Runtime under
/// the launch profile that makes the spec's free choices the other way
/// (`--wire-profile different`, judged in vendor mode as `make check` judges it): the
/// profile's own paths (the newest due close first, the connection closed at a shutdown
/// signal) are the daemon's code too.
fn suites() -> Vec<(&'static str, &'static str, &'static str, Vec<String>)> {
    vec![
        ("core_runtime", "runtime", "runtime", vec![]),
        ("core_runtime", "core", "core serve", vec![]),
        ("worker", "host", "worker host", vec![]),
        (
            "core_runtime",
            "runtime",
            "runtime",
            vec!["--refusals".into()],
        ),
        (
            "core_runtime",
            "runtime",
            "runtime --wire-profile different",
            vec!["--mode".into(), "vendor".into()],
        ),
    ]
}

#[test]
#[ignore = "the test command of `make mutants` (needs CONTRACT_MUTANTS_HARNESS)"]
fn the_scenario_suites_of_both_sides_pass() {
    let harness = std::env::var_os("CONTRACT_MUTANTS_HARNESS")
        .expect("CONTRACT_MUTANTS_HARNESS names the unmutated contract-harness binary");
    let target = env!("CARGO_BIN_EXE_contract-impl");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failed = Vec::new();
    for (family, side, args, extra) in suites() {
        let output = Command::new(&harness)
            .args(["run", "--family", family, "--side", side, "--fail-fast"])
            .args(&extra)
            .arg("--scenarios")
            .arg(root.join("scenarios"))
            .arg("--target-cmd")
            .arg(format!("{target} {args}"))
            .current_dir(&root)
            .output()
            .expect("the harness runs");
        if !output.status.success() {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let failures: Vec<&str> = stdout
                .lines()
                .filter(|l| l.starts_with("FAIL") || l.starts_with("ABORTED"))
                .collect();
            failed.push(format!(
                "{family} side {side} {}: {}",
                extra.join(" "),
                failures.join("; ")
            ));
            // One failed suite kills the mutant: the others need not run.
            break;
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
