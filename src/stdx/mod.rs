//! Small extensions of the standard library (and tokio's IO) that every
//! room may use: poison-tolerant locks ([`lock`], [`read`], [`write`]),
//! kernel randomness for secrets ([`random_hex`]), bounded line reading
//! ([`lines`]) and what may reach a terminal ([`term`]: the one sanitizer
//! of untrusted text, and the OSC 52 filter of a pane's byte stream). A
//! leaf: it depends on nothing in the crate (the way
//! rust-analyzer's `stdx` does), so any room can stand on it.
//!
//! Architecture invariant: nothing here knows npc's rooms, files or
//! formats; it depends only on std, tokio and serde_json.

pub mod lines;
pub mod term;

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `mutex`, taking over the data of a holder that panicked: npc's
/// shared state stays consistent at every await point, so a panic in one
/// task never makes the state of others unreachable.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`lock`] for reading an `RwLock`.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`lock`] for writing an `RwLock`.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `bytes` random bytes from the kernel (`/dev/urandom`), as lowercase hex:
/// secrets (tokens, one-time codes, session ids).
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex(&buf))
}

/// `bytes` as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_hex_is_hex_of_the_length_asked_and_never_repeats() {
        let (a, b) = (random_hex(32).unwrap(), random_hex(32).unwrap());
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }

    #[test]
    fn a_poisoned_lock_still_hands_out_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
