//! Embeds the scenarios, requirement catalogs and reference goldens of this version into
//! the harness binary (`contract_harness::embedded`), so a `contract-harness` installed
//! with `cargo install --path harness` (or from the packaged crate) runs without a
//! checkout.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "golden")
        {
            out.push(path);
        }
    }
}

fn main() {
    // `harness/scenarios` and `harness/golden` link to the repository's directories, so a
    // packaged crate carries copies of them and builds the same binary without a checkout.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut files = Vec::new();
    for dir in ["scenarios", "golden"] {
        let path = root.join(dir);
        println!("cargo:rerun-if-changed={}", path.display());
        walk(&path, &mut files);
    }
    files.sort();
    let mut code = String::from(
        "/// Every embedded file: its path under the repository root, and its bytes.\n",
    );
    code.push_str("pub static FILES: &[(&str, &[u8])] = &[\n");
    for file in &files {
        let rel = file.strip_prefix(&root).expect("under the root");
        // Directories must be re-run when a file inside them changes or appears.
        if let Some(parent) = file.parent() {
            println!("cargo:rerun-if-changed={}", parent.display());
        }
        let _ = writeln!(
            code,
            "    ({:?}, include_bytes!({:?})),",
            rel.display().to_string(),
            file.display().to_string()
        );
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("embedded.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
