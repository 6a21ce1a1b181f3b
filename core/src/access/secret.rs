//! Token secrets: 256 random bits from the operating system, shown once when issued,
//! stored only as their SHA-256 digest, and compared in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What every generated secret starts with, so leaked tokens are easy to scan for.
const SECRET_PREFIX: &str = "sgt_";

/// Shortest secret `--root-token` accepts: shorter ones could be guessed.
pub const MIN_SECRET_LEN: usize = 24;

/// A new random secret.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    let mut secret = String::with_capacity(SECRET_PREFIX.len() + 64);
    secret.push_str(SECRET_PREFIX);
    for byte in bytes {
        secret.push_str(&format!("{byte:02x}"));
    }
    secret
}

/// The digest stored in place of a secret, and the key tokens are looked up by.
pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether `secret` is the one `stored` is the digest of, in time independent of
/// where they differ.
pub fn verify(secret: &str, stored: &[u8]) -> bool {
    digest(secret)[..].ct_eq(stored).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_verify_only_against_their_digest() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert!(a.starts_with("sgt_") && a.len() == 4 + 64);
        let stored = digest(&a);
        assert!(verify(&a, &stored));
        assert!(!verify(&b, &stored));
        assert!(!verify(&a, &stored[..31]));
        // The digest is not the secret.
        assert!(!a.as_bytes().windows(32).any(|w| w == stored));
    }
}
