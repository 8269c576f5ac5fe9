//! The scripted kernel ("A deterministic scripted kernel behind [the daemon]"): the
//! definitions' programs, read from a run's initial message so every protocol rule can
//! be made observable. The daemon's executor ([`super::daemon::executor`]) runs them.
//!
//! This module is pure: it parses and validates, it never runs anything.

pub mod script;
