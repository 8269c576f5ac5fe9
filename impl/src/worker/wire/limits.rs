//! Every bound of the worker protocol, one named constant each, with the section of
//! `worker-protocol.md` ("Runtime control protocol v1") it comes from.

/// The only protocol version ("Transport and bounds": `{"version":1, …}`).
pub const PROTOCOL_VERSION: u64 = 1;

/// Bytes of the big-endian length prefix of every frame ("Transport and bounds": "four
/// unsigned big-endian bytes giving the UTF-8 JSON payload length").
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Smallest payload length ("Transport and bounds": "Length must be 1..1,048,576").
pub const FRAME_MIN_BYTES: usize = 1;

/// Largest payload length, in bytes ("Transport and bounds").
pub const FRAME_MAX_BYTES: usize = 1_048_576;

/// Longest identifier, in bytes ("Transport and bounds": "Identifiers are 1..128 ASCII
/// letters/digits/underscore/dot/hyphen").
pub const IDENTIFIER_MAX_BYTES: usize = 128;

/// Largest cell source, in bytes ("Transport and bounds": "cell source <=262,144 bytes").
pub const CELL_SOURCE_MAX_BYTES: usize = 262_144;

/// Largest returned text of one cell across its output records, in bytes ("Transport and
/// bounds": "returned text <=65,536 bytes across <=256 records").
pub const RETURNED_TEXT_MAX_BYTES: usize = 65_536;

/// Most output records of one cell ("Transport and bounds").
pub const OUTPUT_RECORDS_MAX: usize = 256;

/// Largest error text, in bytes ("Transport and bounds": "error text <=65,536 bytes").
pub const ERROR_TEXT_MAX_BYTES: usize = 65_536;

/// Bytes kept of each of a worker's raw stdout and stderr ("Transport and bounds":
/// "continuously drained ... into separate bounded 8 KiB diagnostic tails").
pub const DIAGNOSTIC_TAIL_BYTES: usize = 8 * 1024;

/// Most host requests of one foreground cell ("Message vocabulary": "a maximum of 128
/// requests per foreground cell").
pub const REQUESTS_PER_CELL_MAX: usize = 128;

/// Longest `runtime.wait`, in seconds ("Scope, waiting and receipts": "Wait seconds are
/// null or finite >0 and <=600").
pub const WAIT_SECONDS_MAX: f64 = 600.0;

/// The hook invocation budget, queueing included, in milliseconds ("Implemented
/// decision slots": "The host's two-second invocation budget includes queueing").
pub const HOOK_BUDGET_MS: u64 = 2_000;

/// Most files of a source snapshot ("Source revisions and activation": "maximum 128
/// files/2 MiB").
pub const SOURCE_FILES_MAX: usize = 128;

/// Largest source snapshot, in bytes ("Source revisions and activation").
pub const SOURCE_BYTES_MAX: u64 = 2 * 1024 * 1024;

/// Longest Unix socket path the host may bind, in bytes: `sun_path` holds 108 bytes
/// with the terminating NUL ("Transport and bounds": one dedicated Unix-domain socket).
pub const SOCKET_PATH_MAX_BYTES: usize = 107;
