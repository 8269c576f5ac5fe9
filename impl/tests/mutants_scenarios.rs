//! The test command of `make mutants`: the core_runtime scenario suite of both sides
//! (`runtime` and `core`) against this build of `contract-impl`, which cargo-mutants has
//! mutated. The checker is not: the harness binary comes from the unmutated tree
//! (`CONTRACT_MUTANTS_HARNESS`, built and copied by `make mutants`), so a mutation of
//! the shared wire code cannot weaken the checks it is judged by.
//!
//! Ignored in ordinary runs (`make check` runs the same suite through the harness's own
//! contract test); `make mutants` runs it with `-- --ignored`.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "the test command of `make mutants` (needs CONTRACT_MUTANTS_HARNESS)"]
fn the_scenario_suites_of_both_sides_pass() {
    let harness = std::env::var_os("CONTRACT_MUTANTS_HARNESS")
        .expect("CONTRACT_MUTANTS_HARNESS names the unmutated contract-harness binary");
    let target = env!("CARGO_BIN_EXE_contract-impl");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failed = Vec::new();
    for (side, args) in [("runtime", "runtime"), ("core", "core serve")] {
        let output = Command::new(&harness)
            .args(["run", "--family", "core_runtime", "--side", side])
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
            failed.push(format!("side {side}: {}", failures.join("; ")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
