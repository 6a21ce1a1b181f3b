//! Replays every committed fuzz input (the seed and minimized corpus in `fuzz/corpus/`,
//! and the inputs that once crashed in `fuzz/regressions/`) through the same entry points
//! the fuzzers call, on stable: a regression in any of them fails here.

use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("s2s_frames", streamgate::fuzz::s2s_frames),
    ("rest_bodies", streamgate::fuzz::rest_bodies),
    ("resp_requests", streamgate_resp::fuzz::requests),
    ("resp_entry", streamgate_resp::fuzz::entry_round_trip),
    ("otlp_export", streamgate_otlp::fuzz::export),
    ("token_scope", streamgate_core::fuzz::token_scope),
];

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_committed_fuzz_input_is_handled() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    for (name, target) in TARGETS {
        let corpus = inputs(&fuzz.join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name} holds inputs");
        let regressions = inputs(&fuzz.join("regressions").join(name));
        for input in corpus.iter().chain(&regressions) {
            let data = std::fs::read(input).unwrap();
            // A panic names the input, so it can be replayed under the fuzzer.
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name} failed on {}", input.display());
        }
        eprintln!(
            "{name}: {} corpus inputs, {} regressions",
            corpus.len(),
            regressions.len()
        );
    }
}
