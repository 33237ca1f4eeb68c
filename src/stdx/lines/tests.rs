//! Tests of the bounded line reader: every policy, chunk boundaries,
//! CRLF, blank lines, the end of input, and a property test against a
//! plain split.

use super::*;
use proptest::prelude::*;

fn split(s: Splitter, chunks: &[&[u8]]) -> Vec<Line> {
    let mut s = s;
    let mut out = Vec::new();
    for c in chunks {
        s.feed(c, |p| out.push(p.to_owned()));
    }
    if let Some(p) = s.finish() {
        out.push(p.to_owned());
    }
    out
}

fn line(s: &str) -> Line {
    Line::Line(s.as_bytes().to_vec())
}

#[test]
fn lines_split_across_chunks_with_crlf_trimmed_when_asked() {
    let chunks: &[&[u8]] = &[b"ab", b"c\r\nde\n", b"f"];
    assert_eq!(
        split(Splitter::new(100, Overlong::Skip).trim_cr(), chunks),
        [line("abc"), line("de"), line("f")]
    );
    assert_eq!(
        split(Splitter::new(100, Overlong::Skip), chunks),
        [line("abc\r"), line("de"), line("f")]
    );
}

#[test]
fn an_overlong_line_is_skipped_whole_and_reported_with_its_length() {
    let long = "x".repeat(40);
    let input = format!("a\n\n  \n{long}\nb\n{long}{long}\nc");
    assert_eq!(
        split(
            Splitter::new(32, Overlong::Skip).skip_blank(),
            &[input.as_bytes()]
        ),
        [
            line("a"),
            Line::TooLong { bytes: 40 },
            line("b"),
            Line::TooLong { bytes: 80 },
            line("c"),
        ]
    );
    // Exactly the bound is a line; blank lines come back unless skipped.
    let exact = "y".repeat(32);
    assert_eq!(
        split(
            Splitter::new(32, Overlong::Skip),
            &[format!("{exact}\n\n{long}").as_bytes()]
        ),
        [line(&exact), line(""), Line::TooLong { bytes: 40 }]
    );
}

#[test]
fn a_stopping_splitter_reports_at_the_bound_and_truncation_keeps_the_head() {
    let mut s = Splitter::new(8, Overlong::Stop);
    let (used, piece) = s.push(b"0123456789 and more");
    assert_eq!(piece, Some(Piece::TooLong { bytes: 19 }));
    assert_eq!(used, 19);
    let long = format!("{}\r\nok\r\n", "z".repeat(20));
    assert_eq!(
        split(
            Splitter::new(8, Overlong::Truncate).trim_cr(),
            &[&long.as_bytes()[..5], &long.as_bytes()[5..]]
        ),
        [Line::Truncated(b"zzzzzzzz".to_vec()), line("ok")]
    );
    assert_eq!(
        split(Splitter::new(4, Overlong::Truncate), &[b"abcdefg"]),
        [Line::Truncated(b"abcd".to_vec())]
    );
}

#[tokio::test]
async fn the_reader_is_cancel_safe_and_stops_at_the_bound_of_an_endless_line() {
    let (mut peer, read) = tokio::io::duplex(1024);
    let mut reader = LineReader::new(read, Splitter::new(32, Overlong::Stop));
    tokio::io::AsyncWriteExt::write_all(&mut peer, b"ok\npart")
        .await
        .unwrap();
    assert_eq!(reader.next().await.unwrap(), Some(line("ok")));
    // A read cancelled mid-line loses nothing.
    let waited = tokio::time::timeout(std::time::Duration::from_millis(20), reader.next()).await;
    assert!(waited.is_err());
    tokio::io::AsyncWriteExt::write_all(&mut peer, b"ial\n")
        .await
        .unwrap();
    assert_eq!(reader.next().await.unwrap(), Some(line("partial")));
    // The line never ends and the peer stays: reported at the bound.
    for _ in 0..2 {
        tokio::io::AsyncWriteExt::write_all(&mut peer, &[b'x'; 20])
            .await
            .unwrap();
    }
    assert!(matches!(
        reader.next().await.unwrap(),
        Some(Line::TooLong { .. })
    ));
    drop(peer);
}

async fn read_all(input: &[u8], limit: usize) -> Vec<Line> {
    // A tiny buffer so long lines span many fills.
    let mut r = LineReader::with_capacity(7, input, Splitter::new(limit, Overlong::Skip));
    let mut out = Vec::new();
    while let Some(line) = r.next().await.unwrap() {
        out.push(line);
    }
    out
}

#[tokio::test]
async fn a_reader_over_a_small_buffer_bounds_lines_and_skips_a_long_one_whole() {
    let mut input = b"abc\n".to_vec();
    input.extend(vec![b'x'; 50]);
    input.extend(b"\nlast");
    assert_eq!(
        read_all(&input, 10).await,
        [line("abc"), Line::TooLong { bytes: 50 }, line("last")]
    );
    assert_eq!(read_all(b"0123456789\n", 10).await, [line("0123456789")]);
    assert_eq!(
        read_all(b"0123456789x", 10).await,
        [Line::TooLong { bytes: 11 }]
    );
    assert!(read_all(b"", 10).await.is_empty());
}

#[test]
fn frames_are_one_json_line() {
    let frame = encode(&serde_json::json!({"a": "x\ny"})).unwrap();
    assert_eq!(frame, b"{\"a\":\"x\\ny\"}\n");
}

#[test]
fn an_oversized_line_is_reported_and_the_next_line_survives() {
    let s = || Splitter::new(4, Overlong::Skip).trim_cr();
    assert_eq!(
        split(s(), &[b"12", b"345", b"678\nok\n"]),
        [Line::TooLong { bytes: 8 }, line("ok")]
    );
    assert_eq!(split(s(), &[b"123456789"]), [Line::TooLong { bytes: 9 }]);
    assert_eq!(split(s(), &[b"1234\n"]), [line("1234")]);
}

proptest! {
    /// Over any bytes and a small bound, where a chunk ends changes nothing.
    #[test]
    fn one_cut_anywhere_changes_nothing(data in proptest::collection::vec(any::<u8>(), 0..400), cut in 0usize..400) {
        let cut = cut.min(data.len());
        let s = || Splitter::new(64, Overlong::Skip).trim_cr();
        prop_assert_eq!(split(s(), &[&data]), split(s(), &[&data[..cut], &data[cut..]]));
        let t = || Splitter::new(64, Overlong::Truncate);
        prop_assert_eq!(split(t(), &[&data]), split(t(), &[&data[..cut], &data[cut..]]));
    }

    /// Under the bound, any chunking gives the lines `split('\n')` gives.
    #[test]
    fn chunking_never_changes_the_lines(text in "[a-c\n]{0,200}", cuts in proptest::collection::vec(0usize..200, 0..8)) {
        let bytes = text.as_bytes();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in cuts {
            chunks.push(&bytes[at..c]);
            at = c;
        }
        chunks.push(&bytes[at..]);
        let got = split(Splitter::new(1000, Overlong::Skip), &chunks);
        let mut want: Vec<Line> = text.split('\n').map(line).collect();
        if text.ends_with('\n') || text.is_empty() {
            want.pop();
        }
        prop_assert_eq!(got, want);
    }
}
