//! The wire-change report (`contract-harness golden changes`): what changed in the goldens
//! between a base revision and the working tree, told the way a reviewer reads a protocol
//! change — per scenario × side, per step, each field as `path: old → new`, frames added
//! or removed, the frame's party and type, and the requirements (with their spec
//! sections) the scenario covers.
//!
//! The "now" side of a golden is its `.pending` file when one exists (what `make
//! golden-review` just wrote), else the golden in the working tree. A golden that changed
//! while nothing under `scenarios/`, `impl/` or `harness/` changed in the same range is
//! flagged: the wire moved with no change that explains it.
//!
//! This module computes and renders the report from texts it is given
//! ([`GoldenPair`]); reading git and the file system is [`collect`]'s job, at the edge. It
//! never writes a golden.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::Value;
use similar::{ChangeTag, TextDiff};

use crate::golden::{ParsedEntry, parse_entries, pending_path};
use crate::matcher::child_path;

/// The directories whose change explains a golden change.
pub const SOURCE_DIRS: &[&str] = &["scenarios", "impl", "harness"];

/// One golden's text at the base and now (`None`: absent there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldenPair {
    /// `family/name.side.golden`, relative to the golden root.
    pub file: String,
    /// At the base revision.
    pub old: Option<String>,
    /// In the working tree (its `.pending` file when there is one).
    pub new: Option<String>,
}

/// One field that changed inside a frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    /// JSON path (`$.request.afterSequence`).
    pub path: String,
    /// Before (`None`: the field was absent).
    pub old: Option<Value>,
    /// After (`None`: the field is gone).
    pub new: Option<Value>,
}

/// What happened to one recorded frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum FrameChange {
    /// The frame changed field by field.
    Changed {
        /// The golden header (`step 7 client call`).
        step: String,
        /// What the frame is (`StartRun`, `preparation_status`, …).
        what: String,
        /// Every field that differs.
        fields: Vec<FieldChange>,
    },
    /// A frame the target now emits that it did not.
    Added {
        /// The golden header.
        step: String,
        /// What the frame is.
        what: String,
        /// The frame.
        frame: Value,
    },
    /// The same frame, recorded at another step (the scenario's steps were renumbered).
    Moved {
        /// The golden header before.
        from: String,
        /// The golden header now.
        to: String,
        /// What the frame is.
        what: String,
    },
    /// A frame the target no longer emits.
    Removed {
        /// The golden header.
        step: String,
        /// What the frame was.
        what: String,
        /// The frame.
        frame: Value,
    },
}

/// A requirement a changed scenario covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Covered {
    /// Its ID.
    pub id: String,
    /// Its spec section (empty when the catalog does not name it).
    pub section: String,
}

/// The changes of one golden (one scenario × side).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoldenChange {
    /// The family.
    pub family: String,
    /// The scenario's name.
    pub scenario: String,
    /// The side.
    pub side: String,
    /// `added`, `removed` or `modified`.
    pub status: &'static str,
    /// Frame by frame, in order.
    pub frames: Vec<FrameChange>,
    /// What the scenario covers.
    pub covers: Vec<Covered>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The base revision as given and as resolved.
    pub base: String,
    /// Every changed golden.
    pub goldens: Vec<GoldenChange>,
    /// Files under [`SOURCE_DIRS`] that changed in the range.
    pub sources_changed: usize,
    /// Goldens changed while no source did.
    pub unexplained: bool,
}

/// What the frame is: its `type`, `kind` or `method`; an RPC event as `<call> <kind>`
/// (`init message initialized`, `start status`); else its first key.
fn what(frame: &Value) -> String {
    for key in ["type", "kind", "method"] {
        if let Some(Value::String(s)) = frame.get(key) {
            return s.clone();
        }
    }
    let Value::Object(map) = frame else {
        return String::new();
    };
    let Some(kind) = map.keys().find(|k| !["call", "id"].contains(&k.as_str())) else {
        return String::new();
    };
    // The message's own oneof case, when it has exactly one key (`initialized`, `event`).
    let case = match map.get(kind.as_str()) {
        Some(Value::Object(inner)) if inner.len() == 1 => inner.keys().next().cloned(),
        _ => None,
    };
    let mut out = match map.get("call").and_then(Value::as_str) {
        Some(call) => format!("{call} {kind}"),
        None => kind.clone(),
    };
    if let Some(case) = case {
        out.push(' ');
        out.push_str(&case);
    }
    out
}

/// Field changes that recur unchanged across frames: `(path, old, new)` and how many
/// frames show it, most frequent first (only those seen more than once).
pub fn recurring(report: &Report) -> Vec<(String, String, String, usize)> {
    let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for g in &report.goldens {
        for f in &g.frames {
            if let FrameChange::Changed { fields, .. } = f {
                for c in fields {
                    *seen
                        .entry((c.path.clone(), show(c.old.as_ref()), show(c.new.as_ref())))
                        .or_default() += 1;
                }
            }
        }
    }
    let mut out: Vec<_> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((p, o, n), count)| (p, o, n, count))
        .collect();
    out.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.cmp(&b.0)));
    out
}

fn parse(entry: &ParsedEntry) -> Value {
    serde_json::from_str(&entry.body).unwrap_or_else(|_| Value::String(entry.body.clone()))
}

/// Every field that differs between `old` and `new` (arrays of unequal length are one
/// change at the array's path).
pub fn field_changes(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    match (old, new) {
        (Value::Object(om), Value::Object(nm)) => {
            let mut keys: Vec<&String> = om.keys().chain(nm.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = child_path(path, k);
                match (om.get(k), nm.get(k)) {
                    (Some(o), Some(n)) => field_changes(&sub, o, n, out),
                    (o, n) => out.push(FieldChange {
                        path: sub,
                        old: o.cloned(),
                        new: n.cloned(),
                    }),
                }
            }
        }
        (Value::Array(oa), Value::Array(na)) if oa.len() == na.len() => {
            for (i, (o, n)) in oa.iter().zip(na).enumerate() {
                field_changes(&format!("{path}[{i}]"), o, n, out);
            }
        }
        (o, n) if o == n => {}
        (o, n) => out.push(FieldChange {
            path: path.to_string(),
            old: Some(o.clone()),
            new: Some(n.clone()),
        }),
    }
}

/// The frame changes from `old` golden text to `new`: entries aligned by their headers
/// (a diff of the header sequences), paired entries compared field by field.
pub fn frame_changes(old: &str, new: &str) -> Vec<FrameChange> {
    let old = parse_entries(old);
    let new = parse_entries(new);
    let oh: Vec<&str> = old.iter().map(|e| e.header.as_str()).collect();
    let nh: Vec<&str> = new.iter().map(|e| e.header.as_str()).collect();
    let mut out = Vec::new();
    for change in TextDiff::from_slices(&oh, &nh).iter_all_changes() {
        match change.tag() {
            ChangeTag::Equal => {
                let (Some(i), Some(j)) = (change.old_index(), change.new_index()) else {
                    continue;
                };
                if old[i].body == new[j].body {
                    continue;
                }
                let (o, n) = (parse(&old[i]), parse(&new[j]));
                let mut fields = Vec::new();
                field_changes("$", &o, &n, &mut fields);
                out.push(FrameChange::Changed {
                    step: new[j].header.clone(),
                    what: what(&n),
                    fields,
                });
            }
            ChangeTag::Delete => {
                if let Some(i) = change.old_index() {
                    let frame = parse(&old[i]);
                    out.push(FrameChange::Removed {
                        step: old[i].header.clone(),
                        what: what(&frame),
                        frame,
                    });
                }
            }
            ChangeTag::Insert => {
                if let Some(j) = change.new_index() {
                    let frame = parse(&new[j]);
                    out.push(FrameChange::Added {
                        step: new[j].header.clone(),
                        what: what(&frame),
                        frame,
                    });
                }
            }
        }
    }
    pair_moves(out)
}

/// A removed and an added frame that are the same frame, recorded under another step,
/// become one [`FrameChange::Moved`] (in the added frame's place).
fn pair_moves(changes: Vec<FrameChange>) -> Vec<FrameChange> {
    let mut out: Vec<Option<FrameChange>> = changes.into_iter().map(Some).collect();
    for i in 0..out.len() {
        let Some(FrameChange::Added { step, what, frame }) = out[i].clone() else {
            continue;
        };
        let removed = out
            .iter()
            .position(|c| matches!(c, Some(FrameChange::Removed { frame: f, .. }) if *f == frame));
        if let Some(r) = removed
            && let Some(FrameChange::Removed { step: from, .. }) = out[r].take()
        {
            out[i] = Some(FrameChange::Moved {
                from,
                to: step,
                what,
            });
        }
    }
    out.into_iter().flatten().collect()
}

/// `family`, `name` and `side` of `family/name.side.golden`.
pub fn split_file(file: &str) -> Option<(String, String, String)> {
    let (family, rest) = file.split_once('/')?;
    let stem = rest.strip_suffix(".golden")?;
    let (name, side) = stem.rsplit_once('.')?;
    Some((family.to_string(), name.to_string(), side.to_string()))
}

/// The report of `pairs`; `covers(family, name)` gives what a scenario covers.
pub fn report(
    base: String,
    pairs: &[GoldenPair],
    sources_changed: usize,
    covers: &dyn Fn(&str, &str) -> Vec<Covered>,
) -> Report {
    let mut goldens = Vec::new();
    for pair in pairs {
        if pair.old == pair.new {
            continue;
        }
        let Some((family, scenario, side)) = split_file(&pair.file) else {
            continue;
        };
        let status = match (&pair.old, &pair.new) {
            (None, _) => "added",
            (_, None) => "removed",
            _ => "modified",
        };
        let frames = frame_changes(
            pair.old.as_deref().unwrap_or(""),
            pair.new.as_deref().unwrap_or(""),
        );
        goldens.push(GoldenChange {
            covers: covers(&family, &scenario),
            family,
            scenario,
            side,
            status,
            frames,
        });
    }
    let unexplained = !goldens.is_empty() && sources_changed == 0;
    Report {
        base,
        goldens,
        sources_changed,
        unexplained,
    }
}

fn show(value: Option<&Value>) -> String {
    match value {
        None => "(absent)".to_string(),
        Some(v) => format!("`{}`", serde_json::to_string(v).unwrap_or_default()),
    }
}

/// The report as Markdown, for a pull request.
pub fn markdown(report: &Report) -> String {
    let mut out = format!("# Wire changes since `{}`\n\n", report.base);
    if report.goldens.is_empty() {
        out.push_str("No golden changed: the wire is the same.\n");
        return out;
    }
    out.push_str(&format!(
        "{} golden(s) changed; {} file(s) under `scenarios/`, `impl/` or `harness/` changed.\n",
        report.goldens.len(),
        report.sources_changed
    ));
    let recurring = recurring(report);
    if !recurring.is_empty() {
        out.push_str("\nRecurring field changes (the same change in several frames):\n\n");
        out.push_str("| field | old | new | frames |\n|---|---|---|---|\n");
        for (path, old, new, count) in &recurring {
            out.push_str(&format!("| `{path}` | {old} | {new} | {count} |\n"));
        }
    }
    if report.unexplained {
        out.push_str(
            "\n> **Unexplained**: goldens changed while nothing under `scenarios/`, `impl/` or \
             `harness/` did. A golden should only move with the code or scenario that moves it.\n",
        );
    }
    for g in &report.goldens {
        out.push_str(&format!(
            "\n## {}/{} [{}] ({})\n\n",
            g.family, g.scenario, g.side, g.status
        ));
        if g.covers.is_empty() {
            out.push_str("Covers: (nothing listed)\n\n");
        } else {
            let covers: Vec<String> = g
                .covers
                .iter()
                .map(|c| match c.section.as_str() {
                    "" => c.id.clone(),
                    s => format!("{} ({s})", c.id),
                })
                .collect();
            out.push_str(&format!("Covers: {}\n\n", covers.join(", ")));
        }
        out.push_str(&render_frames(&g.frames));
    }
    out
}

/// Frame changes as Markdown list items (`- step 7 client call `StartRun`: changed`, its
/// fields indented below).
pub fn render_frames(frames: &[FrameChange]) -> String {
    let mut out = String::new();
    for f in frames {
        match f {
            FrameChange::Changed { step, what, fields } => {
                out.push_str(&format!("- {step} `{what}`: changed\n"));
                for c in fields {
                    out.push_str(&format!(
                        "  - `{}`: {} → {}\n",
                        c.path,
                        show(c.old.as_ref()),
                        show(c.new.as_ref())
                    ));
                }
            }
            FrameChange::Added { step, what, frame } => out.push_str(&format!(
                "- {step} `{what}`: added `{}`\n",
                serde_json::to_string(frame).unwrap_or_default()
            )),
            FrameChange::Moved { from, to, what } => out.push_str(&format!(
                "- {from} → {to} `{what}`: the same frame, at another step\n"
            )),
            FrameChange::Removed { step, what, frame } => out.push_str(&format!(
                "- {step} `{what}`: removed `{}`\n",
                serde_json::to_string(frame).unwrap_or_default()
            )),
        }
    }
    out
}

fn git(repo: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(output.stdout)
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The default base: the merge base of `HEAD` with the main branch (`main`, else
/// `origin/main`), else `HEAD`.
pub fn default_base(repo: &Path) -> String {
    for main in ["main", "origin/main"] {
        if let Ok(out) = git(repo, &["merge-base", "HEAD", main])
            && let Some(rev) = lines(&out).into_iter().next()
        {
            return rev;
        }
    }
    "HEAD".to_string()
}

/// Reads every golden under `golden_dir` at `base` (through git) and now (the working
/// tree, `.pending` first), and counts the source files changed since `base` (committed,
/// staged, unstaged or untracked).
///
/// # Errors
/// `base` does not resolve, git fails, or the golden directory is outside the repository.
pub fn collect(
    repo: &Path,
    golden_dir: &Path,
    base: &str,
) -> Result<(Vec<GoldenPair>, usize), String> {
    let rev = lines(&git(
        repo,
        &["rev-parse", "--verify", &format!("{base}^{{commit}}")],
    )?)
    .into_iter()
    .next()
    .ok_or_else(|| format!("{base} is not a commit"))?;
    let prefix = lines(&git(repo, &["rev-parse", "--show-prefix"])?)
        .into_iter()
        .next()
        .unwrap_or_default();
    let rel = |p: &Path| -> String {
        format!("{prefix}{}", p.display())
            .trim_end_matches('/')
            .to_string()
    };
    let root = rel(golden_dir);
    let mut old: BTreeMap<String, String> = BTreeMap::new();
    for path in lines(&git(
        repo,
        &["ls-tree", "-r", "--name-only", &rev, "--", &root],
    )?) {
        let Some(file) = path.strip_prefix(&format!("{root}/")) else {
            continue;
        };
        if !file.ends_with(".golden") {
            continue;
        }
        let text = git(repo, &["show", &format!("{rev}:{path}")])?;
        old.insert(
            file.to_string(),
            String::from_utf8_lossy(&text).into_owned(),
        );
    }
    let mut new: BTreeMap<String, String> = BTreeMap::new();
    for path in crate::golden::files_with_extension(golden_dir, "golden") {
        let Ok(file) = path.strip_prefix(golden_dir) else {
            continue;
        };
        let pending = pending_path(&path);
        let text = std::fs::read_to_string(if pending.exists() { &pending } else { &path })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        new.insert(file.display().to_string(), text);
    }
    // A pending golden for a scenario that has none yet.
    for pending in crate::golden::pending_files(golden_dir) {
        let golden = pending.with_extension("");
        if let Ok(file) = golden.strip_prefix(golden_dir)
            && !golden.exists()
        {
            let text = std::fs::read_to_string(&pending)
                .map_err(|e| format!("{}: {e}", pending.display()))?;
            new.insert(file.display().to_string(), text);
        }
    }
    let mut files: Vec<String> = old.keys().chain(new.keys()).cloned().collect();
    files.sort();
    files.dedup();
    let pairs = files
        .into_iter()
        .map(|file| GoldenPair {
            old: old.get(&file).cloned(),
            new: new.get(&file).cloned(),
            file,
        })
        .collect();
    let mut sources = lines(&git(
        repo,
        &[&["diff", "--name-only", &rev, "--"][..], SOURCE_DIRS].concat(),
    )?);
    sources.extend(lines(&git(
        repo,
        &[
            &["ls-files", "--others", "--exclude-standard", "--"][..],
            SOURCE_DIRS,
        ]
        .concat(),
    )?));
    sources.sort();
    sources.dedup();
    Ok((pairs, sources.len()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const OLD: &str = "# golden: engine/x [client target]\n\n## step 2 client call\n{\n  \"call\": \"$init\",\n  \"method\": \"Initialize\",\n  \"request\": {\n    \"protocol\": {\n      \"major\": 1,\n      \"minor\": 1\n    }\n  }\n}\n\n## step 7 client call\n{\n  \"method\": \"StartRun\",\n  \"request\": {\n    \"initialMessage\": \"hello\"\n  }\n}\n";

    #[test]
    fn a_changed_field_is_named_with_its_step_party_and_frame() {
        let new = OLD
            .replace("\"hello\"", "\"hi\"")
            .replace("\"minor\": 1\n", "\"minor\": 0\n");
        let frames = frame_changes(OLD, &new);
        assert_eq!(
            frames,
            vec![
                FrameChange::Changed {
                    step: "step 2 client call".into(),
                    what: "Initialize".into(),
                    fields: vec![FieldChange {
                        path: "$.request.protocol.minor".into(),
                        old: Some(json!(1)),
                        new: Some(json!(0)),
                    }],
                },
                FrameChange::Changed {
                    step: "step 7 client call".into(),
                    what: "StartRun".into(),
                    fields: vec![FieldChange {
                        path: "$.request.initialMessage".into(),
                        old: Some(json!("hello")),
                        new: Some(json!("hi")),
                    }],
                },
            ]
        );
    }

    #[test]
    fn frames_added_and_removed_are_reported_as_such() {
        let new = format!("{OLD}\n## step 9 client call\n{{\n  \"method\": \"CancelRun\"\n}}\n");
        assert!(matches!(
            frame_changes(OLD, &new).as_slice(),
            [FrameChange::Added { step, what, .. }] if step == "step 9 client call" && what == "CancelRun"
        ));
        assert!(matches!(
            frame_changes(&new, OLD).as_slice(),
            [FrameChange::Removed { what, .. }] if what == "CancelRun"
        ));
        // Renumbered steps: the same frame, moved.
        let renumbered = OLD.replace("## step 7 client call", "## step 8 client call");
        assert_eq!(
            frame_changes(OLD, &renumbered),
            vec![FrameChange::Moved {
                from: "step 7 client call".into(),
                to: "step 8 client call".into(),
                what: "StartRun".into(),
            }]
        );
        // A field that appears or goes away.
        let gone = OLD.replace(",\n  \"method\": \"Initialize\"", "");
        let fields = match frame_changes(OLD, &gone).as_slice() {
            [FrameChange::Changed { fields, .. }] => fields.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(fields[0].path, "$.method");
        assert_eq!(fields[0].new, None);
    }

    #[test]
    fn the_report_names_requirements_and_flags_an_unexplained_change() {
        let pairs = vec![
            GoldenPair {
                file: "engine/x.client.golden".into(),
                old: Some(OLD.into()),
                new: Some(OLD.replace("hello", "hi")),
            },
            GoldenPair {
                file: "engine/y.daemon.golden".into(),
                old: Some(OLD.into()),
                new: Some(OLD.into()),
            },
        ];
        let covers = |family: &str, name: &str| {
            assert_eq!((family, name), ("engine", "x"));
            vec![Covered {
                id: "EN-RUN-001".into(),
                section: "Operations".into(),
            }]
        };
        let r = report("main".into(), &pairs, 0, &covers);
        assert_eq!(r.goldens.len(), 1, "an unchanged golden is not listed");
        assert!(r.unexplained);
        let md = markdown(&r);
        for needle in [
            "## engine/x [client] (modified)",
            "Covers: EN-RUN-001 (Operations)",
            "- step 7 client call `StartRun`: changed",
            "  - `$.request.initialMessage`: `\"hello\"` → `\"hi\"`",
            "**Unexplained**",
        ] {
            assert!(md.contains(needle), "{needle} not in\n{md}");
        }
        assert!(!report("main".into(), &pairs, 3, &covers).unexplained);
        assert_eq!(
            split_file("core_runtime/a.b.runtime.golden"),
            Some(("core_runtime".into(), "a.b".into(), "runtime".into()))
        );
    }
}
