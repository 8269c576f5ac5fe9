//! Reference implementation of the runtime-contract wire protocols.
//!
//! * [`wire`]: strict JSON, identifiers and bounded types shared by every family.
//! * [`core_runtime`]: the Core ↔ Runtime daemon protocol.
//! * [`worker`]: the host ↔ Python worker protocol (wire and the Python worker).
//! * [`engine`]: the local engine protocol (its generated gRPC code and negotiation).
//! * [`plugin`]: the tool plugin protocol (its generated gRPC code, the SDK and the
//!   fixture plugin).
//! * [`process`]: process-group supervision and bounded output tails, for every host
//!   that runs programs.
//! * [`control`]: the line-oriented control channel through which a conformance harness
//!   drives our worker host and our engine client.

pub mod control;
pub mod core_runtime;
pub mod durable;
pub mod engine;
pub mod plugin;
pub mod private_fs;
pub mod process;
pub mod wire;
pub mod worker;
