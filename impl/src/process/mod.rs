//! Process supervision shared by every host that runs programs it did not write: the
//! command Harness adapter, the harness's target launcher, and the worker and plugin
//! hosts to come.
//!
//! * [`group`]: a child's **process group** as the unit of signalling and reaping:
//!   SIGTERM, grace, SIGKILL of the whole group, and confirmation that no member is
//!   left (zombies count); the child-subreaper flag that lets a host reap re-parented
//!   descendants.
//! * [`adopted`]: **re-parented descendants** nobody waits for (after a supervisor was
//!   killed outright), found in `/proc`, killed and reaped.
//! * [`scratch`]: **private scratch directories** under a per-process root locked for
//!   the process's life, so that a root left by a killed process is recognised and
//!   swept.
//! * [`watchdog`]: a **death watchdog** that kills the groups a process started when
//!   that process dies outright (SIGKILL), without unsafe code.
//! * [`tail`]: a **bounded output tail** (last lines, bounded bytes, long lines cut), for
//!   the stderr a host keeps for error messages and logs.
//!
//! This module owns signalling, reaping, scratch roots, the watchdog and tail bounds. It
//! never spawns the programs it supervises (callers build their own commands with
//! `process_group(0)`), never interprets output and never decides policy (grace periods
//! and bounds are the caller's).

pub mod adopted;
pub mod group;
pub mod scratch;
pub mod tail;
pub mod watchdog;

pub use group::ProcessGroup;
pub use tail::OutputTail;
