//! One driver per protocol family: which parties exist, which side is the target, how
//! the target is launched and reached, and how each scenario step maps onto transports.
//!
//! * [`control`]: the harness side of the controlled Harness adapter's control channel.
//! * [`core_runtime`]: the Core ↔ Runtime family driver (side `runtime`: the harness
//!   plays Core).
//! * [`core_target`]: side `core` of the same family (the harness plays the Runtime).
//!
//! Drivers own the mapping from steps to I/O; they never parse scenario files, never
//! render or compare goldens (they hand a [`crate::golden::Recording`] back) and never
//! print.

pub mod control;
pub mod core_runtime;
pub mod core_target;
