//! Scripted-peer conformance harness for the runtime-contract wire protocols.
//!
//! The pure half (scenario model and loader, placeholder bindings, matcher, goldens,
//! requirement coverage, reports) never touches sockets or processes; the transport,
//! target, family drivers and runner build on it.

pub mod audit;
pub mod baseline;
pub mod bind;
pub mod changes;
pub mod differential;
pub mod drive;
pub mod embedded;
pub mod family;
pub mod features;
pub mod golden;
pub mod matcher;
pub mod report;
pub mod requirements;
pub mod rpc;
pub mod runner;
pub mod scenario;
pub mod stability;
pub mod target;
pub mod transport;
