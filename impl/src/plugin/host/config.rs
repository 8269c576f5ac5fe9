//! A plugin's configuration ("Identity and launch": "Configuration includes a canonical
//! absolute executable path, expected SHA-256, plugin name, startup/call/drain bounds, and
//! approved capabilities").
//!
//! Read from a JSON file (strict: unknown keys, duplicate keys and non-finite numbers are
//! refused). The executable is never looked up in `PATH` and no directory is scanned: the
//! path must already be absolute and canonical (no symbolic link, no `.` or `..`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::plugin::wire::{KNOWN_CAPABILITIES, MAX_DRAIN_TIMEOUT_MS, check_tool_name};

/// Longest startup bound a configuration may set, in milliseconds.
pub const MAX_STARTUP_TIMEOUT_MS: u64 = 600_000;

/// Longest call bound a configuration may set, in milliseconds.
pub const MAX_CALL_TIMEOUT_MS: u64 = 3_600_000;

/// Most arguments and environment entries a configuration may pass.
pub const MAX_ARGS: usize = 64;

/// Default startup bound (launch to a validated candidate), in milliseconds.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u64 = 10_000;

/// Default call bound, in milliseconds.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 60_000;

/// Default drain bound, in milliseconds.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 5_000;

/// Why a configuration is refused (stable `code()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read or is not the configuration's JSON.
    #[error("invalid_config: {0}")]
    Invalid(String),
    /// The executable path is relative, not canonical, or a bare name.
    #[error("executable_not_canonical: {0}")]
    NotCanonical(String),
    /// A bound is outside its range.
    #[error("invalid_bound: {0}")]
    Bound(String),
    /// An approved capability is not one this host knows.
    #[error("unknown_capability: {0}")]
    UnknownCapability(String),
}

impl ConfigError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Invalid(_) => "invalid_config",
            ConfigError::NotCanonical(_) => "executable_not_canonical",
            ConfigError::Bound(_) => "invalid_bound",
            ConfigError::UnknownCapability(_) => "unknown_capability",
        }
    }
}

/// One plugin's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The plugin's name; the manifest must carry the same.
    pub name: String,
    /// The canonical absolute path of the executable.
    pub executable: PathBuf,
    /// Its expected SHA-256, 64 lowercase hexadecimal characters.
    pub sha256: String,
    /// Arguments after the program name (at most [`MAX_ARGS`]).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment entries the plugin receives besides the launch contract's own (the
    /// plugin inherits nothing else of the host's environment).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The capabilities the plugin's tools may use.
    #[serde(default)]
    pub approved_capabilities: Vec<String>,
    /// Launch to a validated candidate, in milliseconds (1 to [`MAX_STARTUP_TIMEOUT_MS`]).
    #[serde(default = "default_startup")]
    pub startup_timeout_ms: u64,
    /// One call, in milliseconds (1 to [`MAX_CALL_TIMEOUT_MS`]).
    #[serde(default = "default_call")]
    pub call_timeout_ms: u64,
    /// A drain, in milliseconds (1 to [`MAX_DRAIN_TIMEOUT_MS`]).
    #[serde(default = "default_drain")]
    pub drain_timeout_ms: u64,
}

fn default_startup() -> u64 {
    DEFAULT_STARTUP_TIMEOUT_MS
}
fn default_call() -> u64 {
    DEFAULT_CALL_TIMEOUT_MS
}
fn default_drain() -> u64 {
    DEFAULT_DRAIN_TIMEOUT_MS
}

impl PluginConfig {
    /// Reads and validates the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| ConfigError::Invalid(format!("{}: {e}", path.display())))?;
        let value = crate::wire::strict::parse_strict(&bytes)
            .map_err(|e| ConfigError::Invalid(format!("{}: {e}", path.display())))?;
        let config: Self = serde_json::from_value(value)
            .map_err(|e| ConfigError::Invalid(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_tool_name(&self.name).map_err(|e| ConfigError::Invalid(format!("name: {e}")))?;
        if !self.executable.is_absolute() {
            return Err(ConfigError::NotCanonical(format!(
                "{} is not absolute (no PATH lookup is done)",
                self.executable.display()
            )));
        }
        match std::fs::canonicalize(&self.executable) {
            // Byte for byte: `Path` equality would ignore a `.` component.
            Ok(canonical) if canonical.as_os_str() == self.executable.as_os_str() => {}
            Ok(canonical) => {
                return Err(ConfigError::NotCanonical(format!(
                    "{} is not canonical (it resolves to {})",
                    self.executable.display(),
                    canonical.display()
                )));
            }
            Err(e) => {
                return Err(ConfigError::NotCanonical(format!(
                    "{}: {e}",
                    self.executable.display()
                )));
            }
        }
        if !crate::plugin::wire::is_secret_shaped(&self.sha256) {
            return Err(ConfigError::Invalid(
                "sha256 must be 64 lowercase hexadecimal characters".into(),
            ));
        }
        if self.args.len() > MAX_ARGS || self.env.len() > MAX_ARGS {
            return Err(ConfigError::Invalid(format!(
                "at most {MAX_ARGS} arguments and {MAX_ARGS} environment entries"
            )));
        }
        if let Some(k) = self.env.keys().find(|k| k.starts_with("RUNTIME_PLUGIN_")) {
            return Err(ConfigError::Invalid(format!(
                "env: {k} belongs to the launch contract"
            )));
        }
        for (field, value, max) in [
            (
                "startup_timeout_ms",
                self.startup_timeout_ms,
                MAX_STARTUP_TIMEOUT_MS,
            ),
            ("call_timeout_ms", self.call_timeout_ms, MAX_CALL_TIMEOUT_MS),
            (
                "drain_timeout_ms",
                self.drain_timeout_ms,
                MAX_DRAIN_TIMEOUT_MS,
            ),
        ] {
            if !(1..=max).contains(&value) {
                return Err(ConfigError::Bound(format!(
                    "{field} is 1 to {max}, not {value}"
                )));
            }
        }
        if let Some(c) = self
            .approved_capabilities
            .iter()
            .find(|c| !KNOWN_CAPABILITIES.contains(&c.as_str()))
        {
            return Err(ConfigError::UnknownCapability(format!(
                "{c} (known: {})",
                KNOWN_CAPABILITIES.join(", ")
            )));
        }
        Ok(())
    }

    /// [`Self::startup_timeout_ms`] as a duration.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.startup_timeout_ms)
    }
    /// [`Self::call_timeout_ms`] as a duration.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }
    /// [`Self::drain_timeout_ms`] as a duration.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(exe: &Path) -> PluginConfig {
        PluginConfig {
            name: "p".into(),
            executable: exe.to_path_buf(),
            sha256: "0".repeat(64),
            args: vec![],
            env: BTreeMap::new(),
            approved_capabilities: vec![],
            startup_timeout_ms: 1,
            call_timeout_ms: MAX_CALL_TIMEOUT_MS,
            drain_timeout_ms: MAX_DRAIN_TIMEOUT_MS,
        }
    }

    #[test]
    fn the_path_must_be_absolute_and_canonical() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::fs::canonicalize(dir.path()).unwrap().join("plugin");
        std::fs::write(&exe, b"x").unwrap();
        assert_eq!(config(&exe).validate(), Ok(()));
        let link = exe.with_file_name("link");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        assert_eq!(
            config(&link).validate().unwrap_err().code(),
            "executable_not_canonical"
        );
        let dotted = exe.parent().unwrap().join(".").join("plugin");
        assert_eq!(
            config(&dotted).validate().unwrap_err().code(),
            "executable_not_canonical"
        );
        assert_eq!(
            config(Path::new("plugin")).validate().unwrap_err().code(),
            "executable_not_canonical"
        );
    }

    #[test]
    fn bounds_and_capabilities_at_their_edges() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::fs::canonicalize(dir.path()).unwrap().join("plugin");
        std::fs::write(&exe, b"x").unwrap();
        let mut c = config(&exe);
        c.startup_timeout_ms = 0;
        assert_eq!(c.validate().unwrap_err().code(), "invalid_bound");
        c.startup_timeout_ms = MAX_STARTUP_TIMEOUT_MS + 1;
        assert_eq!(c.validate().unwrap_err().code(), "invalid_bound");
        c.startup_timeout_ms = MAX_STARTUP_TIMEOUT_MS;
        c.drain_timeout_ms = MAX_DRAIN_TIMEOUT_MS + 1;
        assert_eq!(c.validate().unwrap_err().code(), "invalid_bound");
        c.drain_timeout_ms = 1;
        c.approved_capabilities = vec!["network.listen".into()];
        assert_eq!(c.validate().unwrap_err().code(), "unknown_capability");
        c.approved_capabilities = vec!["network.connect".into()];
        assert_eq!(c.validate(), Ok(()));
        c.env.insert("RUNTIME_PLUGIN_SECRET".into(), "x".into());
        assert_eq!(c.validate().unwrap_err().code(), "invalid_config");
    }
}
