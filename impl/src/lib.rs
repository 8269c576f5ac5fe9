//! Reference implementation of the runtime-contract wire protocols.
//!
//! * [`wire`]: strict JSON, identifiers and bounded types shared by every family.
//! * [`core_runtime`]: the Core ↔ Runtime daemon protocol.

pub mod core_runtime;
pub mod wire;
