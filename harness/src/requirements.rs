//! Requirement catalogs (`scenarios/requirements/<family>.yaml`) and scenario coverage.
//!
//! This module owns the catalog format and the coverage computation: which requirement
//! is covered by which scenarios, which is uncovered (with the catalog's reason, or as an
//! error when there is none), and which IDs scenarios cite that the catalog does not
//! define (an error). It never runs scenarios or touches sockets.
//!
//! Catalog format (strict YAML, like scenarios):
//!
//! ```yaml
//! family: core_runtime
//! requirements:
//!   - id: CR-CONN-001
//!     section: "Ownership and connection"
//!     level: required               # the spec says it: quote the sentence
//!     statement: "The Runtime opens exactly one WebSocket per device."
//!     quote: "…"                    # the original's words, verbatim
//!   - id: CR-CONN-009
//!     section: "Ownership and connection"
//!     level: reference              # our implementation's choice, or our reading of
//!     statement: "..."              # a silent or ambiguous point
//!     reading: "our reading: …"     # which, and why (a `quote` of the ambiguous
//!                                   # sentence may be added)
//!     uncovered: "needs two physical devices"   # only for what no scenario can cover
//!   - id: CR-WS-008
//!     …
//!     bounds:                       # every number the statement sets, by name
//!       - { name: entries, value: 1024, unit: entries }
//!       - { name: name_bytes, value: 255, unit: bytes }
//! ```
//!
//! A bound is tested at its edge when one scenario sits exactly at it and succeeds and
//! one sits one past it and gets the spec's outcome; a scenario says which edges it
//! exercises (`edges: {CR-WS-008/entries: [at, past]}`) and `coverage` lists every
//! bound that lacks one.
//!
//! A vendor's failure of a `reference` requirement is a difference from our reference
//! implementation, never non-conformance; `coverage` reports the two levels apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::scenario::Scenario;
use crate::scenario::loader::{LoadError, parse_yaml};
use crate::scenario::validation::is_requirement_id;

/// Whether the spec requires a rule or it is our reference implementation's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// The spec says it (the entry quotes it): every implementation must do it.
    Required,
    /// Our implementation's choice, or our written reading of a silent or ambiguous
    /// point: another implementation may differ.
    Reference,
}

impl Level {
    /// `required` or `reference`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Required => "required",
            Level::Reference => "reference",
        }
    }
}

/// One requirement of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Stable ID (`CR-CONN-001`).
    pub id: String,
    /// Spec section the requirement comes from.
    pub section: String,
    /// Required by the spec, or our reference choice.
    pub level: Level,
    /// The requirement, in the spec's words.
    pub statement: String,
    /// The original's sentence(s) (always for [`Level::Required`]).
    pub quote: Option<String>,
    /// Why it is a reference choice and what we read (only [`Level::Reference`]).
    pub reading: Option<String>,
    /// Why no scenario can cover it (only for such requirements).
    pub uncovered_reason: Option<String>,
    /// The numeric bounds the statement sets (`bounds:`), each to be tested at its edge.
    pub bounds: Vec<Bound>,
}

/// One numeric bound a requirement sets.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    /// Name, unique within the requirement (`entries`, `name_bytes`); a scenario's edge
    /// key is `<requirement ID>/<name>`.
    pub name: String,
    /// The limit, in `unit`s.
    pub value: u64,
    /// `bytes`, `entries`, `count`, `ms`, `seconds`, `status` or `integer`.
    pub unit: BoundUnit,
}

/// Unit of a [`Bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundUnit {
    /// Bytes (of a frame, a payload, a name, an ID).
    Bytes,
    /// Entries of a list or records kept.
    Entries,
    /// A count of events or items.
    Count,
    /// Milliseconds (a timer, shortened through configuration in scenarios).
    Ms,
    /// Seconds (a duration a message asks for, such as a wait).
    Seconds,
    /// An HTTP status number.
    Status,
    /// The value of an integer field (the largest an unsigned field accepts).
    Integer,
}

impl BoundUnit {
    /// The unit's name.
    pub fn as_str(self) -> &'static str {
        match self {
            BoundUnit::Bytes => "bytes",
            BoundUnit::Entries => "entries",
            BoundUnit::Count => "count",
            BoundUnit::Ms => "ms",
            BoundUnit::Seconds => "seconds",
            BoundUnit::Status => "status",
            BoundUnit::Integer => "integer",
        }
    }
}

/// Which side of a bound a scenario exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Edge {
    /// Exactly at the bound, and it succeeds.
    At,
    /// One past the bound, and it gets the spec's outcome.
    Past,
}

impl Edge {
    /// `at` or `past`.
    pub fn as_str(self) -> &'static str {
        match self {
            Edge::At => "at",
            Edge::Past => "past",
        }
    }
}

/// A bound of the catalog missing an edge no scenario exercises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundGap {
    /// `<requirement ID>/<bound name>`.
    pub key: String,
    /// The bound.
    pub bound: Bound,
    /// Edges no running scenario exercises.
    pub missing: Vec<Edge>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    family: Spanned<String>,
    requirements: Vec<Spanned<RawRequirement>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequirement {
    id: String,
    section: String,
    level: Option<Level>,
    statement: String,
    #[serde(default)]
    quote: Option<String>,
    #[serde(default)]
    reading: Option<String>,
    #[serde(default)]
    uncovered: Option<String>,
    #[serde(default)]
    bounds: Vec<Bound>,
}

/// Loads a catalog strictly. The `family` must equal the file stem; IDs must be
/// well-formed and distinct; sections and statements non-empty.
///
/// # Errors
/// A located [`LoadError`] (the first problem found).
pub fn load_catalog(path: &Path) -> Result<Vec<Requirement>, LoadError> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| LoadError::new(path, format!("cannot read: {e}")))?;
    let raw: RawCatalog = parse_yaml(path, &source)?;
    let at = |loc, msg: String| LoadError::at(path, Some(loc), msg, Some(&source));
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if raw.family.value != stem {
        return Err(at(
            raw.family.referenced,
            format!(
                "family `{}` does not match the file name `{stem}`",
                raw.family.value
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for item in raw.requirements {
        let loc = item.referenced;
        let r = item.value;
        if !is_requirement_id(&r.id) {
            return Err(at(
                loc,
                format!(
                    "malformed requirement ID `{}` (expected e.g. `CR-CONN-001`)",
                    r.id
                ),
            ));
        }
        if !seen.insert(r.id.clone()) {
            return Err(at(loc, format!("requirement ID `{}` defined twice", r.id)));
        }
        if r.section.trim().is_empty() || r.statement.trim().is_empty() {
            return Err(at(
                loc,
                format!("requirement `{}` needs a section and a statement", r.id),
            ));
        }
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|t| t.trim().is_empty());
        let level = match (r.level, blank(&r.quote), blank(&r.reading)) {
            (None, ..) => {
                return Err(at(
                    loc,
                    format!(
                        "requirement `{}` needs `level: required` (with the spec's `quote`) or \
                         `level: reference` (with a `reading`)",
                        r.id
                    ),
                ));
            }
            (Some(Level::Required), true, _) => {
                return Err(at(
                    loc,
                    format!(
                        "requirement `{}` is required: quote the spec (`quote:`)",
                        r.id
                    ),
                ));
            }
            (Some(Level::Required), false, false) => {
                return Err(at(
                    loc,
                    format!(
                        "requirement `{}` is required: a `reading` belongs to reference entries",
                        r.id
                    ),
                ));
            }
            (Some(Level::Reference), _, true) => {
                return Err(at(
                    loc,
                    format!(
                        "requirement `{}` is a reference choice: say which and why (`reading:`)",
                        r.id
                    ),
                ));
            }
            (Some(level), ..) => level,
        };
        let mut names = BTreeSet::new();
        for b in &r.bounds {
            let well_formed = !b.name.is_empty()
                && b.name
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
            if !well_formed || !names.insert(b.name.clone()) {
                return Err(at(
                    loc,
                    format!(
                        "requirement `{}`: bound names are distinct lower_snake_case words (`{}`)",
                        r.id, b.name
                    ),
                ));
            }
        }
        if r.uncovered.as_deref().is_some_and(|u| u.trim().is_empty()) {
            return Err(at(
                loc,
                format!("requirement `{}`: `uncovered` must give a reason", r.id),
            ));
        }
        out.push(Requirement {
            id: r.id,
            section: r.section,
            level,
            statement: r.statement,
            quote: r.quote,
            reading: r.reading,
            uncovered_reason: r.uncovered,
            bounds: r.bounds,
        });
    }
    Ok(out)
}

/// A requirement no scenario covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    /// The requirement ID.
    pub id: String,
    /// Its section.
    pub section: String,
    /// Its level.
    pub level: Level,
    /// The catalog's reason; `None` is an error (a gap nobody explained).
    pub reason: Option<String>,
}

/// Requirement coverage of a family's scenarios.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Covered requirement ID → scenario IDs (`family/name`) citing it, in catalog order.
    pub covered: Vec<(String, Vec<String>)>,
    /// Requirements nobody covers, in catalog order.
    pub uncovered: Vec<Uncovered>,
    /// IDs cited by scenarios but absent from the catalog → the citing scenario IDs.
    pub unknown: BTreeMap<String, Vec<String>>,
    /// Requirements marked `uncovered` that scenarios do cover (the mark is stale).
    pub stale_reasons: Vec<String>,
    /// `reference:` steps naming a requirement that is unknown or `required`, as
    /// `(scenario ID, requirement ID)`: a rule the spec requires is never a mere
    /// difference from the reference.
    pub misused_references: Vec<(String, String)>,
    /// `reference:` steps and `{$reference: …}` patterns naming a requirement the
    /// scenario does not list in `covers:`, as `(scenario ID, requirement ID)`: what a
    /// scenario asserts, it covers.
    pub uncited_references: Vec<(String, String)>,
    /// Per side under test (`runtime`, `core`, …): the requirements covered by a
    /// scenario that runs there (not pending there).
    pub by_side: BTreeMap<String, BTreeSet<String>>,
    /// A `level: reference` requirement a scenario lists in `covers:` without any step
    /// marked with it (a `reference:` group or a `$reference` pattern), as
    /// `(scenario ID, requirement ID)`: our choice asserted by a plain step would fail a
    /// conformant target in vendor mode.
    pub unmarked_references: Vec<(String, String)>,
    /// Bounds that no running scenario exercises at both edges, in catalog order (an
    /// error: every bound is tested at the bound and one past it).
    pub bound_gaps: Vec<BoundGap>,
    /// Edge keys scenarios name that no catalog bound defines, as `(scenario ID, key)`.
    pub unknown_edges: Vec<(String, String)>,
    /// Number of bounds in the catalog (of requirements no `uncovered:` reason exempts).
    pub bounds_total: usize,
    /// Bounds of requirements an `uncovered:` reason exempts (`<requirement ID>/<name>`):
    /// not counted in [`Coverage::bounds_total`], listed so the count never hides them.
    pub bounds_exempt: Vec<String>,
    /// Number of requirements in the catalog.
    pub total: usize,
    /// Level of every catalog requirement, by ID.
    pub levels: BTreeMap<String, Level>,
}

impl Coverage {
    /// Problems that must fail the check: unexplained gaps, unknown IDs, stale marks.
    pub fn errors(&self) -> Vec<String> {
        let mut out = Vec::new();
        for u in &self.uncovered {
            if u.reason.is_none() {
                out.push(format!(
                    "requirement {} ({}) has no scenario and no `uncovered` reason",
                    u.id, u.section
                ));
            }
        }
        for (id, scenarios) in &self.unknown {
            out.push(format!(
                "unknown requirement ID {id} cited by {}",
                scenarios.join(", ")
            ));
        }
        for (scenario, id) in &self.misused_references {
            out.push(format!(
                "scenario {scenario} names {id} in a `reference:` step or a `$reference` \
                 pattern, and it is not a `level: reference` requirement of the catalog"
            ));
        }
        for (scenario, id) in &self.unmarked_references {
            out.push(format!(
                "scenario {scenario} covers the reference requirement {id} but marks no step \
                 with it: put the steps that assert it in a `reference:` group (or its values \
                 in `$reference` patterns)"
            ));
        }
        for (scenario, id) in &self.uncited_references {
            out.push(format!(
                "scenario {scenario} asserts our reference behaviour {id} (a `reference:` step \
                 or a `$reference` pattern) but does not list it in `covers:`"
            ));
        }
        for id in &self.stale_reasons {
            out.push(format!(
                "requirement {id} is marked `uncovered` but scenarios cover it; drop the mark"
            ));
        }
        for gap in &self.bound_gaps {
            let missing: Vec<&str> = gap.missing.iter().map(|e| e.as_str()).collect();
            out.push(format!(
                "bound {} ({} {}) has no scenario exercising {} (`edges:`)",
                gap.key,
                gap.bound.value,
                gap.bound.unit.as_str(),
                missing.join(" and ")
            ));
        }
        for (scenario, key) in &self.unknown_edges {
            out.push(format!(
                "scenario {scenario} names the edge key {key}, which no catalog bound defines \
                 (`<requirement ID>/<bound name>`)"
            ));
        }
        out
    }

    /// Whether [`Self::errors`] is empty.
    pub fn is_ok(&self) -> bool {
        self.errors().is_empty()
    }

    /// `(covered, total)` of the requirements of `level`.
    pub fn count(&self, level: Level) -> (usize, usize) {
        let total = self.levels.values().filter(|l| **l == level).count();
        let covered = self
            .covered
            .iter()
            .filter(|(id, _)| self.levels.get(id) == Some(&level))
            .count();
        (covered, total)
    }

    /// `(covered, total)` of the requirements of `level` on `side`.
    pub fn count_on(&self, side: &str, level: Level) -> (usize, usize) {
        let total = self.levels.values().filter(|l| **l == level).count();
        let covered = self.by_side.get(side).map_or(0, |ids| {
            ids.iter()
                .filter(|id| self.levels.get(*id) == Some(&level))
                .count()
        });
        (covered, total)
    }

    /// Percentage of catalog requirements covered by at least one scenario.
    pub fn percent(&self) -> f64 {
        if self.total == 0 {
            100.0
        } else {
            // Counts are tiny; the conversion is exact.
            #[allow(clippy::cast_precision_loss)]
            let p = self.covered.len() as f64 * 100.0 / self.total as f64;
            p
        }
    }
}

/// Computes coverage of `catalog` by `scenarios`.
pub fn coverage(catalog: &[Requirement], scenarios: &[Scenario]) -> Coverage {
    let mut citing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut by_side: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in scenarios {
        // A scenario covers only through a side it runs on: one pending everywhere
        // covers nothing yet.
        let live: Vec<_> = s
            .target_sides()
            .into_iter()
            .filter(|side| s.pending_reason(*side).is_none())
            .collect();
        for side in &live {
            by_side
                .entry(side.as_str().to_string())
                .or_default()
                .extend(s.covers.iter().cloned());
        }
        if live.is_empty() {
            continue;
        }
        for id in &s.covers {
            let list = citing.entry(id.as_str()).or_default();
            if !list.contains(&s.id()) {
                list.push(s.id());
            }
        }
    }
    let known: BTreeSet<&str> = catalog.iter().map(|r| r.id.as_str()).collect();
    let mut cov = Coverage {
        by_side,
        total: catalog.len(),
        levels: catalog.iter().map(|r| (r.id.clone(), r.level)).collect(),
        ..Coverage::default()
    };
    for r in catalog {
        match citing.get(r.id.as_str()) {
            Some(names) => {
                if r.uncovered_reason.is_some() {
                    cov.stale_reasons.push(r.id.clone());
                }
                cov.covered.push((r.id.clone(), names.clone()));
            }
            None => cov.uncovered.push(Uncovered {
                id: r.id.clone(),
                section: r.section.clone(),
                level: r.level,
                reason: r.uncovered_reason.clone(),
            }),
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<Edge>> = BTreeMap::new();
    for s in scenarios {
        if s.target_sides()
            .into_iter()
            .all(|side| s.pending_reason(side).is_some())
        {
            continue;
        }
        for (key, list) in &s.edges {
            edges.entry(key.clone()).or_default().extend(list);
        }
    }
    let mut defined = BTreeSet::new();
    for r in catalog.iter().filter(|r| r.uncovered_reason.is_some()) {
        cov.bounds_exempt
            .extend(r.bounds.iter().map(|b| format!("{}/{}", r.id, b.name)));
    }
    for r in catalog.iter().filter(|r| r.uncovered_reason.is_none()) {
        for b in &r.bounds {
            let key = format!("{}/{}", r.id, b.name);
            cov.bounds_total += 1;
            let seen = edges.get(&key);
            let missing: Vec<Edge> = [Edge::At, Edge::Past]
                .into_iter()
                .filter(|e| !seen.is_some_and(|s| s.contains(e)))
                .collect();
            if !missing.is_empty() {
                cov.bound_gaps.push(BoundGap {
                    key: key.clone(),
                    bound: b.clone(),
                    missing,
                });
            }
            defined.insert(key);
        }
    }
    for s in scenarios {
        for key in s.edges.keys() {
            if !defined.contains(key) {
                cov.unknown_edges.push((s.id(), key.clone()));
            }
        }
    }
    for (id, names) in citing {
        if !known.contains(id) {
            cov.unknown.insert(id.to_string(), names);
        }
    }
    for s in scenarios {
        let mut named = Vec::new();
        let mut steps: Vec<&crate::scenario::Step> = s.steps.iter().collect();
        while let Some(step) = steps.pop() {
            use crate::scenario::Step;
            match step {
                Step::Reference {
                    requirement,
                    steps: inner,
                    ..
                } => {
                    named.push(requirement.clone());
                    steps.extend(inner);
                }
                Step::AnyOrder(inner) | Step::Repeat { steps: inner, .. } => steps.extend(inner),
                Step::Optional(inner) | Step::Tolerated(inner) => steps.push(inner),
                Step::Frame { frame, .. } => reference_patterns(frame, &mut named),
                // `launch: {skills: <pattern>}` matches what the target launched with.
                Step::Launch { args } => reference_patterns(args, &mut named),
                Step::Native {
                    expect: Some(expect),
                    ..
                } => reference_patterns(expect, &mut named),
                Step::ExpectExit {
                    code: Some(crate::scenario::model::ExitCodeSpec::Reference { requirement, .. }),
                    ..
                } => named.push(requirement.clone()),
                Step::ExpectClose { code, reason } => {
                    for value in code.iter().chain(reason) {
                        reference_patterns(value, &mut named);
                    }
                }
                _ => {}
            }
        }
        named.sort();
        named.dedup();
        for id in &s.covers {
            if cov.levels.get(id) == Some(&Level::Reference) && !named.contains(id) {
                cov.unmarked_references.push((s.id(), id.clone()));
            }
        }
        for requirement in named {
            if !s.covers.contains(&requirement) {
                cov.uncited_references.push((s.id(), requirement.clone()));
            }
            if cov.levels.get(&requirement) != Some(&Level::Reference) {
                cov.misused_references.push((s.id(), requirement));
            }
        }
    }
    cov
}

/// The requirements named by `{$reference: …, $requirement: …}` patterns in `value`,
/// nested ones included (a reference list whose elements hold reference values).
fn reference_patterns(value: &serde_json::Value, out: &mut Vec<String>) {
    crate::scenario::validation::walk(value, "$", &mut |v, _| {
        if let Ok(Some(r)) = crate::matcher::ReferencePattern::parse(v) {
            out.push(r.requirement);
        }
        false
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{ScenarioConfig, Step};

    fn req(id: &str, reason: Option<&str>) -> Requirement {
        Requirement {
            id: id.into(),
            section: "S".into(),
            level: if id.ends_with('4') {
                Level::Reference
            } else {
                Level::Required
            },
            statement: "x".into(),
            quote: Some("q".into()),
            reading: None,
            uncovered_reason: reason.map(Into::into),
            bounds: Vec::new(),
        }
    }

    #[test]
    fn a_bound_needs_both_edges_from_running_scenarios() {
        let mut r = req("CR-A-001", None);
        r.bounds = vec![
            Bound {
                name: "entries".into(),
                value: 1024,
                unit: BoundUnit::Entries,
            },
            Bound {
                name: "name_bytes".into(),
                value: 255,
                unit: BoundUnit::Bytes,
            },
        ];
        let mut at_and_past = scen("a", &["CR-A-001"]);
        at_and_past
            .edges
            .insert("CR-A-001/entries".into(), vec![Edge::At, Edge::Past]);
        let mut at_only = scen("b", &["CR-A-001"]);
        at_only
            .edges
            .insert("CR-A-001/name_bytes".into(), vec![Edge::At]);
        let mut typo = scen("c", &["CR-A-001"]);
        typo.edges.insert("CR-A-001/names".into(), vec![Edge::Past]);
        let cov = coverage(&[r], &[at_and_past, at_only, typo]);
        assert_eq!(cov.bounds_total, 2);
        assert_eq!(cov.bound_gaps.len(), 1);
        assert_eq!(cov.bound_gaps[0].key, "CR-A-001/name_bytes");
        assert_eq!(cov.bound_gaps[0].missing, vec![Edge::Past]);
        assert_eq!(
            cov.unknown_edges,
            vec![("core_runtime/c".to_string(), "CR-A-001/names".to_string())]
        );
        assert!(cov.errors().iter().any(|e| e.contains("CR-A-001/names")));
        assert!(
            cov.errors()
                .iter()
                .any(|e| e.contains("bound CR-A-001/name_bytes") && e.contains("past"))
        );
    }

    fn scen(name: &str, covers: &[&str]) -> Scenario {
        Scenario {
            pending: Default::default(),
            requires: Default::default(),
            edges: Default::default(),
            family: "core_runtime".into(),
            name: name.into(),
            summary: "s".into(),
            covers: covers.iter().map(|c| (*c).to_string()).collect(),
            sides: None,
            config: ScenarioConfig::default(),
            steps: vec![Step::Disconnect],
            path: "x".into(),
        }
    }

    #[test]
    fn covered_uncovered_unknown() {
        let catalog = vec![
            req("CR-A-001", None),
            req("CR-A-002", Some("needs hardware")),
            req("CR-A-003", None),
            req("CR-A-004", Some("stale")),
        ];
        let scenarios = vec![
            scen("one", &["CR-A-001", "CR-X-009"]),
            scen("two", &["CR-A-001", "CR-A-004"]),
        ];
        let cov = coverage(&catalog, &scenarios);
        assert_eq!(
            cov.covered[0],
            (
                "CR-A-001".to_string(),
                vec![
                    "core_runtime/one".to_string(),
                    "core_runtime/two".to_string()
                ]
            )
        );
        assert_eq!(cov.uncovered.len(), 2);
        assert_eq!(cov.uncovered[0].reason.as_deref(), Some("needs hardware"));
        assert_eq!(
            cov.unknown["CR-X-009"],
            vec!["core_runtime/one".to_string()]
        );
        let errors = cov.errors();
        // The three gaps, and CR-A-004 (reference) covered with no step marked by it.
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors
                .iter()
                .any(|e| e.contains("CR-A-004") && e.contains("marks no step"))
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("CR-A-003") && e.contains("no `uncovered` reason"))
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("unknown requirement ID CR-X-009"))
        );
        assert!(errors.iter().any(|e| e.contains("CR-A-004")));
        assert!((cov.percent() - 50.0).abs() < 1e-9);
        assert_eq!(cov.count(Level::Required), (1, 3));
        assert_eq!(cov.count(Level::Reference), (1, 1));
        let mut with_ref = scen("three", &["CR-A-001"]);
        with_ref.steps = vec![Step::Reference {
            requirement: "CR-A-001".into(),
            steps: vec![Step::Disconnect],
            sides: None,
        }];
        let cov = coverage(&catalog, &[with_ref]);
        assert!(
            cov.errors()
                .iter()
                .any(|e| e.contains("core_runtime/three") && e.contains("not a `level: reference`")),
            "{:?}",
            cov.errors()
        );
        // A reference the steps assert (here in an `expect_close` pattern) must be covered.
        let mut uncited = scen("four", &["CR-A-001"]);
        uncited.steps = vec![Step::ExpectClose {
            code: Some(serde_json::json!({"$reference": 1007, "$requirement": "CR-A-004"})),
            reason: None,
        }];
        let cov = coverage(&catalog, &[uncited.clone()]);
        assert_eq!(
            cov.uncited_references,
            [("core_runtime/four".to_string(), "CR-A-004".to_string())]
        );
        uncited.covers.push("CR-A-004".into());
        assert!(coverage(&catalog, &[uncited]).uncited_references.is_empty());
        // A `launch:` pattern (the skills set a host launched with) marks its references.
        let mut launched = scen("launched", &["CR-A-004"]);
        launched.steps = vec![Step::Launch {
            args: serde_json::json!({"skills": {"$reference": null, "$requirement": "CR-A-004"}}),
        }];
        assert!(
            coverage(&catalog, &[launched])
                .unmarked_references
                .is_empty()
        );
        // Coverage per side; a scenario pending on every side it has covers nothing.
        let mut core_only = scen("five", &["CR-A-001"]);
        core_only.sides = Some(vec![crate::scenario::Side::Core]);
        let mut pending = scen("six", &["CR-A-003"]);
        pending.sides = Some(vec![crate::scenario::Side::Runtime]);
        pending
            .pending
            .insert(crate::scenario::Side::Runtime, "not yet".into());
        let cov = coverage(&catalog, &[core_only, pending]);
        assert_eq!(cov.count_on("core", Level::Required), (1, 3));
        assert_eq!(cov.count_on("runtime", Level::Required), (0, 3));
        assert!(cov.uncovered.iter().any(|u| u.id == "CR-A-003"));
    }

    #[test]
    fn catalog_loads_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("core_runtime.yaml");
        std::fs::write(
            &path,
            "family: core_runtime\nrequirements:\n  - id: CR-CONN-001\n    section: Conn\n    level: required\n    statement: one socket\n    quote: q\n  - id: CR-CONN-002\n    section: Conn\n    level: reference\n    statement: two\n    reading: ours\n    uncovered: needs two devices\n",
        )
        .unwrap();
        let cat = load_catalog(&path).unwrap();
        assert_eq!(cat.len(), 2);
        assert_eq!(
            cat[1].uncovered_reason.as_deref(),
            Some("needs two devices")
        );
        assert_eq!(cat[0].level, Level::Required);
        assert_eq!(cat[1].level, Level::Reference);
        for (entry, needle) in [
            ("level: required\n    statement: s\n", "quote the spec"),
            ("level: reference\n    statement: s\n", "say which and why"),
            ("statement: s\n", "needs `level: required`"),
            (
                "level: required\n    statement: s\n    quote: q\n    reading: r\n",
                "belongs to reference",
            ),
        ] {
            std::fs::write(
                &path,
                format!("family: core_runtime\nrequirements:\n  - id: CR-CONN-001\n    section: Conn\n    {entry}"),
            )
            .unwrap();
            let err = load_catalog(&path).unwrap_err().to_string();
            assert!(
                err.contains(needle) && err.contains(":3:5"),
                "{entry}: {err}"
            );
        }

        std::fs::write(
            &path,
            "family: core_runtime\nrequirements:\n  - id: CR-CONN-001\n    section: Conn\n    statment: typo\n",
        )
        .unwrap();
        let err = load_catalog(&path).unwrap_err().to_string();
        assert!(
            err.contains("core_runtime.yaml:5:5: unknown field `statment`"),
            "{err}"
        );

        std::fs::write(
            &path,
            "family: core_runtime\nrequirements:\n  - {id: CR-CONN-001, section: a, level: required, statement: b, quote: q}\n  - {id: CR-CONN-001, section: a, level: required, statement: b, quote: q}\n",
        )
        .unwrap();
        let err = load_catalog(&path).unwrap_err().to_string();
        assert!(
            err.contains(":4:") && err.contains("defined twice"),
            "{err}"
        );
    }
}
