//! The user-level plugin registry (filled in below).
