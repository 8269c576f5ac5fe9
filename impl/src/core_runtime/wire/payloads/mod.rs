//! Typed payloads of every message in the spec's "Message families" table, one file per
//! message group.
//!
//! Each struct is the `payload` of one Envelope `type`; the Envelope `id` it travels
//! with is documented on the struct (its meaning depends on the type, see
//! "Envelope and identity"). All structs deny unknown fields; optional fields are
//! absent rather than `null`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::capabilities::AgentKindDeclaration;
use super::ids::*;
use super::limits::*;
use crate::wire::bounded::{Base64Bytes, BoundedString, BoundedVec};

/// Workspace-relative path (`/`-separated, no `..`, no leading `/`; validated by the Runtime).
pub type WirePath = BoundedString<PATH_MAX_BYTES>;
/// Bounded text field.
pub type Text = BoundedString<TEXT_MAX_BYTES>;
/// Lower-case hex SHA-256 digest (64 characters; validated by the receiver).
pub type Sha256Hex = BoundedString<64>;

mod active_input;
mod admission;
mod events;
mod function_calls;
mod interactions;
mod liveness;
mod prepare;
mod suspension;
mod workspace_ops;

pub use active_input::*;
pub use admission::*;
pub use events::*;
pub use function_calls::*;
pub use interactions::*;
pub use liveness::*;
pub use prepare::*;
pub use suspension::*;
pub use workspace_ops::*;
