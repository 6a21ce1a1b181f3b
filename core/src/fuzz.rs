//! Entry points for the fuzzers (`fuzz/`), also replayed over the committed corpus by
//! `cargo test` (`tests/tests/fuzz_corpus.rs`). Each takes arbitrary bytes and must
//! neither panic nor allocate without bound; each asserts a property that must hold for
//! every input.

use crate::access::{check_issue, AccessTokenInfo, Principal};

/// An access-token request body (`AccessTokenInfo` JSON), checked for issue by the root
/// token. Whatever parses writes back as JSON that parses to the same token, and an
/// issuable token's principal never sees more than its scope allows.
pub fn token_scope(data: &[u8]) {
    let Ok(mut info) = serde_json::from_slice::<AccessTokenInfo>(data) else {
        return;
    };
    let written = serde_json::to_vec(&info).expect("a token always serializes");
    let reread: AccessTokenInfo =
        serde_json::from_slice(&written).expect("a written token parses again");
    assert_eq!(reread, info, "a token survives a JSON round trip");
    if check_issue(&Principal::root(), &mut info).is_ok() {
        let principal = Principal::new(&info);
        for name in ["", "a", "tenant-7/orders", "\u{0}", "zzzz"] {
            if principal.sees_basin(name) {
                assert!(
                    principal
                        .scope()
                        .basins
                        .as_ref()
                        .is_some_and(|set| set.matches(name)),
                    "a principal sees only basins its scope matches"
                );
            }
        }
    }
}
