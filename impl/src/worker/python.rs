//! The Python worker (`python/contract_worker.py`, stdlib only), shipped inside the
//! binary: `contract-impl worker python` replaces itself (exec, same process and process
//! group) with `python3 -B -c <source>`, so a host starts exactly the program it would
//! start from a file, with the environment of the launch contract
//! (`docs/worker-launch-contract.md`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The worker's source.
pub const SOURCE: &str = include_str!("python/contract_worker.py");

/// The interpreter used unless `CONTRACT_PYTHON` names another.
pub const DEFAULT_PYTHON: &str = "python3";

/// The interpreter: `CONTRACT_PYTHON`, else [`DEFAULT_PYTHON`] (looked up in `PATH`).
pub fn interpreter() -> OsString {
    std::env::var_os("CONTRACT_PYTHON").unwrap_or_else(|| DEFAULT_PYTHON.into())
}

/// The variable that selects the worker's profile (`different`: every choice the spec
/// leaves free made otherwise; see the source's `DIFFERENT`).
pub const PROFILE_ENV: &str = "CONTRACT_WORKER_PROFILE";

/// Replaces this process with the Python worker (`different`: with the profile that
/// makes the spec's free choices otherwise; `skills`: the materialized skills set, passed
/// on as `--skills <path>`). Returns only when the exec failed.
pub fn exec(different: bool, skills: Option<&std::path::Path>) -> std::io::Error {
    let mut command = Command::new(interpreter());
    command.arg("-B").arg("-c").arg(SOURCE);
    if let Some(path) = skills {
        command.arg(super::skills::set::SKILLS_ARG).arg(path);
    }
    if different {
        command.env(PROFILE_ENV, "different");
    } else {
        command.env_remove(PROFILE_ENV);
    }
    command.exec()
}
