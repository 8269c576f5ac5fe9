//! One verdict from two parsers: the committed envelope corpus (`corpus.json`: valid and
//! invalid host → worker frames of every kind, with the code each must get) is classified
//! by the Rust decoder and by the Python worker's decoder alike, and thousands of random
//! mutations of it (fixed seed, bounded count) get the same verdict from both.

use base64::Engine as _;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{Direction, Expect, decode_envelope};

const CORPUS: &str = include_str!("corpus.json");

/// Mutations per corpus case in the differential run.
const MUTATIONS_PER_CASE: usize = 150;

/// Seed of the differential run (fixed: a disagreement reproduces).
const SEED: u64 = 0x005e_ed0f_c0de;

/// One corpus case: name, payload, the code it must get (`None`: it decodes).
type Case = (String, Vec<u8>, Option<String>);

fn corpus() -> (String, String, Vec<Case>) {
    let v: Value = serde_json::from_str(CORPUS).unwrap();
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                base64::engine::general_purpose::STANDARD
                    .decode(c["payload_b64"].as_str().unwrap())
                    .unwrap(),
                c["code"].as_str().map(String::from),
            )
        })
        .collect();
    (
        v["session_id"].as_str().unwrap().into(),
        v["generation"].as_str().unwrap().into(),
        cases,
    )
}

fn rust_code(payload: &[u8], session: &str, generation: &str) -> Option<String> {
    let expect = Expect {
        session_id: session,
        generation,
        direction: Direction::HostToWorker,
    };
    decode_envelope(payload, Some(&expect))
        .err()
        .map(|e| e.code().to_string())
}

/// Classifies every payload with the Python worker's decoder (one process for all).
fn python_codes(payloads: &[Vec<u8>], session: &str, generation: &str) -> Vec<Option<String>> {
    use std::io::Write;
    let mut child = std::process::Command::new(crate::worker::python::interpreter())
        .args(["-B", "-c", crate::worker::python::SOURCE, "--classify"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut input = String::new();
    for p in payloads {
        let line = json!({
            "payload_b64": base64::engine::general_purpose::STANDARD.encode(p),
            "session_id": session,
            "generation": generation,
        });
        input.push_str(&line.to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "the Python classifier failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["code"].as_str().map(String::from)
        })
        .collect()
}

#[test]
fn both_decoders_give_every_corpus_frame_its_code() {
    let (session, generation, cases) = corpus();
    let payloads: Vec<Vec<u8>> = cases.iter().map(|c| c.1.clone()).collect();
    let python = python_codes(&payloads, &session, &generation);
    let mut wrong = Vec::new();
    for ((name, payload, want), py) in cases.iter().zip(&python) {
        let rs = rust_code(payload, &session, &generation);
        if &rs != want || py != want {
            wrong.push(format!("{name}: want {want:?}, Rust {rs:?}, Python {py:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// One random mutation of `payload`: a byte changed, removed or inserted, a span
/// duplicated (keys repeated), or a span cut out.
fn mutate(rng: &mut rand::rngs::StdRng, payload: &[u8]) -> Vec<u8> {
    const SIGNIFICANT: &[u8] = b"{}[]\":,0123456789-.eEnultrfasNI \\\x00\xff";
    let mut p = payload.to_vec();
    if p.is_empty() {
        return vec![b'{'];
    }
    const NUMBERS: &[&[u8]] = &[
        b"-0",
        b"1e308",
        b"1.7976931348623158e308",
        b"1.7976931348623159e308",
        b"18446744073709551615",
        b"18446744073709551616",
        b"-9223372036854775809",
        b"0.1e-400",
        b"[[[[[[[[]]]]]]]]",
        b"[",
    ];
    let i = rng.random_range(0..p.len());
    match rng.random_range(0..7) {
        5 => {
            let n = NUMBERS[rng.random_range(0..NUMBERS.len())];
            p.splice(i..i, n.iter().copied());
        }
        6 => {
            // Wrap a span in an array: a struct written positionally.
            let j = rng.random_range(i..=p.len());
            p.insert(j, b']');
            p.insert(i, b'[');
        }
        0 => p[i] = SIGNIFICANT[rng.random_range(0..SIGNIFICANT.len())],
        1 => {
            p.remove(i);
        }
        2 => p.insert(i, SIGNIFICANT[rng.random_range(0..SIGNIFICANT.len())]),
        3 => {
            let j = rng.random_range(i..=p.len().min(i + 24));
            let span = p[i..j].to_vec();
            p.splice(j..j, span);
        }
        _ => {
            let j = rng.random_range(i..=p.len().min(i + 12));
            p.drain(i..j);
        }
    }
    p
}

#[test]
fn random_mutations_get_one_verdict_from_both_decoders() {
    let (session, generation, cases) = corpus();
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    // Only the small cases: the 256 KiB sources add nothing but time.
    let seeds: Vec<&Vec<u8>> = cases
        .iter()
        .map(|c| &c.1)
        .filter(|p| p.len() < 4096)
        .collect();
    let mut payloads = Vec::new();
    for seed in &seeds {
        for _ in 0..MUTATIONS_PER_CASE {
            payloads.push(mutate(&mut rng, seed));
        }
    }
    let python = python_codes(&payloads, &session, &generation);
    assert_eq!(python.len(), payloads.len());
    let mut disagreements = Vec::new();
    for (payload, py) in payloads.iter().zip(&python) {
        let rs = rust_code(payload, &session, &generation);
        if &rs != py {
            disagreements.push(format!(
                "{}: Rust {rs:?}, Python {py:?}",
                String::from_utf8_lossy(payload)
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} mutations disagree, e.g.:\n{}",
        disagreements.len(),
        payloads.len(),
        disagreements
            .iter()
            .take(15)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
