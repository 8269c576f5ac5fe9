//! Checking a `workspace.run` request before anything runs: its bounds, its `argv`, the
//! environment the program gets, and its working directory inside the workspace. Pure
//! apart from resolving the `cwd` on the file system; it never starts a process.
//!
//! Our readings (the spec gives the request's shape, `{"argv":["cargo","check"],
//! "cwd":".","env":{},"timeout_ms":120000,"max_output_bytes":750000}`, and nothing more):
//!
//! * `cwd` is resolved against the workspace root (an absolute `cwd` is taken as it is)
//!   and must stay inside it: lexically (`..` never climbs above the root) and once
//!   canonicalized (no symlink leads out of it). It must be an existing directory.
//! * The environment is **not** the host's: it is the names of [`INHERITED_ENV`] the
//!   host has, `PATH` defaulting to [`DEFAULT_PATH`], then the request's `env` over
//!   them. The host's own variables (its control socket, a worker's token) never reach
//!   the program.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::{RUN_OUTPUT_BYTES_MAX, RUN_TIMEOUT_MS_MAX, WorkspaceError, echo};

/// The host variables a run inherits, when the host has them; their values are the
/// host's. Our reference choice: what a build tool needs to find itself, its home and
/// its locale (the spec's example runs `cargo check`), and nothing that names a host
/// resource or secret.
pub const INHERITED_ENV: &[&str] = &[
    "CARGO_HOME",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LOGNAME",
    "PATH",
    "RUSTUP_HOME",
    "TMPDIR",
    "TZ",
    "USER",
];

/// `PATH` of a run when the host has none (and the request sets none). Our reference
/// choice.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A `workspace.run` request as it arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked<'a> {
    pub(super) argv: &'a [String],
    pub(super) cwd: &'a str,
    pub(super) env: &'a BTreeMap<String, String>,
    pub(super) timeout_ms: u64,
    pub(super) max_output_bytes: u64,
}

/// A checked run: everything the process needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunSpec {
    /// Program and arguments (non-empty).
    pub(super) argv: Vec<OsString>,
    /// The canonical working directory, inside the workspace.
    pub(super) cwd: PathBuf,
    /// The whole environment of the program.
    pub(super) env: Vec<(OsString, OsString)>,
    /// Time bound.
    pub(super) timeout: Duration,
    /// Output bound, stdout and stderr together.
    pub(super) max_output: usize,
}

/// Checks `asked` against the workspace `root` (canonical), with `host_env` the host's
/// environment: bounds first, then `argv`, `env`, and last the `cwd` on disk.
///
/// # Errors
/// The first [`WorkspaceError`] found.
pub(super) fn check(
    root: &Path,
    asked: Asked<'_>,
    host_env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<RunSpec, WorkspaceError> {
    if asked.timeout_ms == 0 || asked.timeout_ms > RUN_TIMEOUT_MS_MAX {
        return Err(WorkspaceError::TimeoutOutOfRange(asked.timeout_ms));
    }
    if asked.max_output_bytes == 0 || asked.max_output_bytes > RUN_OUTPUT_BYTES_MAX {
        return Err(WorkspaceError::OutputBoundOutOfRange(
            asked.max_output_bytes,
        ));
    }
    if asked.argv.first().is_none_or(String::is_empty) {
        return Err(WorkspaceError::ArgvEmpty);
    }
    for (i, arg) in asked.argv.iter().enumerate() {
        no_nul(&format!("argv[{i}]"), arg)?;
    }
    let env = run_env(host_env, asked.env)?;
    let cwd = resolve_cwd(root, asked.cwd)?;
    Ok(RunSpec {
        argv: asked.argv.iter().map(OsString::from).collect(),
        cwd,
        env,
        timeout: Duration::from_millis(asked.timeout_ms),
        // At most RUN_OUTPUT_BYTES_MAX, so it fits.
        max_output: usize::try_from(asked.max_output_bytes).unwrap_or(usize::MAX),
    })
}

fn no_nul(field: &str, value: &str) -> Result<(), WorkspaceError> {
    if value.contains('\0') {
        return Err(WorkspaceError::InvalidArgument {
            field: echo(field),
            reason: "holds a NUL byte",
        });
    }
    Ok(())
}

/// The environment of a run: the [`INHERITED_ENV`] names `host_env` has (`PATH`
/// defaulting to [`DEFAULT_PATH`]), then `asked` over them, sorted by name.
///
/// # Errors
/// [`WorkspaceError::InvalidArgument`]: a name that is empty or holds `=` or NUL, a
/// value that holds NUL.
pub(super) fn run_env(
    host_env: impl IntoIterator<Item = (OsString, OsString)>,
    asked: &BTreeMap<String, String>,
) -> Result<Vec<(OsString, OsString)>, WorkspaceError> {
    let mut env: BTreeMap<OsString, OsString> = host_env
        .into_iter()
        .filter(|(name, _)| INHERITED_ENV.iter().any(|n| name.as_os_str() == *n))
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    for (name, value) in asked {
        let field = format!("env.{name}");
        if name.is_empty() || name.contains('=') {
            return Err(WorkspaceError::InvalidArgument {
                field: echo(&field),
                reason: "a variable name is not empty and holds no `=`",
            });
        }
        no_nul(&field, name)?;
        no_nul(&field, value)?;
        env.insert(name.into(), value.into());
    }
    Ok(env.into_iter().collect())
}

/// `cwd` resolved against `root` (canonical): the canonical directory, inside `root`.
///
/// # Errors
/// [`WorkspaceError::CwdOutside`] (lexically or once symlinks are resolved),
/// [`WorkspaceError::CwdNotFound`] (missing, or not a directory),
/// [`WorkspaceError::InvalidArgument`] (empty, or a NUL byte).
pub(super) fn resolve_cwd(root: &Path, cwd: &str) -> Result<PathBuf, WorkspaceError> {
    if cwd.is_empty() {
        return Err(WorkspaceError::InvalidArgument {
            field: "cwd".into(),
            reason: "is empty (the workspace root is `.`)",
        });
    }
    no_nul("cwd", cwd)?;
    let asked = Path::new(cwd);
    let joined = root.join(asked);
    // Lexically first: a `..` above the root is refused without touching the disk.
    let mut depth: Vec<&std::ffi::OsStr> = Vec::new();
    for component in joined.components() {
        match component {
            Component::RootDir | Component::Prefix(_) => depth.clear(),
            Component::CurDir => {}
            Component::ParentDir => {
                depth.pop();
            }
            Component::Normal(name) => depth.push(name),
        }
        let here: PathBuf = std::iter::once(Component::RootDir.as_os_str())
            .chain(depth.iter().copied())
            .collect();
        if matches!(component, Component::ParentDir) && !here.starts_with(root) {
            return Err(WorkspaceError::CwdOutside(echo(cwd)));
        }
    }
    let canonical = joined
        .canonicalize()
        .map_err(|e| WorkspaceError::CwdNotFound {
            cwd: echo(cwd),
            reason: e.to_string(),
        })?;
    if !canonical.starts_with(root) {
        return Err(WorkspaceError::CwdOutside(echo(cwd)));
    }
    if !canonical.is_dir() {
        return Err(WorkspaceError::CwdNotFound {
            cwd: echo(cwd),
            reason: "not a directory".into(),
        });
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(n, v)| format!("{}={}", n.to_string_lossy(), v.to_string_lossy()))
            .collect()
    }

    #[test]
    fn the_environment_is_the_allow_list_then_the_request_and_never_a_host_secret() {
        let host = [
            ("HOME", "/home/u"),
            ("CONTRACT_WORKER_TOKEN", "tok-secret"),
            ("CONTRACT_HOST_CONTROL_SOCKET", "/run/ctl.sock"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("LANG", "C.UTF-8"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let asked = BTreeMap::from([("LANG".to_string(), "C".to_string())]);
        let env = run_env(host, &asked).unwrap();
        assert_eq!(
            names(&env),
            ["HOME=/home/u", "LANG=C", &format!("PATH={DEFAULT_PATH}")]
        );
        let asked = BTreeMap::from([("PATH".to_string(), "/opt/bin".to_string())]);
        assert_eq!(names(&run_env([], &asked).unwrap()), ["PATH=/opt/bin"]);
        for bad in ["", "A=B", "A\0B"] {
            let asked = BTreeMap::from([(bad.to_string(), "v".to_string())]);
            assert_eq!(
                run_env([], &asked).unwrap_err().code(),
                "invalid_argument",
                "{bad:?}"
            );
        }
        let asked = BTreeMap::from([("A".to_string(), "v\0".to_string())]);
        assert_eq!(run_env([], &asked).unwrap_err().code(), "invalid_argument");
    }

    #[test]
    fn cwd_stays_inside_the_workspace_lexically_and_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::os::unix::fs::symlink("/", root.join("escape")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("inside")).unwrap();
        std::os::unix::fs::symlink("..", root.join("sub/up")).unwrap();
        let ok = |cwd: &str| resolve_cwd(&root, cwd).unwrap();
        let code = |cwd: &str| resolve_cwd(&root, cwd).unwrap_err().code();
        assert_eq!(ok("."), root);
        assert_eq!(ok("sub/deeper/.."), root.join("sub"));
        assert_eq!(ok("inside"), root.join("sub"));
        assert_eq!(ok("sub/up"), root);
        assert_eq!(ok(root.to_str().unwrap()), root);
        for outside in [
            "..",
            "../..",
            "sub/../..",
            "sub/../../x",
            "escape",
            "escape/tmp",
        ] {
            assert_eq!(code(outside), "cwd_outside_workspace", "{outside}");
        }
        assert_eq!(code("/"), "cwd_outside_workspace");
        assert_eq!(code("sub/up/.."), "cwd_outside_workspace");
        assert_eq!(code("missing"), "cwd_not_found");
        assert_eq!(code("file"), "cwd_not_found");
        assert_eq!(code(""), "invalid_argument");
        assert_eq!(code("a\0b"), "invalid_argument");
    }

    #[test]
    fn bounds_and_argv_are_checked_before_the_disk() {
        let root = Path::new("/nonexistent-root");
        let env = BTreeMap::new();
        let argv = vec!["true".to_string()];
        let asked = |argv: &'static [&str], timeout_ms, max_output_bytes| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let asked = Asked {
                argv: &argv,
                cwd: ".",
                env: &env,
                timeout_ms,
                max_output_bytes,
            };
            check(root, asked, []).unwrap_err().code()
        };
        assert_eq!(asked(&["true"], 0, 1), "timeout_out_of_range");
        assert_eq!(
            asked(&["true"], RUN_TIMEOUT_MS_MAX + 1, 1),
            "timeout_out_of_range"
        );
        assert_eq!(asked(&["true"], 1, 0), "output_bound_out_of_range");
        assert_eq!(
            asked(&["true"], 1, RUN_OUTPUT_BYTES_MAX + 1),
            "output_bound_out_of_range"
        );
        assert_eq!(asked(&[], 1, 1), "argv_empty");
        assert_eq!(asked(&[""], 1, 1), "argv_empty");
        assert_eq!(asked(&["sh", "a\0"], 1, 1), "invalid_argument");
        // Within every bound, only the missing root is left to refuse.
        let ok = Asked {
            argv: &argv,
            cwd: ".",
            env: &env,
            timeout_ms: RUN_TIMEOUT_MS_MAX,
            max_output_bytes: RUN_OUTPUT_BYTES_MAX,
        };
        assert_eq!(check(root, ok, []).unwrap_err().code(), "cwd_not_found");
    }
}
