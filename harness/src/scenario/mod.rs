//! Scenarios: the typed model, the strict YAML loader and the semantic validation.
//!
//! This module owns turning `scenarios/<family>/<name>.yaml` into a [`Scenario`]. It
//! never runs anything: no sockets, no processes, no clocks.

pub mod families;
pub mod loader;
pub mod model;
pub mod tables;
pub mod validation;

pub use loader::{LoadError, load_family, load_scenario};
pub use model::*;
