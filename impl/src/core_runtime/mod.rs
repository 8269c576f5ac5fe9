//! The Core ↔ Runtime daemon protocol (`core-runtime-protocol`).
//!
//! * [`wire`]: the single wire definition both sides use.
//! * [`adapter`]: the Harness adapter contract and the controlled adapter.

pub mod adapter;
pub mod daemon;
pub mod transfer;
pub mod wire;
pub mod workspace;
