//! The worker protocol (`worker-protocol.md`, "Runtime control protocol v1"): a host runs
//! a Python worker over one private Unix socket with 4-byte length-prefixed JSON frames.
//!
//! * [`wire`]: the single definition of the wire: framing, envelope, messages, bounds,
//!   strict decoding with stable error codes. The host, the harness and the conformance
//!   corpus all use it.
//! * [`python`]: the Python worker (stdlib only), shipped inside the binary and started
//!   by `contract-impl worker python`.
//!
//! This module owns the protocol's types and rules; it never decides what a host request
//! does (that is the host's).

pub mod python;
pub mod wire;
