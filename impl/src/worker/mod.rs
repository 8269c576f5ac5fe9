//! The worker protocol (`worker-protocol.md`, "Runtime control protocol v1"): a host runs
//! a Python worker over one private Unix socket with 4-byte length-prefixed JSON frames.
//!
//! * [`wire`]: the single definition of the wire: framing, envelope, messages, bounds,
//!   strict decoding with stable error codes. The host, the harness and the conformance
//!   corpus all use it.
//! * [`python`]: the Python worker (stdlib only), shipped inside the binary and started
//!   by `contract-impl worker python`.
//! * [`framing`]: the frame in front of an input or a tool result as the model reads it
//!   ("Framing what the model reads"); stored content never holds one.
//! * [`host`]: the worker host: private directory and socket, token, handshake, cells,
//!   request routing, invalidation, hard stop.
//! * [`policy`]: the host's side of the decision slots (budget, operator rule, holds).
//! * [`slots`]: what a cell reads of the decision slots (`hooks.list`, `hooks.describe`).
//! * [`activation`]: the SQLite epoch and the active hook generation.
//! * [`lane`]: the operator lane reviewed sends land in, with their receipts.
//! * [`turns`]: the turn boundary: pending inputs and the waits the host accepted.
//! * [`instructions`]: the instruction header a transcript pinned, its revisions, and
//!   the chain `runtime.instructions` resolves.
//! * [`controlled`]: the host driven over a control channel (`contract-impl worker host`).
//! * [`source`]: the source identity of a hook snapshot.
//! * [`skills`]: the two skill roots, their index, `skills.index`/`skills.load`, and the
//!   set a workbench is given at spawn.
//! * The host spawns each worker under [`crate::process::supervise`] (`contract-impl
//!   worker supervise`), so that no process of it outlives the host.
//! * [`stores`]: the host's durable stores behind `maintenance.*`, `orientation.*` and
//!   `peer.*` (work items, orientation candidates and adoptions, the peer registry).
//! * [`workspace`]: the host's source work: `workspace.info`, `workspace.run` (a program
//!   in its own process group, bounded in time and output) and `evidence.resolve`.
//! * [`usage`]: the cache measurements read from a route's usage, and the cache options a
//!   route may carry ("What the request costs: cache reporting").
//!
//! This module owns the protocol's types and rules; it never decides what a host request
//! does (that is the host's).

pub mod activation;
pub mod bench;
pub mod controlled;
pub mod framing;
pub mod host;
pub mod instructions;
pub mod lane;
pub mod policy;
pub mod python;
pub mod skills;
pub mod slots;
pub mod source;
pub mod stores;
pub mod turns;
pub mod usage;
pub mod wire;
pub mod workspace;
