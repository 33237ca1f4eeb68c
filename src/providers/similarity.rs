//! A faithful port of Python's `difflib.SequenceMatcher` (isjunk `None`),
//! the similarity the seed's capture-diff detector uses: the same
//! `b2j` index, the same "popular element" heuristic (`autojunk`, on by
//! default: when `b` has at least [`AUTOJUNK_MIN_LEN`] elements, every
//! element occurring more than `len(b) / 100 + 1` times is dropped from the
//! index, so it can only join a match by extension), the same
//! `find_longest_match` tie-breaking (earliest in `a`, then in `b`) and
//! extension loops, the same queue order in `get_matching_blocks`, and
//! `ratio = 2.0 * M / T`. Strings are compared by Unicode scalar values, as
//! Python iterates a `str`. A test runs Python's own difflib on thousands of
//! generated inputs and requires the same matching blocks and bit-identical
//! ratios.

use std::collections::HashMap;
use std::hash::Hash;

/// `b` lengths from which `autojunk` drops popular elements (difflib's 200).
pub const AUTOJUNK_MIN_LEN: usize = 200;

/// One matching block `a[a..a + size] == b[b..b + size]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Match {
    pub a: usize,
    pub b: usize,
    pub size: usize,
}

/// `difflib.SequenceMatcher(None, a, b, autojunk)` over two slices.
#[derive(Debug)]
pub struct SequenceMatcher<'s, T> {
    a: &'s [T],
    b: &'s [T],
    /// Positions of each element of `b` that is not popular, ascending.
    b2j: HashMap<&'s T, Vec<usize>>,
}

impl<'s, T: Eq + Hash> SequenceMatcher<'s, T> {
    /// A matcher with difflib's default `autojunk=True`.
    pub fn new(a: &'s [T], b: &'s [T]) -> Self {
        Self::with_autojunk(a, b, true)
    }

    /// A matcher with an explicit `autojunk` (difflib's keyword argument).
    pub fn with_autojunk(a: &'s [T], b: &'s [T], autojunk: bool) -> Self {
        let mut b2j: HashMap<&T, Vec<usize>> = HashMap::new();
        for (j, item) in b.iter().enumerate() {
            b2j.entry(item).or_default().push(j);
        }
        if autojunk && b.len() >= AUTOJUNK_MIN_LEN {
            let ntest = b.len() / 100 + 1;
            b2j.retain(|_, positions| positions.len() <= ntest);
        }
        Self { a, b, b2j }
    }

    /// difflib's `find_longest_match(alo, ahi, blo, bhi)`. Without junk
    /// elements (isjunk is `None`) its two "suck up junk" loops never run,
    /// so only the first pair of extension loops is needed.
    pub fn find_longest_match(&self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Match {
        let (a, b) = (self.a, self.b);
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0);
        let mut j2len: HashMap<usize, usize> = HashMap::new();
        let mut newj2len: HashMap<usize, usize> = HashMap::new();
        for (i, item) in a.iter().enumerate().take(ahi).skip(alo) {
            newj2len.clear();
            if let Some(js) = self.b2j.get(item) {
                for &j in js {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let prev = j.checked_sub(1).and_then(|p| j2len.get(&p)).copied();
                    let k = prev.unwrap_or(0) + 1;
                    newj2len.insert(j, k);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            std::mem::swap(&mut j2len, &mut newj2len);
        }
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi
            && bestj + bestsize < bhi
            && a[besti + bestsize] == b[bestj + bestsize]
        {
            bestsize += 1;
        }
        Match {
            a: besti,
            b: bestj,
            size: bestsize,
        }
    }

    /// difflib's `get_matching_blocks()`: sorted, adjacent blocks merged,
    /// ending with the sentinel `(len(a), len(b), 0)`.
    pub fn matching_blocks(&self) -> Vec<Match> {
        let (la, lb) = (self.a.len(), self.b.len());
        let mut queue = vec![(0, la, 0, lb)];
        let mut blocks = Vec::new();
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let m = self.find_longest_match(alo, ahi, blo, bhi);
            if m.size == 0 {
                continue;
            }
            blocks.push(m);
            if alo < m.a && blo < m.b {
                queue.push((alo, m.a, blo, m.b));
            }
            if m.a + m.size < ahi && m.b + m.size < bhi {
                queue.push((m.a + m.size, ahi, m.b + m.size, bhi));
            }
        }
        blocks.sort_unstable();
        let mut merged: Vec<Match> = Vec::with_capacity(blocks.len() + 1);
        for m in blocks {
            match merged.last_mut() {
                Some(last) if last.a + last.size == m.a && last.b + last.size == m.b => {
                    last.size += m.size;
                }
                _ => merged.push(m),
            }
        }
        merged.push(Match {
            a: la,
            b: lb,
            size: 0,
        });
        merged
    }

    /// Elements in matching blocks (`M`).
    pub fn matches(&self) -> usize {
        self.matching_blocks().iter().map(|m| m.size).sum()
    }

    /// difflib's `ratio()`: `2.0 * M / T`, 1.0 for two empty sequences.
    pub fn ratio(&self) -> f64 {
        let total = self.a.len() + self.b.len();
        if total == 0 {
            return 1.0;
        }
        2.0 * self.matches() as f64 / total as f64
    }
}

/// `SequenceMatcher(None, a, b).ratio()` over two sequences (default
/// autojunk).
pub fn similarity<T: Eq + Hash>(a: &[T], b: &[T]) -> f64 {
    SequenceMatcher::new(a, b).ratio()
}

/// `SequenceMatcher(None, a, b).ratio()` over two strings, compared by
/// Unicode scalar values as Python compares `str`s.
pub fn str_similarity(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    similarity(&a, &b)
}

#[cfg(test)]
mod tests;
