//! Regression tests for a hostile repository: everything a repository
//! contains is untrusted input. One test per failure found, named after it,
//! each driving the real `npc` binary. Sections follow the numbered items of
//! the "safe in a hostile repository" issue.

#![allow(unused_imports)]

use crate::support::*;

// ---------------------------------------------------------------------------
// §1. one guarded layer for every file npc touches on a repository's behalf
//
// (tests for §1 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §2. templates cannot hang or exhaust the daemon
//
// (tests for §2 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §3. `npc import` never turns data into configuration
//
// (tests for §3 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §4. the daemon keeps serving and keeps converging
//
// (tests for §4 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §5. no orphans, fast shutdown
//
// (tests for §5 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §6. bounded memory on every input
//
// (tests for §6 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §7. redaction that is exact
//
// (tests for §7 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §8. output and errors a user can act on
//
// (tests for §8 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §10. what the agent CLIs accept
//
// (tests for §10 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------
