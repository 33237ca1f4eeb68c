//! Component fingerprints: a SHA-256 over a component's typed value, fed by
//! the derived `Hash` impls of the model. Two configs have the same
//! fingerprint exactly when they are equal as typed values (secrets
//! included), so a plan can compare what runs with what is declared without
//! keeping secret values anywhere, and without a hand-maintained field list.

use std::hash::{Hash, Hasher};

use sha2::{Digest, Sha256};

/// A [`Hasher`] that feeds SHA-256. Integers are written little-endian so
/// fingerprints are the same on every machine.
#[derive(Default)]
pub struct Sha256Hasher(Sha256);

impl std::fmt::Debug for Sha256Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sha256Hasher")
    }
}

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn write_u8(&mut self, i: u8) {
        self.0.update([i]);
    }
    fn write_u16(&mut self, i: u16) {
        self.0.update(i.to_le_bytes());
    }
    fn write_u32(&mut self, i: u32) {
        self.0.update(i.to_le_bytes());
    }
    fn write_u64(&mut self, i: u64) {
        self.0.update(i.to_le_bytes());
    }
    fn write_usize(&mut self, i: usize) {
        self.0.update((i as u64).to_le_bytes());
    }
    fn write_i64(&mut self, i: i64) {
        self.0.update(i.to_le_bytes());
    }
}

/// The hex SHA-256 fingerprint of `value`.
pub fn fingerprint<T: Hash + ?Sized>(value: &T) -> String {
    let mut hasher = Sha256Hasher::default();
    value.hash(&mut hasher);
    hex::encode(hasher.0.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_equal_fingerprints() {
        assert_eq!(fingerprint(&("a", 1u32)), fingerprint(&("a", 1u32)));
        assert_ne!(fingerprint(&("a", 1u32)), fingerprint(&("a", 2u32)));
        // Length prefixes keep ("ab","c") and ("a","bc") apart.
        assert_ne!(fingerprint(&("ab", "c")), fingerprint(&("a", "bc")));
        assert_eq!(fingerprint("x").len(), 64);
    }
}
