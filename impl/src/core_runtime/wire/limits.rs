//! Every bound and timer the Core ↔ Runtime spec names, as one named constant each.
//!
//! Timers are defaults: the Runtime's and Core's launch configuration may override
//! them (scenarios do, so no test waits in real time). Bounds marked "private
//! transport limit" are the spec's own words for limits that are not public API.

use std::time::Duration;

/// The wire version (`proto.Version`), independent of any build version.
/// "Ownership and connection": Core accepts only an exact match, patch included.
pub const WIRE_VERSION: &str = "1.0.0";

/// Admission expiry: "An admission expires five minutes after it was granted"
/// ("Preparation and execution order").
pub const ADMISSION_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// "The Runtime keeps at most 64 admission records" ("Preparation and execution order").
pub const ADMISSION_RECORDS_MAX: usize = 64;

/// Native write bound for active input: "the Runtime bounds the adapter's native
/// write to 10 seconds" ("Active-input receipts").
pub const NATIVE_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Core's wait for `written`: "at most 30 seconds from delivery start"
/// ("Active-input receipts").
pub const WRITTEN_RECEIPT_TIMEOUT: Duration = Duration::from_secs(30);

/// "each receipt send has its own 5-second budget" ("Active-input receipts").
pub const RECEIPT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// "with no cancel confirmation within 15 seconds Core records `cancel_unconfirmed`"
/// ("Active-input receipts").
pub const CANCEL_CONFIRM_TIMEOUT: Duration = Duration::from_secs(15);

/// "request payloads are bounded to 8 KiB" before admission ("Workspace operations"):
/// the compact JSON encoding of a `workspace_read` / `workspace_export` `payload`. The
/// Envelope's `id` has its own bound ([`CORRELATION_ID_MAX_BYTES`]) and its `trace`
/// does not count ("oversized trace metadata does not enter the reply"); the raw frame
/// is bounded by [`TRANSPORT_FRAME_MAX_BYTES`].
pub const WORKSPACE_REQUEST_MAX_BYTES: usize = 8 * 1024;

/// "correlation IDs to 128 bytes; an oversized ID is not echoed" ("Workspace operations").
pub const CORRELATION_ID_MAX_BYTES: usize = 128;

/// "A raw read result is bounded to 1 MiB" ("Workspace operations").
pub const WORKSPACE_READ_RESULT_MAX_BYTES: usize = 1024 * 1024;

/// "inside a 4 MiB transport frame" ("Workspace operations"). This is also the
/// largest WebSocket message either side accepts.
pub const TRANSPORT_FRAME_MAX_BYTES: usize = 4 * 1024 * 1024;

/// "at most 1024 single-path-component UTF-8 names" ("Workspace operations").
pub const DIRECTORY_ENTRIES_MAX: usize = 1024;

/// "each at most 255 bytes" ("Workspace operations").
pub const DIRECTORY_ENTRY_NAME_MAX_BYTES: usize = 255;

/// "acknowledged 64 KiB frames" of `workspace_write` ("Workspace operations");
/// also the chunk bound of `runtime_prepare` transfers.
pub const WRITE_CHUNK_MAX_BYTES: usize = 64 * 1024;

/// "The private transfer limit is 50 MiB" ("Workspace operations"); also the bound of
/// one `runtime_prepare` file or archive transfer.
pub const WRITE_TRANSFER_MAX_BYTES: u64 = 50 * 1024 * 1024;

/// "the 5 MiB decoded inline limit the public API checks before any Runtime work"
/// ("Workspace operations").
pub const PUBLIC_INLINE_WRITE_MAX_BYTES: u64 = 5 * 1024 * 1024;

/// Bound on workspace-relative paths carried on the wire (bytes). Chosen as Linux
/// `PATH_MAX`; the spec leaves path length to the Environment Files contract.
pub const PATH_MAX_BYTES: usize = 4096;

/// Bound on agent kinds one heartbeat may declare.
pub const AGENT_KINDS_MAX: usize = 32;

/// Bound on messages in one ordered `MessageInput` list.
pub const INPUT_MESSAGES_MAX: usize = 64;

/// Bound on content parts in one message.
pub const CONTENT_PARTS_MAX: usize = 64;

/// Bound on text carried by one frame field (bytes); frames are further bounded by
/// [`TRANSPORT_FRAME_MAX_BYTES`].
pub const TEXT_MAX_BYTES: usize = 1024 * 1024;

/// Bound on decoded image bytes in one content part.
pub const IMAGE_MAX_BYTES: usize = 2 * 1024 * 1024;

/// Bound on questions in one `prompt_for_user_choice`.
pub const QUESTIONS_MAX: usize = 16;

/// Bound on options per question and answers per question.
pub const CHOICES_MAX: usize = 32;

/// Bound on MCP servers in one execution configuration.
pub const MCP_SERVERS_MAX: usize = 16;

/// W3C `traceparent` is 55 characters; longer trace metadata never enters a reply.
pub const TRACEPARENT_MAX_BYTES: usize = 55;

/// W3C `tracestate` bound (512 characters).
pub const TRACESTATE_MAX_BYTES: usize = 512;
