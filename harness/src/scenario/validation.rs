//! Semantic checks of a parsed scenario, run by the loader after the strict YAML parse.
//!
//! This module owns the rules the serde types cannot express: family matches the
//! directory and name the file stem; `covers` is non-empty with well-formed, distinct
//! requirement IDs; `sides` is non-empty and distinct; placeholders are well-formed;
//! frames are Envelopes of a known type sent in the right direction by the party that
//! writes them; `native` ops are control-channel ops; `any_order` holds only frame steps
//! of one party; durations, close codes and HTTP statuses are in range; `expect_exit` is
//! the last step with an exit code in 0..=255; workspace seed paths stay inside the
//! workspace, are seeded once, and generated files respect their size bounds. It never reads
//! files (the loader passes the parsed scenario and its locations) and never touches
//! sockets.

use std::collections::BTreeSet;

use serde_json::Value;
use serde_saphyr::Location;

use super::families::{self, FamilyTable};
use super::model::{
    API_CALL_ID_MAX_BYTES, API_IN_FLIGHT_MAX, API_METHODS, API_QUERY_PARAMS_MAX, ApiStep,
    ExitCodeSpec, GENERATED_FILE_MAX_BYTES, GENERATED_TOTAL_MAX_BYTES, Party, REPEAT_TIMES_MAX,
    Scenario, Side, Step, WorkspaceSeed,
};
use crate::bind::malformed_placeholders;
use crate::matcher::{ComparePattern, GENERATED_MARKER, GeneratedPattern};

/// Longest `scheme:` word a step may write (bytes).
const SCHEME_MAX_BYTES: usize = 32;

/// Longest `expect_exit.stderr` substring (bytes): the harness keeps a bounded stderr
/// tail, so a longer needle could never be found.
pub const EXPECT_EXIT_STDERR_MAX_BYTES: usize = 1024;

/// Source locations of a parsed scenario's parts (from the loader).
#[derive(Debug, Clone)]
pub struct Spans {
    /// `family` value.
    pub family: Location,
    /// `name` value.
    pub name: Location,
    /// `summary` value.
    pub summary: Location,
    /// `covers` list.
    pub covers: Location,
    /// Each `covers` item.
    pub cover_items: Vec<Location>,
    /// `sides` list, when present.
    pub sides: Option<Location>,
    /// `config`, when present.
    pub config: Option<Location>,
    /// `pending`, when present.
    pub pending: Option<Location>,
    /// `requires`, when present.
    pub requires: Option<Location>,
    /// `steps` list.
    pub steps: Location,
    /// Each top-level step (parallel to `Scenario::steps`).
    pub step_items: Vec<StepSpan>,
}

/// Location of one step and of its nested steps (`any_order`).
#[derive(Debug, Clone)]
pub struct StepSpan {
    /// Where the step's map starts.
    pub location: Location,
    /// Locations of nested steps, in order.
    pub children: Vec<Location>,
}

/// One validation problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    /// Where it is, when known.
    pub location: Option<Location>,
    /// What is wrong.
    pub message: String,
}

/// Whether `id` is a well-formed requirement ID: upper-case segments of letters and
/// digits joined by `-`, at least two segments, the last made of digits
/// (`CR-CONN-001`).
pub fn is_requirement_id(id: &str) -> bool {
    let segments: Vec<&str> = id.split('-').collect();
    segments.len() >= 2
        && segments.iter().all(|s| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
        && segments[0]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_uppercase())
        && segments
            .last()
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
}

/// Visits `value` and, unless `visit` returns `true` (handled), its elements and members
/// with their JSON paths.
pub(crate) fn walk(value: &Value, path: &str, visit: &mut dyn FnMut(&Value, &str) -> bool) {
    if visit(value, path) {
        return;
    }
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{path}[{i}]"), visit);
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                walk(v, &crate::matcher::child_path(path, k), visit);
            }
        }
        _ => {}
    }
}

struct Checker<'a> {
    scenario: &'a Scenario,
    /// The scenario's family table (`None`: an unknown family, reported once).
    table: Option<&'static FamilyTable>,
    issues: Vec<Issue>,
}

impl Checker<'_> {
    fn issue(&mut self, location: Option<Location>, message: impl Into<String>) {
        self.issues.push(Issue {
            location,
            message: message.into(),
        });
    }

    fn placeholders(&mut self, location: Location, what: &str, value: &Value) {
        for (path, text) in malformed_placeholders(value) {
            self.issue(
                Some(location),
                format!(
                    "{what}: malformed placeholder `{text}` at {path} (use `$name` with letters, digits, `_`; `$$` for a literal `$`)"
                ),
            );
        }
    }

    fn no_nulls(&mut self, location: Location, what: &str, value: &Value, path: &str) {
        match value {
            Value::Null => self.issue(
                Some(location),
                format!("{what}: null at {path} (the wire forbids null; leave the field out)"),
            ),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.no_nulls(location, what, item, &format!("{path}[{i}]"));
                }
            }
            Value::Object(map) => {
                for (k, v) in map {
                    self.no_nulls(location, what, v, &crate::matcher::child_path(path, k));
                }
            }
            _ => {}
        }
    }

    /// Checks every `{$generated: …}` pattern in `value`: well-formed, and only in a
    /// scenario that runs on one side, where each frame is either the target's (matched)
    /// or one the harness only sends (the pattern stands for its base64 string).
    fn generated_patterns(&mut self, location: Location, what: &str, party: Party, value: &Value) {
        let only_target = self
            .scenario
            .sides
            .as_deref()
            .is_some_and(|sides| sides.len() == 1);
        let mut found = Vec::new();
        walk(
            value,
            "$",
            &mut |v, path| match GeneratedPattern::parse(v) {
                Ok(Some(_)) if only_target => true,
                Ok(Some(_)) => {
                    found.push(format!(
                    "{what}: `{GENERATED_MARKER}` at {path} needs a scenario that runs on one side (it matches what the target emits and stands for its base64 in what the harness sends); use it in `{}` frames of a scenario with `sides: [{}]`",
                    party.as_str(),
                    party.side()
                ));
                    true
                }
                Err(reason) => {
                    found.push(format!("{what}: at {path}: {reason}"));
                    true
                }
                Ok(None) => false,
            },
        );
        self.issues_at(location, found);
    }

    /// Records each of `messages` as an issue at `location`.
    fn issues_at(&mut self, location: Location, messages: Vec<String>) {
        for message in messages {
            self.issue(Some(location), message);
        }
    }

    /// Checks every comparison (`{$gt: …, $as: …}`), reference pattern
    /// (`{$reference: …, $requirement: …}`) and in-order list pattern (`{$in_order: …,
    /// $besides: …}`) in `value` is well-formed.
    fn comparisons(&mut self, location: Location, what: &str, value: &Value) {
        let mut found = Vec::new();
        walk(value, "$", &mut |v, path| {
            if let Err(reason) = crate::matcher::ReferencePattern::parse(v) {
                found.push(format!("{what}: at {path}: {reason}"));
                return true;
            }
            if let Err(reason) = crate::matcher::InOrderPattern::parse(v) {
                found.push(format!("{what}: at {path}: {reason}"));
                return true;
            }
            match ComparePattern::parse(v) {
                Ok(Some(_)) => true,
                Err(reason) => {
                    found.push(format!("{what}: at {path}: {reason}"));
                    true
                }
                Ok(None) => false,
            }
        });
        self.issues_at(location, found);
    }

    fn frame(&mut self, location: Location, party: Party, frame: &Value) {
        let what = format!("`{}` frame", party.as_str());
        self.placeholders(location, &what, frame);
        self.comparisons(location, &what, frame);
        if !self.table.is_some_and(|t| t.nulls) {
            self.no_nulls(location, &what, frame, "$");
        }
        self.generated_patterns(location, &what, party, frame);
        if let Some(table) = self.table
            && let Err(reason) = (table.check_frame)(party, frame)
        {
            self.issue(Some(location), format!("{what}: {reason}"));
        }
    }

    fn step(&mut self, location: Location, children: &[Location], step: &Step) {
        if let Some(table) = self.table
            && !table.has_step(step.keyword())
        {
            self.issue(
                Some(location),
                format!(
                    "`{}` is not a step of family `{}` (its steps: {})",
                    step.keyword(),
                    table.family,
                    table.step_names()
                ),
            );
            return;
        }
        match step {
            Step::Frame { party, frame } => self.frame(location, *party, frame),
            Step::Native { op, args, expect } => {
                let ops = self.table.map_or(&[][..], |t| t.native_ops);
                if !ops.contains(&op.as_str()) {
                    self.issue(
                        Some(location),
                        format!(
                            "unknown native op `{op}`, expected one of {}",
                            ops.join(", ")
                        ),
                    );
                }
                if !args.is_object() {
                    self.issue(
                        Some(location),
                        format!("native `{op}`: arguments must be a mapping (use `{{}}` for none)"),
                    );
                }
                self.placeholders(location, &format!("native `{op}`"), args);
                if let Some(expect) = expect {
                    self.placeholders(location, &format!("native `{op}` expect"), expect);
                    self.comparisons(location, &format!("native `{op}` expect"), expect);
                }
            }
            Step::Bootstrap(b) => {
                self.scheme(location, "bootstrap", b.scheme.as_deref());
                if let Some(request) = &b.request {
                    self.placeholders(location, "bootstrap request", request);
                }
                if let Some(response) = &b.response {
                    self.status(location, "bootstrap", response.status);
                    if let Some(body) = &response.body {
                        self.placeholders(location, "bootstrap response body", body);
                    }
                }
            }
            Step::Connect(c) => {
                self.scheme(location, "connect", c.scheme.as_deref());
                if let Some(query) = &c.query {
                    self.placeholders(location, "connect query", query);
                }
                if let Some(response) = &c.response {
                    self.status(location, "connect", response.status);
                    if let Some(body) = &response.body {
                        self.placeholders(location, "connect response body", body);
                    }
                }
            }
            Step::Handshake {
                heartbeat_interval_ms: Some(0),
            } => self.issue(
                Some(location),
                "handshake: `heartbeat_interval_ms` must be positive",
            ),
            Step::Silence(d) if d.is_zero() => {
                self.issue(Some(location), "silence: the duration must be positive")
            }
            Step::Sleep(d) if d.is_zero() => {
                self.issue(Some(location), "sleep: the duration must be positive")
            }
            Step::Reconnect {
                within: Some(d), ..
            } if d.is_zero() => self.issue(
                Some(location),
                "reconnect: `within` must be positive",
            ),
            Step::AnyOrder(steps) => {
                if steps.len() < 2 {
                    self.issue(Some(location), "any_order needs at least two frame steps");
                }
                let mut parties = BTreeSet::new();
                for (i, inner) in steps.iter().enumerate() {
                    let loc = children.get(i).copied().unwrap_or(location);
                    match inner {
                        Step::Frame { party, .. } => {
                            parties.insert(party.as_str());
                            self.step(loc, &[], inner);
                        }
                        other => self.issue(
                            Some(loc),
                            format!(
                                "any_order may contain only `core`/`runtime` frame steps, found `{}`",
                                other.keyword()
                            ),
                        ),
                    }
                }
                if parties.len() > 1 {
                    self.issue(
                        Some(location),
                        "any_order frames must all be sent by the same party",
                    );
                }
            }
            Step::Repeat { times, steps } => {
                if !(1..=REPEAT_TIMES_MAX).contains(times) {
                    self.issue(
                        Some(location),
                        format!("repeat: `times` must be 1 to {REPEAT_TIMES_MAX}, found {times}"),
                    );
                }
                if steps.is_empty() {
                    self.issue(Some(location), "repeat: `steps` must not be empty");
                }
                for (i, inner) in steps.iter().enumerate() {
                    let loc = children.get(i).copied().unwrap_or(location);
                    match inner {
                        Step::Frame { .. }
                        | Step::SendBytes(_)
                        | Step::Api(_)
                        | Step::ApiResult(_)
                        | Step::Native { .. }
                        | Step::Silence(_)
                        | Step::Sleep(_) => self.step(loc, &[], inner),
                        other => self.issue(
                            Some(loc),
                            format!(
                                "repeat may hold frame, send_bytes, api, api_result, native, silence and sleep steps, found `{}`",
                                other.keyword()
                            ),
                        ),
                    }
                }
            }
            Step::Reference {
                requirement, steps, ..
            } => {
                if !is_requirement_id(requirement) {
                    self.issue(
                        Some(location),
                        format!("reference: malformed requirement ID `{requirement}`"),
                    );
                }
                if steps.is_empty() {
                    self.issue(Some(location), "reference: `steps` must not be empty");
                }
                for (i, inner) in steps.iter().enumerate() {
                    let loc = children.get(i).copied().unwrap_or(location);
                    // Our exit where the spec requires none: the group's last step, and the
                    // group the scenario's (checked with the scenario's steps).
                    if matches!(inner, Step::ExpectExit { .. }) && i + 1 != steps.len() {
                        self.issue(
                            Some(loc),
                            "expect_exit inside `reference` must be the group's last step",
                        );
                    }
                    self.step(loc, &[], inner);
                }
            }
            Step::Optional(inner) | Step::Tolerated(inner) => {
                let loc = children.first().copied().unwrap_or(location);
                match &**inner {
                    Step::Frame { .. } => self.step(loc, &[], inner),
                    other => self.issue(
                        Some(loc),
                        format!(
                            "optional holds one frame step (`{}`), found `{}`",
                            self.table
                                .map(|t| t
                                    .parties
                                    .iter()
                                    .map(|p| p.as_str())
                                    .collect::<Vec<_>>()
                                    .join("`/`"))
                                .unwrap_or_default(),
                            other.keyword()
                        ),
                    ),
                }
            }
            Step::HalfClose {
                code: Some(code), ..
            } if !(1000..=4999).contains(code) => self.issue(
                Some(location),
                format!("half_close: close code {code} is outside 1000..=4999"),
            ),
            Step::HalfClose {
                reason: Some(r), ..
            } if r.len() > 123 => self.issue(Some(location), "close reason longer than 123 bytes"),
            Step::ExpectClose { code, reason } => {
                if let Some(problem) = close_value_problem("code", code.as_ref())
                    .or_else(|| close_value_problem("reason", reason.as_ref()))
                {
                    self.issue(Some(location), format!("expect_close: {problem}"));
                }
            }
            Step::Api(api) => self.api(location, api),
            // The sides whose launch contract restarts the target: Core and the engine
            // daemon (same data directory), the engine client (same state directory), the
            // worker host (same working directory).
            Step::Crash { fresh_state: true }
                if !(self.scenario.family == "engine"
                    && self.scenario.sides.as_deref() == Some(&[Side::Daemon])) =>
            {
                self.issue(
                    Some(location),
                    "crash: `fresh_state` starts the engine daemon on an empty data directory: it needs family engine and `sides: [daemon]`",
                )
            }
            Step::Crash { .. }
                if !(matches!(
                    self.scenario.sides.as_deref(),
                    Some([Side::Core]) | Some([Side::Daemon]) | Some([Side::Client])
                ) || (self.scenario.family == "worker"
                    && self.scenario.sides.as_deref() == Some(&[Side::Host]))) =>
            {
                self.issue(
                    Some(location),
                    "crash restarts the target Core, engine daemon, engine client or worker host: it needs `sides: [core]`, `sides: [daemon]`, `sides: [client]` or (family worker) `sides: [host]`",
                )
            }
            Step::WriteWorkspace(seed) => self.workspace(Some(location), "write_workspace", seed),
            Step::ExpectExit { code, stderr } => {
                if let Some(ExitCodeSpec::Exact(code)) = code
                    && !(0..=255).contains(code)
                {
                    self.issue(
                        Some(location),
                        format!("expect_exit: exit code {code} is outside 0..=255"),
                    );
                }
                for needle in stderr {
                    if needle.is_empty() {
                        self.issue(
                            Some(location),
                            "expect_exit: a `stderr` substring must not be empty (leave `stderr` out to accept any stderr)",
                        );
                    } else if needle.len() > EXPECT_EXIT_STDERR_MAX_BYTES {
                        self.issue(
                            Some(location),
                            format!(
                                "expect_exit: a `stderr` substring is longer than {EXPECT_EXIT_STDERR_MAX_BYTES} bytes"
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    fn workspace(&mut self, location: Option<Location>, what: &str, ws: &WorkspaceSeed) {
        let mut seeded = BTreeSet::new();
        let generated = ws.generated.iter().map(|g| &g.path);
        let links = ws.symlinks.keys();
        for p in ws
            .files
            .keys()
            .chain(ws.dirs.iter())
            .chain(generated)
            .chain(links)
        {
            let path = std::path::Path::new(p);
            let escapes = path.is_absolute()
                || path
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)));
            if p.is_empty() || escapes {
                self.issue(
                    location,
                    format!("{what}: `{p}` must be a relative path inside the workspace"),
                );
            }
            if !seeded.insert(p.trim_end_matches('/')) {
                self.issue(location, format!("{what}: `{p}` is seeded twice"));
            }
        }
        for (link, target) in &ws.symlinks {
            if !symlink_stays_inside(link, target) {
                self.issue(
                    location,
                    format!(
                        "{what}.symlinks: `{link}` → `{target}` must be a relative target that stays inside the workspace"
                    ),
                );
            }
        }
        let mut total: u64 = 0;
        for (i, file) in ws.generated.iter().enumerate() {
            if file.size > GENERATED_FILE_MAX_BYTES {
                self.issue(
                    location,
                    format!(
                        "{what}.generated[{i}] (`{}`): size {} exceeds the {GENERATED_FILE_MAX_BYTES}-byte bound of one generated file",
                        file.path, file.size
                    ),
                );
            }
            if let Some(text) = &file.text {
                let fill_ok = text.fill.len() == 1
                    && text.fill.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
                if !fill_ok || file.seed != 0 || text.prefix.len() as u64 > file.size {
                    self.issue(
                        location,
                        format!(
                            "{what}.generated[{i}] (`{}`): a `text` takes no `seed`, its `fill` is one printable ASCII character and its `prefix` fits the size",
                            file.path
                        ),
                    );
                }
            }
            total = total.saturating_add(file.size);
        }
        if total > GENERATED_TOTAL_MAX_BYTES {
            self.issue(
                location,
                format!(
                    "{what}.generated: {total} bytes in all exceed the {GENERATED_TOTAL_MAX_BYTES}-byte bound"
                ),
            );
        }
    }

    fn api(&mut self, location: Location, api: &ApiStep) {
        let call = &api.call;
        self.scheme(location, "api.call", call.scheme.as_deref());
        if let Some(credential) = call.credential.as_deref()
            && !["api_key", "daemon", "none"].contains(&credential)
        {
            self.issue(
                Some(location),
                format!(
                    "api.call: `credential` is `api_key`, `daemon` or `none`, not `{credential}`"
                ),
            );
        }
        if !API_METHODS.contains(&call.method.as_str()) {
            self.issue(
                Some(location),
                format!(
                    "api: method `{}` is not one of {}",
                    call.method,
                    API_METHODS.join(", ")
                ),
            );
        }
        if !call.path.starts_with("/v1/") || call.path.contains(['?', '#', ' ']) {
            self.issue(
                Some(location),
                format!(
                    "api: path `{}` must start with `/v1/` and hold no query, fragment or space \
                     (write query parameters under `call.query`)",
                    call.path
                ),
            );
        }
        if let Some(query) = &call.query {
            if query.len() > API_QUERY_PARAMS_MAX {
                self.issue(
                    Some(location),
                    format!(
                        "api: `call.query` has {} parameters, more than {API_QUERY_PARAMS_MAX}",
                        query.len()
                    ),
                );
            }
            for (name, value) in query {
                if name.is_empty() || name.starts_with('$') {
                    self.issue(
                        Some(location),
                        format!("api: query parameter name `{name}` must be a non-empty literal"),
                    );
                }
                self.placeholders(location, "api.call.query", &Value::String(value.clone()));
            }
        }
        match (&api.id, api.wait) {
            (None, false) => self.issue(
                Some(location),
                "api: `await: false` needs an `id` (the `api_result:` step that awaits the call names it)",
            ),
            (Some(id), true) => self.issue(
                Some(location),
                format!("api: `id: {id}` names an asynchronous call: add `await: false`"),
            ),
            (Some(id), false) if !is_api_call_id(id) => self.issue(
                Some(location),
                format!(
                    "api: call ID `{id}` must be 1..={API_CALL_ID_MAX_BYTES} letters, digits, `_` or `-`"
                ),
            ),
            _ => {}
        }
        if api.poll && !api.wait {
            self.issue(
                Some(location),
                "api: `poll` repeats a call until it matches; an asynchronous call (`await: false`) cannot poll",
            );
        }
        for segment in call.path.split('/') {
            self.placeholders(location, "api.call.path", &Value::String(segment.into()));
        }
        if api.poll && call.method != "GET" {
            self.issue(
                Some(location),
                "api: `poll` repeats the call, so it is allowed only for GET",
            );
        }
        if let Some(body) = &call.body {
            // Not a frame: `null` may be sent on purpose (Core must refuse it).
            self.placeholders(location, "api.call.body", body);
            // `{$generated: …}` is sent as the base64 of its bytes: only well-formed ones.
            let mut found = Vec::new();
            walk(body, "$", &mut |v, path| match GeneratedPattern::parse(v) {
                Ok(Some(_)) => true,
                Err(reason) => {
                    found.push(format!("api.call.body: at {path}: {reason}"));
                    true
                }
                Ok(None) => false,
            });
            self.issues_at(location, found);
        }
        self.status(location, "api.expect", api.expect.status);
        if let Some(body) = &api.expect.body {
            self.placeholders(location, "api.expect.body", body);
        }
    }

    /// An `Authorization` scheme word a step writes: 1 to [`SCHEME_MAX_BYTES`] ASCII
    /// letters (a header value the HTTP stack can send, never the credential).
    fn scheme(&mut self, location: Location, what: &str, scheme: Option<&str>) {
        if let Some(scheme) = scheme
            && (scheme.is_empty()
                || scheme.len() > SCHEME_MAX_BYTES
                || !scheme.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            self.issue(
                Some(location),
                format!(
                    "{what}: `scheme` must be 1 to {SCHEME_MAX_BYTES} ASCII letters, found {scheme:?}"
                ),
            );
        }
    }

    fn status(&mut self, location: Location, what: &str, status: u16) {
        if !(100..=599).contains(&status) {
            self.issue(
                Some(location),
                format!("{what}: HTTP status {status} out of range"),
            );
        }
    }
}

/// One sighting of a named placeholder: where, and on which target sides the value
/// holding it is sent by the harness or expected from the target.
struct Sighting {
    location: Location,
    step: usize,
    what: String,
    sent_on: BTreeSet<Side>,
    expected_on: BTreeSet<Side>,
}

use crate::bind::placeholder_names;

/// Records the placeholders of `value` as sighted at `location`. `sent_when` is the
/// target side on which the harness sends `value`, `expected_when` the one on which it
/// matches it against the target (`None`: that never happens).
#[allow(clippy::too_many_arguments)]
fn sight(
    scenario: &Scenario,
    sightings: &mut std::collections::BTreeMap<String, Vec<Sighting>>,
    location: Location,
    step: usize,
    what: &str,
    value: &Value,
    sent_when: Option<Side>,
    expected_when: Option<Side>,
) {
    let on = |side: Option<Side>| -> BTreeSet<Side> {
        side.into_iter().filter(|s| scenario.runs_on(*s)).collect()
    };
    let mut names = Vec::new();
    placeholder_names(value, &mut names);
    for name in names {
        sightings.entry(name).or_default().push(Sighting {
            location,
            step,
            what: what.to_string(),
            sent_on: on(sent_when),
            expected_on: on(expected_when),
        });
    }
}

/// The sightings of one step's values (`step` is the 1-based top-level index).
fn sight_step(
    scenario: &Scenario,
    sightings: &mut std::collections::BTreeMap<String, Vec<Sighting>>,
    location: Location,
    children: &[Location],
    step: usize,
    s: &Step,
) {
    let mut add = |what: &str, value: &Value, sent: Option<Side>, expected: Option<Side>| {
        sight(
            scenario, sightings, location, step, what, value, sent, expected,
        );
    };
    let (rt, core) = (Some(Side::Runtime), Some(Side::Core));
    // The side whose control channel performs `native:` (and `launch:`) steps.
    let native = families::table(&scenario.family).and_then(|t| t.native_side);
    match s {
        Step::Frame { party, frame } => {
            let target = party.side();
            // The family's other side (`host` is the worker's and the plugin's).
            let other = families::table(&scenario.family)
                .and_then(|t| t.sides.iter().copied().find(|s| *s != target))
                .or(Some(target.opposite()));
            add(
                &format!("`{}` frame", party.as_str()),
                frame,
                other,
                Some(target),
            );
        }
        // Performed only when the side with the control channel is the target.
        Step::Native { op, args, expect } => {
            add(&format!("native `{op}`"), args, native, None);
            if let Some(expect) = expect {
                add(&format!("native `{op}` expect"), expect, None, native);
            }
        }
        // Binds its placeholders from what the target launched.
        Step::Launch { args } => {
            add("launch", args, None, native);
            if args.get("token").is_none() {
                add("launch", &Value::String("$token".into()), None, native);
            }
        }
        Step::Bootstrap(b) => {
            if let Some(request) = &b.request {
                add("bootstrap request", request, core, rt);
            }
            if let Some(body) = b.response.as_ref().and_then(|r| r.body.as_ref()) {
                add("bootstrap response body", body, rt, core);
            }
        }
        Step::Connect(c) => {
            if let Some(query) = &c.query {
                add("connect query", query, core, rt);
            }
            if let Some(body) = c.response.as_ref().and_then(|r| r.body.as_ref()) {
                add("connect response body", body, rt, core);
            }
        }
        // Performed only when Core is the target.
        Step::Api(api) => {
            for segment in api.call.path.split('/') {
                add("api.call.path", &Value::String(segment.into()), core, None);
            }
            for value in api.call.query.iter().flat_map(|q| q.values()) {
                add("api.call.query", &Value::String(value.clone()), core, None);
            }
            if let Some(body) = &api.call.body {
                add("api.call.body", body, core, None);
            }
            if let Some(body) = &api.expect.body {
                add("api.expect.body", body, None, core);
            }
        }
        Step::AnyOrder(steps) | Step::Repeat { steps, .. } => {
            for (i, inner) in steps.iter().enumerate() {
                let loc = children.get(i).copied().unwrap_or(location);
                sight_step(scenario, sightings, loc, &[], step, inner);
            }
        }
        Step::Optional(inner) | Step::Tolerated(inner) => {
            let loc = children.first().copied().unwrap_or(location);
            sight_step(scenario, sightings, loc, &[], step, inner);
        }
        Step::Reference { steps, .. } => {
            for (i, inner) in steps.iter().enumerate() {
                let loc = children.get(i).copied().unwrap_or(location);
                sight_step(scenario, sightings, loc, &[], step, inner);
            }
        }
        _ => {}
    }
}

/// Whether the symlink `link` → `target` (a seed path and its target) points inside the
/// workspace: `target` is relative, and resolving it lexically from the link's directory
/// never climbs above the workspace root.
pub fn symlink_stays_inside(link: &str, target: &str) -> bool {
    use std::path::Component;
    let target = std::path::Path::new(target);
    if target.as_os_str().is_empty() || target.is_absolute() {
        return false;
    }
    let mut depth = std::path::Path::new(link).parent().map_or(0, |p| {
        p.components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .count()
    });
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir if depth == 0 => return false,
            Component::ParentDir => depth -= 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Flags placeholder typos: a named placeholder written exactly once in the whole
/// scenario, in a value the harness only ever **sends** (never matches against the
/// target), silently mints a fresh value nobody checks — typically a misspelling of
/// another placeholder (`$hl` for `$h1`). A placeholder bound once in an expected value
/// and never used again is legitimate and not flagged.
fn single_use_placeholders(scenario: &Scenario, spans: &Spans, issues: &mut Vec<Issue>) {
    let mut sightings = std::collections::BTreeMap::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let (loc, children) = spans
            .step_items
            .get(i)
            .map_or((spans.steps, &[][..]), |s| (s.location, &s.children[..]));
        sight_step(scenario, &mut sightings, loc, children, i + 1, step);
    }
    let prebound: fn(&str) -> bool =
        families::table(&scenario.family).map_or(|_| false, |t| t.prebound);
    for (name, seen) in sightings {
        let [only] = &seen[..] else { continue };
        if prebound(&name) {
            continue;
        }
        if only.sent_on.is_empty() || !only.expected_on.is_empty() {
            continue;
        }
        issues.push(Issue {
            location: Some(only.location),
            message: format!(
                "step {}: {}: placeholder `${name}` appears nowhere else in the scenario; in a \
                 value the harness sends it would mint a fresh value nobody checks (a typo of \
                 another placeholder? write a literal value if you mean one)",
                only.step, only.what
            ),
        });
    }
}

/// Whether `id` is a well-formed `api:` call ID: 1..=[`API_CALL_ID_MAX_BYTES`] ASCII
/// letters, digits, `_` or `-`.
pub fn is_api_call_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= API_CALL_ID_MAX_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks the asynchronous `api:` calls (`await: false`) against their `api_result:`
/// steps, in step order: every ID is started once, awaited exactly once, after its start,
/// and at most [`API_IN_FLIGHT_MAX`] calls are in flight at any point.
fn async_api_calls(scenario: &Scenario, spans: &Spans, issues: &mut Vec<Issue>) {
    let mut issue = |location: Location, message: String| {
        issues.push(Issue {
            location: Some(location),
            message,
        });
    };
    // ID → (step number, location) of its start; `awaited` holds the IDs already awaited.
    let mut started: std::collections::BTreeMap<&str, (usize, Location)> = Default::default();
    let mut in_flight: BTreeSet<&str> = BTreeSet::new();
    let mut awaited: std::collections::BTreeMap<&str, usize> = Default::default();
    // The steps of a `reference:` group count where the group stands.
    let flat = scenario.steps.iter().enumerate().flat_map(|(i, step)| {
        let inner: Vec<&Step> = match step {
            Step::Reference { steps, .. } => steps.iter().collect(),
            other => vec![other],
        };
        inner.into_iter().map(move |s| (i, s))
    });
    for (i, step) in flat {
        let location = spans.step_items.get(i).map_or(spans.steps, |s| s.location);
        let n = i + 1;
        match step {
            Step::Api(ApiStep {
                id: Some(id),
                wait: false,
                ..
            }) => {
                if let Some((first, _)) = started.get(id.as_str()) {
                    issue(
                        location,
                        format!("step {n}: api call ID `{id}` is already used by step {first}"),
                    );
                    continue;
                }
                started.insert(id, (n, location));
                in_flight.insert(id);
                if in_flight.len() > API_IN_FLIGHT_MAX {
                    issue(
                        location,
                        format!(
                            "step {n}: {} asynchronous api calls would be in flight at once, more than {API_IN_FLIGHT_MAX}",
                            in_flight.len()
                        ),
                    );
                }
            }
            Step::ApiResult(result) => {
                let id = result.id.as_str();
                if let Some(first) = awaited.get(id) {
                    issue(
                        location,
                        format!("step {n}: api call `{id}` is already awaited by step {first}"),
                    );
                } else if in_flight.remove(id) {
                    awaited.insert(id, n);
                } else {
                    issue(
                        location,
                        format!(
                            "step {n}: api_result names `{id}`, but no earlier `api` step with \
                             `await: false` started a call with that ID"
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    for id in in_flight {
        let (n, location) = started[id];
        issue(
            location,
            format!(
                "step {n}: api call `{id}` is never awaited (add `- api_result: {{id: {id}}}`)"
            ),
        );
    }
}

/// Checks `scenario` (loaded from `scenario.path`) and returns every problem found.
pub fn validate(scenario: &Scenario, spans: &Spans) -> Vec<Issue> {
    let mut c = Checker {
        scenario,
        table: families::table(&scenario.family),
        issues: Vec::new(),
    };
    let dir_family = scenario
        .path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    if dir_family != Some(scenario.family.as_str()) {
        c.issue(
            Some(spans.family),
            format!(
                "family `{}` does not match the directory `{}`",
                scenario.family,
                dir_family.unwrap_or("")
            ),
        );
    }
    let stem = scenario.path.file_stem().and_then(|n| n.to_str());
    if stem != Some(scenario.name.as_str()) {
        c.issue(
            Some(spans.name),
            format!(
                "name `{}` does not match the file name `{}`",
                scenario.name,
                stem.unwrap_or("")
            ),
        );
    }
    if c.table.is_none() {
        c.issue(
            Some(spans.family),
            format!(
                "unknown family `{}`; families: {}",
                scenario.family,
                families::family_names()
            ),
        );
    }
    if scenario.summary.trim().is_empty() {
        c.issue(Some(spans.summary), "summary must not be empty");
    }
    if scenario.covers.is_empty() {
        c.issue(
            Some(spans.covers),
            "covers must name at least one requirement ID",
        );
    }
    let mut seen = BTreeSet::new();
    for (i, id) in scenario.covers.iter().enumerate() {
        let loc = spans.cover_items.get(i).copied().unwrap_or(spans.covers);
        if !is_requirement_id(id) {
            c.issue(
                Some(loc),
                format!("malformed requirement ID `{id}` (expected e.g. `CR-CONN-001`)"),
            );
        }
        if !seen.insert(id.as_str()) {
            c.issue(Some(loc), format!("requirement ID `{id}` listed twice"));
        }
    }
    if let Some(sides) = &scenario.sides {
        let loc = spans.sides;
        if sides.is_empty() {
            c.issue(
                loc,
                "sides must not be empty (leave it out to run on every side)",
            );
        }
        let distinct: BTreeSet<_> = sides.iter().collect();
        if distinct.len() != sides.len() {
            c.issue(loc, "sides lists a side twice");
        }
        if let Some(table) = c.table {
            for side in sides.iter().filter(|s| !table.sides.contains(s)) {
                c.issue(
                    loc,
                    format!(
                        "family `{}` has no side `{side}` (its sides: {})",
                        table.family,
                        table
                            .sides
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
        }
    }
    if let Some(table) = c.table {
        let set = [
            ("runtime", scenario.config.runtime.is_some()),
            ("core", scenario.config.core.is_some()),
            ("workspace", scenario.config.workspace.is_some()),
        ];
        for (key, _) in set
            .iter()
            .filter(|(k, on)| *on && !table.config_keys.contains(k))
        {
            c.issue(
                spans.config,
                format!(
                    "config.{key} is not a setting of family `{}` (its settings: {})",
                    table.family,
                    if table.config_keys.is_empty() {
                        "none".to_string()
                    } else {
                        table.config_keys.join(", ")
                    }
                ),
            );
        }
    }
    for (what, value) in [
        ("config.runtime", &scenario.config.runtime),
        ("config.core", &scenario.config.core),
    ] {
        if let Some(v) = value
            && !v.is_object()
        {
            c.issue(spans.config, format!("{what} must be a mapping"));
        }
    }
    if let Some(ws) = &scenario.config.workspace {
        c.workspace(spans.config, "config.workspace", ws);
    }
    for (side, reason) in &scenario.pending {
        if c.table.is_some_and(|t| !t.sides.contains(side)) {
            c.issue(
                spans.pending,
                format!(
                    "pending names side `{side}`, which family `{}` does not have",
                    scenario.family
                ),
            );
        } else if !scenario.runs_on(*side) {
            c.issue(
                spans.pending,
                format!("pending names side `{side}`, which the scenario does not run on"),
            );
        }
        if reason.trim().is_empty() {
            c.issue(
                spans.pending,
                format!("pending.{side}: say why the side is pending"),
            );
        }
    }
    if let Some(table) = c.table {
        for name in scenario.requires.keys() {
            if !table.features.contains(&name.as_str()) {
                c.issue(
                    spans.requires,
                    format!(
                        "requires: `{name}` is not an optional feature of family `{}` (its \
                         features: {})",
                        table.family,
                        if table.features.is_empty() {
                            "none".to_string()
                        } else {
                            table.features.join(", ")
                        }
                    ),
                );
            }
        }
    }
    if scenario.steps.is_empty() {
        c.issue(Some(spans.steps), "steps must not be empty");
    }
    let mut terminated = false;
    for (i, step) in scenario.steps.iter().enumerate() {
        let (loc, children) = spans
            .step_items
            .get(i)
            .map_or((spans.steps, &[][..]), |s| (s.location, &s.children[..]));
        c.step(loc, children, step);
        if matches!(step, Step::Terminate) {
            if terminated {
                c.issue(
                    Some(loc),
                    "terminate may appear once (a target gets its stop signal once; a second one \
                     would test the signal handler's repetition, which no spec states)",
                );
            }
            terminated = true;
        }
        let exits = match step {
            Step::ExpectExit { .. } => true,
            Step::Reference { steps, .. } => {
                matches!(steps.last(), Some(Step::ExpectExit { .. }))
            }
            _ => false,
        };
        if exits && i + 1 != scenario.steps.len() {
            c.issue(
                Some(loc),
                "expect_exit must be the last step (nothing can happen after the target exited)",
            );
        }
    }
    single_use_placeholders(scenario, spans, &mut c.issues);
    async_api_calls(scenario, spans, &mut c.issues);
    c.issues
}

/// What is wrong with an `expect_close` `code` or `reason`: a code is an integer in
/// 0..=65535, a reason a string of at most 123 bytes (RFC 6455 §5.5), each also a
/// placeholder or a pattern (`{$reference: …}`, a comparison) whose literal parts obey
/// the same rule.
fn close_value_problem(key: &str, value: Option<&Value>) -> Option<String> {
    let value = value?;
    if value.is_null() {
        return Some(format!(
            "`{key}: null` is not a pattern; leave `{key}` out (any Close, or a dropped \
             connection) or write `$_`"
        ));
    }
    let literal_problem = |v: &Value| -> Option<String> {
        match (key, v) {
            ("code", Value::Number(n)) if n.as_u64().is_some_and(|c| c <= 65535) => None,
            ("code", Value::Number(n)) => Some(format!("close code {n} is not in 0..=65535")),
            ("reason", Value::String(r)) if r.starts_with('$') => None,
            ("reason", Value::String(r)) if r.len() > 123 => {
                Some("close reason longer than 123 bytes".into())
            }
            ("reason", Value::String(_)) => None,
            (_, Value::String(s)) if s.starts_with('$') => None,
            (_, other) => Some(format!(
                "`{key}` takes {}, not {other}",
                if key == "code" {
                    "an integer close code or a pattern"
                } else {
                    "a string or a pattern"
                }
            )),
        }
    };
    match crate::matcher::ReferencePattern::parse(value) {
        Ok(Some(r)) => {
            if matches!(
                crate::matcher::ReferencePattern::parse(&r.otherwise),
                Ok(Some(_))
            ) {
                return Some(format!(
                    "`{key}`: a `$otherwise` cannot be another `$reference`"
                ));
            }
            return literal_problem(&r.reference)
                .or_else(|| close_value_problem(key, Some(&r.otherwise)));
        }
        Err(e) => return Some(format!("`{key}`: {e}")),
        Ok(None) => {}
    }
    match crate::matcher::ComparePattern::parse(value) {
        Ok(Some(_)) if key == "code" => return None,
        Ok(Some(_)) => return Some("a close reason cannot be a comparison".into()),
        Err(e) => return Some(format!("`{key}`: {e}")),
        Ok(None) => {}
    }
    literal_problem(value)
}
