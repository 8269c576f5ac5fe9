//! The plugin host (`plugin-protocol.md`): configuration ([`config`]), the executable
//! verified and kept open ([`verify`]), launching and validating a candidate
//! ([`launch`], [`validate`]), generations, leases and drain ([`generations`]) and calls
//! ([`calls`]).
//!
//! The host never looks a program up in `PATH`, never scans a directory, never executes
//! a file it has not hashed through the same descriptor, never makes a candidate visible
//! before every fact validated, and never replays a call.

pub mod calls;
pub mod config;
pub mod generations;
pub mod launch;
pub mod validate;
pub mod verify;

pub use calls::{CallError, ToolOutcome};
pub use config::PluginConfig;
pub use generations::{Lease, PluginHost};
pub use launch::LaunchError;
