//! The daemon's wire profile: the choices engine-protocol.md leaves free, made our
//! reference way or (`engine serve --profile different`) another correct way, so the
//! conformance suite proves it accepts a daemon that chooses otherwise (vendor mode).
//!
//! The `different` profile starts every run's sequence at 1000 and its interaction
//! revisions at 500, numbers an imported run's events 5000 past the exported log, answers refusals with
//! other status codes and another message shape, names its sentinels differently, and
//! words its identifiers differently; every
//! rule the spec states is kept. This module decides wording only; it never changes a
//! rule.

use tonic::{Code, Status};

/// Which way the free choices are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Profile {
    /// Ours (the goldens' choices).
    #[default]
    Reference,
    /// Another correct implementation's.
    Different,
}

impl Profile {
    /// A refusal as this profile words it.
    pub fn refusal(self, status: Status) -> Status {
        if self == Profile::Reference {
            return status;
        }
        let code = match status.code() {
            Code::Unauthenticated => Code::PermissionDenied,
            Code::NotFound => Code::FailedPrecondition,
            Code::FailedPrecondition => Code::Aborted,
            Code::OutOfRange => Code::InvalidArgument,
            Code::InvalidArgument => Code::FailedPrecondition,
            Code::PermissionDenied => Code::InvalidArgument,
            Code::AlreadyExists => Code::Aborted,
            other => other,
        };
        let (kind, detail) = status
            .message()
            .split_once(": ")
            .unwrap_or(("refused", status.message()));
        let mut out = Status::new(code, format!("[{kind}] {detail}"));
        *out.metadata_mut() = status.metadata().clone();
        out
    }

    /// The sentinel of a contained executor failure.
    pub fn sentinel_panic(self) -> &'static str {
        match self {
            Profile::Reference => super::executor::SENTINEL_EXECUTOR_PANIC,
            Profile::Different => "vendor/executor-failed",
        }
    }

    /// The sentinel of a run that was executing when the daemon stopped.
    pub fn sentinel_restarted(self) -> &'static str {
        match self {
            Profile::Reference => super::executor::SENTINEL_DAEMON_RESTARTED,
            Profile::Different => "vendor/host-restarted",
        }
    }

    /// The sentinel of a tool whose acknowledgement was lost.
    pub fn sentinel_ack_lost(self) -> &'static str {
        match self {
            Profile::Reference => super::executor::SENTINEL_ACK_LOST,
            Profile::Different => "vendor/ack-lost",
        }
    }

    /// The sequence of a run's first event: the spec fixes none ("returns the stable run
    /// ID, initial sequence, and immutable plan_id"), ours is 1.
    pub fn sequence_origin(self) -> u64 {
        match self {
            Profile::Reference => 1,
            Profile::Different => 1000,
        }
    }

    /// The sequence after which an imported run's log goes on, for a snapshot whose
    /// exported log ended at `last`: the spec preserves the imported run's ID, not its
    /// sequences; ours goes on from the exported log (`last`), the different profile
    /// numbers it from elsewhere (`last` + 5000).
    pub fn imported_base(self, last: u64) -> u64 {
        match self {
            Profile::Reference => last,
            Profile::Different => last.saturating_add(5000),
        }
    }

    /// The interaction revision of a run's first snapshot (before any prompt opened): the
    /// proto fixes only that each delta is the previous frame's revision plus one; ours
    /// is 0.
    pub fn interaction_revision_origin(self) -> u64 {
        match self {
            Profile::Reference => 0,
            Profile::Different => 500,
        }
    }

    /// A fresh run ID.
    pub fn run_id(self) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        match self {
            Profile::Reference => format!("run-{id}"),
            Profile::Different => format!("R{}", &id[..20]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_different_profile_rewords_refusals_and_keeps_their_trailers() {
        let mut s = Status::not_found("unknown_run: no run x");
        s.metadata_mut()
            .insert("engine-last-delivered-sequence", "7".parse().unwrap());
        let r = Profile::Different.refusal(s.clone());
        assert_eq!(r.code(), Code::FailedPrecondition);
        assert_eq!(r.message(), "[unknown_run] no run x");
        assert_eq!(
            r.metadata().get("engine-last-delivered-sequence").unwrap(),
            "7"
        );
        assert_eq!(Profile::Reference.refusal(s).code(), Code::NotFound);
        assert_eq!(
            Profile::Different
                .refusal(Status::deadline_exceeded("x"))
                .code(),
            Code::DeadlineExceeded
        );
    }
}
