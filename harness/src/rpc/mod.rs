//! What the gRPC families (engine, plugin) share: when the harness is the client of the
//! target's service, the call frames and their checks ([`frames`]) and the link that
//! turns them into calls ([`client`]); when it is the server, its answers ([`answer`]).
//!
//! This module names no family: each family gives it its service ([`frames::RpcService`])
//! and its credential. It never renders goldens and never prints.

pub mod answer;
pub mod client;
pub mod frames;
