//! Process supervision shared by every host that runs programs it did not write: the
//! command Harness adapter, the harness's target launcher, and the worker and plugin
//! hosts.
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
//! * [`supervise`]: the **supervisor process** (`contract-impl worker supervise --
//!   PROGRAM…`) a host spawns around a program: a child subreaper holding a connection
//!   to its host, that kills the program's group and every descendant when the host is
//!   gone (SIGKILL included) or stops it; the worker, plugin and command-Harness hosts
//!   all use it.
//! * [`tail`]: a **bounded output tail** (last lines, bounded bytes, long lines cut), for
//!   the stderr a host keeps for error messages and logs.
//!
//! This module owns signalling, reaping, scratch roots, the watchdog, the supervisor and
//! tail bounds. Outside the supervisor's own process (which starts its one program), it
//! never spawns the programs it supervises (callers build their own commands with
//! `process_group(0)`), never interprets output and never decides policy (grace periods
//! and bounds are the caller's).

pub mod adopted;
pub mod group;
pub mod scratch;
pub mod supervise;
pub mod tail;
pub mod watchdog;

pub use group::ProcessGroup;
pub use tail::OutputTail;
