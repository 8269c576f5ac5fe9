//! Extracts the seed corpus of every fuzz target from the repository itself, so the
//! fuzzers start from what the protocols really carry rather than from nothing:
//!
//! * `scenario_loader`: every YAML file under `scenarios/`, as it is.
//! * `core_runtime_frame`: every frame a `core:` or `runtime:` step of a `core_runtime`
//!   scenario sends or expects (at any depth: `reference:` and `optional:` blocks too),
//!   and every `core frame` / `runtime frame` a golden records; each as written and with
//!   its placeholders made concrete.
//! * `launch_config`: every scenario's `config.runtime` and `config.core`, each as
//!   written and deep-merged into the committed full default configurations
//!   (`fuzz/seeds/launch_config/*.json`, as the harness merges it), and every JSON
//!   block of `docs/` that looks like one.
//! * `strict_json`: all of the above, every JSON block of every golden and of `docs/`.
//!
//! Usage: `contract-fuzz-seeds [REPO_ROOT [OUT_DIR]]` (defaults: the repository holding
//! this crate, and `fuzz/corpus` in it). Files are named by a hash of their contents,
//! so running it again rewrites the same files and adds nothing; files already in the
//! output directories (what long fuzzing runs found) are left alone.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The corpus of each target, deduplicated.
#[derive(Default)]
struct Corpus {
    strict_json: BTreeSet<Vec<u8>>,
    core_runtime_frame: BTreeSet<Vec<u8>>,
    launch_config: BTreeSet<Vec<u8>>,
    scenario_loader: BTreeSet<Vec<u8>>,
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let root = args.next().map(PathBuf::from).unwrap_or_else(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        root.canonicalize().unwrap_or(root)
    });
    let out = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("fuzz/corpus"));
    if let Err(e) = run(&root, &out) {
        eprintln!("contract-fuzz-seeds: {e}");
        std::process::exit(1);
    }
}

fn run(root: &Path, out: &Path) -> Result<(), String> {
    let mut corpus = Corpus::default();
    let defaults = default_launch_configs(root)?;

    for path in files_under(&root.join("scenarios"), "yaml")? {
        let source = read(&path)?;
        corpus.scenario_loader.insert(source.clone().into_bytes());
        // Scenarios are read with the loader's options (`yes` stays a string, `007`
        // too); a file that does not parse still seeds the loader.
        let options = serde_saphyr::options! {
            strict_booleans: true,
            leading_zero_numbers_as_strings: true,
        };
        let Ok(scenario) = serde_saphyr::from_str_with_options::<Value>(&source, options) else {
            continue;
        };
        let core_runtime = scenario.get("family").and_then(Value::as_str) == Some("core_runtime");
        if let Some(steps) = scenario.get("steps") {
            let mut frames = Vec::new();
            step_frames(steps, &mut frames);
            for frame in frames {
                // As written (placeholders, matchers) and with them made concrete.
                for frame in [frame.clone(), concrete(&frame)] {
                    let bytes = compact(&frame);
                    if core_runtime {
                        corpus.core_runtime_frame.insert(bytes.clone());
                    }
                    corpus.strict_json.insert(bytes);
                }
            }
        }
        for party in ["runtime", "core"] {
            let Some(overlay) = scenario.get("config").and_then(|c| c.get(party)) else {
                continue;
            };
            corpus.launch_config.insert(compact(overlay));
            for base in defaults.iter().filter(|(p, _)| p == party) {
                let mut merged = base.1.clone();
                deep_merge(&mut merged, overlay);
                corpus.launch_config.insert(compact(&merged));
            }
        }
    }

    for path in files_under(&root.join("golden"), "golden")? {
        let frames_of_core_runtime = path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|f| f == "core_runtime");
        for (header, body) in golden_blocks(&read(&path)?) {
            let Ok(value) = serde_json::from_str::<Value>(&body) else {
                continue;
            };
            corpus.strict_json.insert(body.into_bytes());
            if frames_of_core_runtime
                && (header.ends_with(" runtime frame") || header.ends_with(" core frame"))
            {
                corpus.core_runtime_frame.insert(compact(&value));
                corpus.core_runtime_frame.insert(compact(&concrete(&value)));
            }
        }
    }

    for path in files_under(&root.join("docs"), "md")? {
        for block in json_blocks(&read(&path)?) {
            corpus.strict_json.insert(block.clone().into_bytes());
            let Ok(value) = serde_json::from_str::<Value>(&block) else {
                continue;
            };
            let config_keys = [
                "environment",
                "agent_kinds",
                "timers",
                "limits",
                "engine_profiles",
            ];
            if value
                .as_object()
                .is_some_and(|o| o.keys().any(|k| config_keys.contains(&k.as_str())))
            {
                corpus.launch_config.insert(block.into_bytes());
            }
        }
    }

    let configs: Vec<Vec<u8>> = corpus.launch_config.iter().cloned().collect();
    let frames: Vec<Vec<u8>> = corpus.core_runtime_frame.iter().cloned().collect();
    corpus.strict_json.extend(configs);
    corpus.strict_json.extend(frames);

    for (target, seeds) in [
        ("strict_json", &corpus.strict_json),
        ("core_runtime_frame", &corpus.core_runtime_frame),
        ("launch_config", &corpus.launch_config),
        ("scenario_loader", &corpus.scenario_loader),
    ] {
        if seeds.is_empty() {
            return Err(format!("no seed found for {target}"));
        }
        let dir = out.join(target);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for seed in seeds {
            let file = dir.join(format!("seed-{:016x}", fnv1a(seed)));
            fs::write(&file, seed).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        println!("{target}: {} seeds in {}", seeds.len(), dir.display());
    }
    Ok(())
}

/// The committed full default launch configurations, by party (`runtime_*.json`,
/// `core_*.json`), to merge each scenario's overlay into.
fn default_launch_configs(root: &Path) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    for path in files_under(&root.join("fuzz/seeds/launch_config"), "json")? {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let party = if name.starts_with("runtime") {
            "runtime"
        } else if name.starts_with("core") {
            "core"
        } else {
            continue;
        };
        let value =
            serde_json::from_str(&read(&path)?).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push((party.to_string(), value));
    }
    Ok(out)
}

/// Every frame of a `core:` or `runtime:` step, at any depth of `steps`.
fn step_frames(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if (key == "core" || key == "runtime") && inner.get("type").is_some() {
                    out.push(inner.clone());
                } else {
                    step_frames(inner, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| step_frames(v, out)),
        _ => {}
    }
}

/// A frame of a scenario or golden with its placeholders made concrete, so more seeds
/// decode: a placeholder (`$run`, `<executor_id#1>`, `<credential>`) becomes a canonical
/// UUID (most identities are UUIDs or free text), and a matcher object (`{ $gt: 0 }`,
/// `{ $reference: 1, … }`) the value it names.
fn concrete(value: &Value) -> Value {
    const UUID: &str = "00000000-0000-4000-8000-000000000001";
    match value {
        Value::String(s) if s.starts_with('$') || (s.starts_with('<') && s.ends_with('>')) => {
            Value::String(UUID.to_string())
        }
        Value::Object(map) if !map.is_empty() && map.keys().all(|k| k.starts_with('$')) => {
            let named = map
                .get("$reference")
                .or_else(|| map.values().find(|v| !v.is_string()))
                .or_else(|| map.values().next());
            named.map(concrete).unwrap_or(Value::Null)
        }
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), concrete(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(concrete).collect()),
        other => other.clone(),
    }
}

/// The harness's deep merge: objects merge key by key, anything else replaces.
fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(key) {
                    Some(slot) => deep_merge(slot, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (slot, value) => *slot = value.clone(),
    }
}

/// The `## step …` blocks of a golden: (header, body).
fn golden_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("## ") {
            blocks.extend(current.take());
            current = Some((header.to_string(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    blocks.extend(current);
    blocks
}

/// The bodies of the ```` ```json ```` blocks of a Markdown text.
fn json_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim() == "```json" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim() == "```" => blocks.extend(current.take()),
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    blocks
}

fn compact(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every file under `dir` (recursively) whose name ends in `.{ext}`, sorted.
fn files_under(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// 64-bit FNV-1a: a stable file name per seed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
