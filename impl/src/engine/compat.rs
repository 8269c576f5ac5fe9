//! Version and capability negotiation ("Initialization", "Compatibility").
//!
//! "The implementation advertises protocol range 1.0 through 1.1. Snapshot transfer is
//! atomic with authenticated authority: minor-0 negotiation removes both snapshots and
//! snapshot-authority-v1. A client requiring either receives a typed missing-capability
//! result. [...] Incompatible major versions or required capabilities fail before a run
//! is created, with both observed and required values." "Supported client/server ranges
//! are machine-readable in compatibility manifests" (`proto/compatibility.json`, which
//! the constants below must match; a test checks it).
//!
//! This module is pure: it decides, it never touches a connection or a store.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::proto::common::v1::ProtocolVersion;

/// The protocol's major version.
pub const PROTOCOL_MAJOR: u32 = 1;

/// The lowest minor version supported ("protocol range 1.0 through 1.1").
pub const MINOR_MIN: u32 = 0;

/// The highest minor version supported.
pub const MINOR_MAX: u32 = 1;

/// Capability: snapshot export and import.
pub const CAP_SNAPSHOTS: &str = "snapshots";

/// Capability: snapshot authority by keyed HMAC ("A minor-1 client must require
/// snapshot-authority-v1 before relying on export or import").
pub const CAP_SNAPSHOT_AUTHORITY_V1: &str = "snapshot-authority-v1";

/// The capabilities offered at `minor` ("minor-0 negotiation removes both snapshots and
/// snapshot-authority-v1").
pub fn capabilities(minor: u32) -> &'static [&'static str] {
    if minor >= 1 {
        &[CAP_SNAPSHOTS, CAP_SNAPSHOT_AUTHORITY_V1]
    } else {
        &[]
    }
}

/// The snapshot format import accepts ("accepts only suspended v1alpha2 snapshots").
pub const SNAPSHOT_FORMAT: &str = "v1alpha2";

/// The committed compatibility manifest.
pub const MANIFEST: &str = include_str!("../../proto/compatibility.json");

/// Why negotiation failed, with the observed and required values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The client's major is not ours.
    IncompatibleVersion {
        /// What the client presented.
        observed: (u32, u32),
    },
    /// Required capabilities are not offered at the negotiated version.
    MissingCapability {
        /// The required capabilities not offered, sorted.
        missing: Vec<String>,
        /// What is offered.
        offered: Vec<String>,
        /// The negotiated version.
        negotiated: (u32, u32),
    },
}

/// A successful negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// `(major, minor)`: the client's major, the lower of the two minors.
    pub version: (u32, u32),
    /// The capabilities offered at that version.
    pub capabilities: Vec<String>,
}

/// Negotiates with a client presenting `version` and requiring `required`.
///
/// # Errors
/// [`Refusal`]: an incompatible major (or no version), or a required capability not
/// offered at the negotiated minor.
pub fn negotiate(
    version: Option<&ProtocolVersion>,
    required: &[String],
) -> Result<Negotiated, Refusal> {
    let Some(version) = version.filter(|v| v.major == PROTOCOL_MAJOR) else {
        return Err(Refusal::IncompatibleVersion {
            observed: version.map_or((0, 0), |v| (v.major, v.minor)),
        });
    };
    let minor = version.minor.min(MINOR_MAX);
    let offered: Vec<String> = capabilities(minor)
        .iter()
        .map(|c| (*c).to_string())
        .collect();
    let mut missing: Vec<String> = required
        .iter()
        .filter(|r| !offered.contains(r))
        .cloned()
        .collect();
    missing.sort();
    missing.dedup();
    if missing.is_empty() {
        Ok(Negotiated {
            version: (PROTOCOL_MAJOR, minor),
            capabilities: offered,
        })
    } else {
        Err(Refusal::MissingCapability {
            missing,
            offered,
            negotiated: (PROTOCOL_MAJOR, minor),
        })
    }
}

/// The manifest's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The protocol's name.
    pub protocol: String,
    /// The protobuf packages.
    pub packages: Vec<String>,
    /// The server's supported range.
    pub server: Range,
    /// The client's supported range.
    pub client: Range,
    /// Capabilities per minor version.
    pub capabilities_by_minor: BTreeMap<String, Vec<String>>,
    /// Snapshot formats import accepts.
    pub snapshot_formats: Vec<String>,
    /// MAC domain per authority capability.
    pub mac_domains: BTreeMap<String, String>,
}

/// A version range.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    /// The lowest version.
    pub protocol_min: Version,
    /// The highest version.
    pub protocol_max: Version,
}

/// A version in the manifest.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

/// The committed manifest, parsed.
///
/// # Errors
/// The manifest does not parse (a test keeps it parsing).
pub fn manifest() -> Result<Manifest, serde_json::Error> {
    serde_json::from_str(MANIFEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> ProtocolVersion {
        ProtocolVersion { major, minor }
    }

    #[test]
    fn the_manifest_says_what_the_code_does() {
        let m = manifest().unwrap();
        for range in [&m.server, &m.client] {
            assert_eq!(
                range.protocol_min,
                Version {
                    major: PROTOCOL_MAJOR,
                    minor: MINOR_MIN
                }
            );
            assert_eq!(
                range.protocol_max,
                Version {
                    major: PROTOCOL_MAJOR,
                    minor: MINOR_MAX
                }
            );
        }
        for minor in MINOR_MIN..=MINOR_MAX {
            assert_eq!(
                m.capabilities_by_minor[&minor.to_string()],
                capabilities(minor)
                    .iter()
                    .map(|c| (*c).to_string())
                    .collect::<Vec<_>>()
            );
        }
        assert_eq!(m.snapshot_formats, [SNAPSHOT_FORMAT]);
        assert!(m.mac_domains.contains_key(CAP_SNAPSHOT_AUTHORITY_V1));
        assert_eq!(m.packages, ["common.v1", "engine.v1"]);
    }

    #[test]
    fn minor_zero_removes_both_snapshot_capabilities() {
        let at0 = negotiate(Some(&v(1, 0)), &[]).unwrap();
        assert_eq!((at0.version, at0.capabilities.len()), ((1, 0), 0));
        let at1 = negotiate(Some(&v(1, 1)), &[]).unwrap();
        assert_eq!(at1.capabilities, [CAP_SNAPSHOTS, CAP_SNAPSHOT_AUTHORITY_V1]);
        // A newer minor negotiates down to ours.
        assert_eq!(negotiate(Some(&v(1, 7)), &[]).unwrap().version, (1, 1));
        for cap in [CAP_SNAPSHOTS, CAP_SNAPSHOT_AUTHORITY_V1] {
            assert_eq!(
                negotiate(Some(&v(1, 0)), &[cap.to_string()]).unwrap_err(),
                Refusal::MissingCapability {
                    missing: vec![cap.to_string()],
                    offered: vec![],
                    negotiated: (1, 0)
                }
            );
            assert!(negotiate(Some(&v(1, 1)), &[cap.to_string()]).is_ok());
        }
    }

    #[test]
    fn another_major_or_no_version_is_incompatible_with_what_was_observed() {
        assert_eq!(
            negotiate(Some(&v(2, 0)), &[]).unwrap_err(),
            Refusal::IncompatibleVersion { observed: (2, 0) }
        );
        assert_eq!(
            negotiate(Some(&v(0, 9)), &[]).unwrap_err(),
            Refusal::IncompatibleVersion { observed: (0, 9) }
        );
        assert_eq!(
            negotiate(None, &[]).unwrap_err(),
            Refusal::IncompatibleVersion { observed: (0, 0) }
        );
        let unknown = negotiate(
            Some(&v(1, 1)),
            &["time-travel".into(), "time-travel".into()],
        );
        assert_eq!(
            unknown.unwrap_err(),
            Refusal::MissingCapability {
                missing: vec!["time-travel".into()],
                offered: vec![CAP_SNAPSHOTS.into(), CAP_SNAPSHOT_AUTHORITY_V1.into()],
                negotiated: (1, 1)
            }
        );
    }
}
