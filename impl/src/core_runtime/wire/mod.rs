//! The single definition of the Core ↔ Runtime wire ("Scope": wire types, limits and
//! validators are defined once; Core's gateway and the Runtime's dispatcher both use
//! this one definition).
//!
//! * [`frame`]: Envelope, [`MessageType`] table, strict [`Frame::decode`] / [`Frame::encode`],
//!   JSON Schema export.
//! * [`payloads`]: one typed payload per message type.
//! * [`capabilities`](mod@capabilities): `AgentKindCapabilities`.
//! * [`ids`]: identity newtypes. [`limits`]: every bound and timer as a named constant.
//!
//! This module performs no I/O and holds no state.

pub mod capabilities;
pub mod frame;
pub mod ids;
pub mod limits;
pub mod payloads;

pub use capabilities::{AgentKindCapabilities, AgentKindDeclaration};
pub use frame::{Direction, Envelope, Frame, Message, MessageType, Trace, json_schema};
pub use ids::*;
pub use limits::WIRE_VERSION;
pub use payloads::*;
