//! The Core ↔ Runtime daemon protocol (`core-runtime-protocol`).
//!
//! * [`wire`]: the single wire definition both sides use.

pub mod wire;
