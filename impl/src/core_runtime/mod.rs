//! The Core ↔ Runtime daemon protocol (`core-runtime-protocol`).
//!
//! * [`wire`]: the single wire definition both sides use.
//! * [`adapter`]: the Harness adapter contract and the controlled adapter.
//! * [`store`]: Core's durable records (SQLite).
//! * [`gateway`]: Core's server (machine-connection API, scheduling, public API).
//! * [`mod@bench`]: `contract-impl core bench`, a burst Turn against its floors.

pub mod adapter;
pub mod bench;
pub mod daemon;
pub mod gateway;
pub mod store;
pub mod transfer;
pub mod wire;
pub mod workspace;
