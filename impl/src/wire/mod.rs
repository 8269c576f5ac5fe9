//! Wire primitives shared by every protocol family.
//!
//! This module owns the *strict JSON* discipline the specs demand and the small,
//! validated building blocks that every family's wire module is made of:
//!
//! * [`strict`]: decoding that rejects duplicate keys (at every nesting level),
//!   `null` values, unknown and missing fields, and encoding that refuses
//!   non-finite numbers instead of writing them as `null`.
//! * [`ids`]: identifier newtypes validated once at the edge.
//! * [`bounded`]: collections and byte strings whose bound is part of the type.
//! * [`framing`]: the 4-byte big-endian length framing of the framed families.
//! * [`bearer`]: the credential of a `Bearer` authorization value.
//!
//! It must never perform I/O, and it must never silently coerce bad input: every
//! rejection is a [`WireError`] with a stable [`WireError::code`].

pub mod bearer;
pub mod bounded;
pub mod framing;
pub mod ids;
pub mod strict;

pub use strict::{WireError, decode_strict, encode_strict, parse_strict, parse_strict_with_nulls};
