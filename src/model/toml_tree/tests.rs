//! Differential tests: the streaming builder against the toml crate's path
//! (the oracle), on every fixture and example, on edge cases of each TOML
//! rule, at each bound, and on random documents and random edits.

use super::*;
use crate::model::parse::parse_toml_reference;
use crate::model::source::SourceFile;

/// The toml crate's path.
fn reference(text: &str) -> Option<Node> {
    let file = SourceFile::new("t.toml", text);
    parse_toml_reference(&file, &mut Vec::new())
}

/// The builder gives exactly the oracle's tree (compared as `Debug`, so NaN
/// equals NaN), and gives up on every document the oracle refuses.
fn same(text: &str) {
    let built = build(text).ok();
    let expected = reference(text);
    assert_eq!(
        format!("{built:#?}"),
        format!("{expected:#?}"),
        "document:\n{text}"
    );
}

fn valid(text: &str) {
    assert!(reference(text).is_some(), "the oracle refuses:\n{text}");
    same(text);
}

fn invalid(text: &str) {
    assert!(reference(text).is_none(), "the oracle accepts:\n{text}");
    assert!(build(text).is_err(), "the builder accepts:\n{text}");
}

#[test]
fn builder_nodes_are_as_large_as_nodes() {
    assert_eq!(size_of::<BNode>(), size_of::<Node>());
}

fn corpus_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            corpus_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

/// Every TOML file under `fixtures/` and `examples/`, and the starter.
fn corpus() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["fixtures", "examples"] {
        corpus_files(&root.join(dir), &mut files);
    }
    files.push(root.join("src/cli/starter.toml"));
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let text = String::from_utf8(std::fs::read(&p).ok()?).ok()?;
            Some((p.display().to_string(), text))
        })
        .collect()
}

#[test]
fn every_fixture_and_example_builds_the_oracles_tree() {
    let corpus = corpus();
    assert!(corpus.len() > 50, "{}", corpus.len());
    let mut built = 0;
    for (name, text) in &corpus {
        let expected = reference(text);
        let got = build(text).ok();
        assert_eq!(format!("{got:#?}"), format!("{expected:#?}"), "{name}");
        built += usize::from(got.is_some());
    }
    assert!(built > 40, "only {built} built");
}

#[test]
fn dotted_keys_and_headers_follow_the_toml_crate() {
    for text in [
        "",
        "# only a comment\n",
        "a.b.c = 1\na.d = 2\n[x]\ny.z = 1\ny.w = 2\n",
        "[a.b]\nc = 1\n[a]\nd = 2\n",
        "[a.b]\nc = 1\n[z]\n[a]\nd = 2\n",
        "[a.b.c]\n[a]\nb.d = 1\n",
        "[a.b.c]\n[a.b]\nx = 1\n[a]\ny = 2\n",
        "[x.y.z.w]\n[x.y]\n[x]\n[x.y.z]\n",
        "[[a]]\nx = 1\n[[a]]\nx = 2\n[a.b]\ny = 1\n[[a.c]]\n[[a.c]]\nq = 'q'\n",
        "[[fruit]]\nname = \"apple\"\n[fruit.physical]\ncolor = \"red\"\n[[fruit.variety]]\nname = \"x\"\n[[fruit]]\nname = \"banana\"\n[[fruit.variety]]\nname = \"y\"\n",
        "[[a.b]]\n[[a.b]]\n[a]\nc = 1\n",
        "[[x]]\n[x.y]\nk = 1\n[[x]]\n[x.y]\nk = 2\n",
        "[fruit]\napple.color = \"red\"\napple.taste.sweet = true\n[fruit.apple.texture]\nsmooth = true\n",
        "a . b . c = 1\n[ x . y ]\n[[ z . w ]]\n",
        "\"a.b\" = 1\n'c d' = 2\n\"\" = 3\n\"esc\\u00e9\" = 4\n'lit\\' = 5\n",
        "\"ʎǝʞ\" = 1\n\"ключ\".\"ещё\" = 2\n",
        "[\"quoted table\".'x y']\nk = 1\n",
        "a = { b = 1, c.d = 2, e = { f = [1, { g = 3 }] } }\nz = {}\n",
        "a = { x.y.z = 1, x.y.w = 2, x.v = 3 }\n",
        "[t]\nk = [ [1, 2], [\"a\", 'b'], [], [[]], [{}, { a = 1 }] ]\n",
        "arr = [\n  1, # one\n  2,\n  # a comment line\n  3,\n]\n",
        "a = 1\r\nb = 2\r\n[c]\r\nd = 3\r\n",
        "\tindented = 1\n  [  spaced  ]  # comment\n  k  =  'v'  # c\n",
        "no_newline_at_end = 1",
    ] {
        valid(text);
    }
}

#[test]
fn scalars_decode_as_the_toml_crate_does() {
    for text in [
        "s = \"a\\tb\\u00e9\\U0001F600\\\\\\\"\"\n",
        "s = 'c:\\x\\y'\n",
        "s = \"\"\"\nfoo\\\n   bar\n  baz\"\"\"\n",
        "s = '''\nfirst\n  second '' '\n'''\n",
        "s = \"\"\"\"quoted\" \"\"\"\n",
        "s = \"\"\nt = ''\n",
        "b = true\nc = false\n",
        "i = [0x1F, 0o17, 0b101, +5, -0, 0, 1_000, 9223372036854775807, -9223372036854775808, 0xdead_beef]\n",
        "f = [1.5, -0.0, 1e10, 6.626e-34, 1E+2, 1_000.5, 3.14159]\n",
        "f = [inf, -inf, +inf, nan, +nan, -nan]\n",
        "d = [1979-05-27T07:32:00Z, 1979-05-27T00:32:00.999999-07:00, 1979-05-27 07:32:00, 1979-05-27t07:32:00z, 1979-05-27, 07:32:00, 00:32:00.999, 1979-05-27T07:32:00]\n",
    ] {
        valid(text);
    }
    // Spec 1.1 forms and out-of-range numbers, whichever way the toml crate
    // takes them.
    for text in [
        "s = \"\\e\\x41\"\n",
        "t = 07:32\n",
        "d = 1979-05-27T07:32Z\n",
        "a = {\n  b = 1,\n  c = 2,\n}\n",
        "clé = 1\n",
        "\u{FEFF}a = 1\n[b]\nc = 2\n",
        "s = \"\"\"\r\nline\r\n\"\"\"\r\n",
        "i = 9223372036854775808\n",
        "f = 1e400\n",
        "a = 0x\n",
    ] {
        same(text);
    }
}

#[test]
fn every_redefinition_and_syntax_error_is_refused_by_both() {
    for text in [
        "a = 1\na = 2\n",
        "[a]\n[a]\n",
        "[a]\nb = 1\n[a]\nc = 2\n",
        "a.b = 1\n[a]\n",
        "a.b = 1\n[a.b]\n",
        "a = {}\n[a]\n",
        "a = {}\na.b = 1\n",
        "a = { b = 1 }\n[a.c]\n",
        "a = []\n[[a]]\n",
        "[[a]]\n[a]\n",
        "a = 1\na.b = 2\n",
        "a = { b.c = 1, b = 2 }\n",
        "a = { b = { c = 1 }, b.d = 2 }\n",
        "a = { b = 1, b = 2 }\n",
        "[a.b]\nc = 1\n[a]\nb = 2\n",
        "[a]\nb.c = 1\n[a.b]\n",
        "[a.b.c]\n[a]\nb.d = 1\n[a.b]\n",
        "[x.a.b.c]\n[x.a]\nb.d = 1\n[x.a.b]\n",
        "[a]\nx = 1\n[a.x]\n",
        "[a]\nx = 1\n[[a.x]]\n",
        "x = [1]\n[x.y]\n",
        "[t]\nk = 1\n[t.k.l]\n",
        "a = 1\n\"a\" = 2\n",
        "a = 1\n'a' = 2\n",
        "a = \n",
        "a = 1 b = 2\n",
        "[a\n",
        "a = [1, 2\nb = 3\n",
        "a = \"\\q\"\n",
        "a = 1979-13-45\n",
        "= 1\n",
        "a.b. = 1\n",
        "[[a]\n",
        "]\n",
        "a = { b = 1\n",
        "a = { b = 1 }}\n",
        "a = 1 # comment with \u{7} bell\n",
    ] {
        invalid(text);
    }
}

#[test]
fn bounds_make_the_builder_give_up() {
    let long = "x".repeat(MAX_STRING_BYTES + 1);
    let many = vec!["1"; MAX_ARRAY_LEN + 1].join(",");
    let tables = "[[a]]\n".repeat(MAX_ARRAY_LEN + 1);
    let entries: String = (0..=MAX_TABLE_ENTRIES)
        .map(|i| format!("k{i} = 1\n"))
        .collect();
    let deep = format!("a = {}1{}\n", "[".repeat(70), "]".repeat(70));
    let deep_keys = format!("{} = 1\n", vec!["k"; 70].join("."));
    let deep_header = format!("[{}]\n", vec!["k"; 70].join("."));
    for text in [
        format!("s = \"{long}\"\n"),
        format!("\"{long}\" = 1\n"),
        format!("a = [{many}]\n"),
        tables,
        entries,
        deep,
        deep_keys,
        deep_header,
    ] {
        assert!(build(&text).is_err(), "{}", &text[..40.min(text.len())]);
        assert!(reference(&text).is_none());
    }
    // Just within each bound: built, and the same tree.
    let at = vec!["1"; MAX_ARRAY_LEN].join(",");
    valid(&format!("a = [{at}]\n"));
    valid(&"[[a]]\n".repeat(MAX_ARRAY_LEN));
    valid(&format!("{} = 1\n", vec!["k"; MAX_NESTING_DEPTH].join(".")));
    valid(&format!("s = \"{}\"\n", "x".repeat(MAX_STRING_BYTES)));
}

#[test]
fn large_documents_cross_chunks_and_the_index() {
    let mut text = String::from("version = 1\n");
    for i in 0..1500 {
        text.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\n  \"--n\",\n  \"{i}\",\n]\nenv = {{ A = \"b\", B.c = 'd' }}\n[triggers.t{i}.x]\n[triggers.t{i}]\nkind = \"cron\"\n"
        ));
    }
    for i in 0..300 {
        text.push_str(&format!("[[hooks.h]]\nk = {i}\n[hooks.h.sub]\nv = {i}.5\n"));
    }
    assert!(text.len() > 100_000);
    valid(&text);
    // A redefinition at the very end is still found.
    let mut again = text.clone();
    again.push_str("[mcp.servers.s7]\n");
    invalid(&again);
    // So is a key repeated far apart in one indexed table.
    let mut keys: String = (0..3000).map(|i| format!("k{i} = {i}\n")).collect();
    valid(&keys);
    keys.push_str("k5 = 0\n");
    invalid(&keys);
}

/// A tiny deterministic generator (xorshift), so the test needs no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

fn random_document(rng: &mut Rng) -> String {
    const KEYS: &[&str] = &[
        "a", "b", "c", "\"a\"", "'b'", "a.b", "b.c", "a.b.c", "c.a", "\"x.y\"", "b.a", "a.c",
        "c.b.a",
    ];
    const VALUES: &[&str] = &[
        "1",
        "\"s\"",
        "true",
        "1.5",
        "[]",
        "[1, 2]",
        "{}",
        "{ a = 1 }",
        "{ a.b = 1, c = 2 }",
        "{ b = { c = 1 } }",
        "[{ a = 1 }, { b = 2 }]",
        "1979-05-27",
        "nan",
        "0x10",
        "[[1], []]",
    ];
    let mut text = String::new();
    for _ in 0..(1 + rng.next() % 8) {
        let line = match rng.next() % 4 {
            0 => format!("[{}]\n", rng.pick(KEYS)),
            1 => format!("[[{}]]\n", rng.pick(KEYS)),
            _ => format!("{} = {}\n", rng.pick(KEYS), rng.pick(VALUES)),
        };
        text.push_str(&line);
    }
    text
}

/// Random small documents (most with redefinitions) and random one-byte
/// edits of the corpus: the builder never accepts what the toml crate
/// refuses, and builds the same tree for everything it accepts.
#[test]
fn random_documents_agree_with_the_oracle() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut valid_docs = 0;
    let rounds = 4000;
    for _ in 0..rounds {
        let text = random_document(&mut rng);
        same(&text);
        valid_docs += usize::from(reference(&text).is_some());
    }
    // The generator reaches both sides.
    assert!(
        valid_docs > rounds / 20 && valid_docs < rounds * 19 / 20,
        "{valid_docs} of {rounds} valid"
    );
    const EDITS: &[&str] = &[
        "[", "]", "{", "}", "=", ".", ",", "\"", "'", "\n", "#", " ", "a", "1",
    ];
    for (_, text) in corpus() {
        for _ in 0..30 {
            let mut edited = text.clone();
            let mut at = (rng.next() % (edited.len() as u64 + 1)) as usize;
            while !edited.is_char_boundary(at) {
                at -= 1;
            }
            if rng.next().is_multiple_of(2) && at < edited.len() {
                edited.remove(at);
            } else {
                edited.insert_str(at, rng.pick(EDITS));
            }
            same(&edited);
        }
    }
}

/// The toml crate's own errors of `text`: message and span.
fn oracle_errors(text: &str) -> Vec<TomlError> {
    toml::de::DeTable::parse_recoverable(text)
        .1
        .into_iter()
        .map(|e| TomlError::new(e.message(), e.span().unwrap_or(0..0)))
        .collect()
}

fn builder_errors(text: &str) -> Vec<TomlError> {
    match build(text) {
        Ok(_) => Vec::new(),
        Err(failure) => failure.errors,
    }
}

/// Whether the toml crate finds a syntax error (one the parser reports,
/// before any semantic error) in `text`.
fn has_syntax_error(text: &str) -> bool {
    let mut found = false;
    let source = Source::new(text);
    let tokens = source.lex().into_vec();
    let mut events = Vec::new();
    let mut whitespace = ValidateWhitespace::new(&mut events, source);
    let mut guard = RecursionGuard::new(&mut whitespace, PARSER_RECURSION_LIMIT);
    toml_parser::parser::parse_document(&tokens, &mut guard, &mut |_: ParseError| found = true);
    found
}

/// Compare the builder's errors with the toml crate's on one document:
/// both find errors or neither; the first error is at the same place with
/// the same message; a document with only semantic errors gets exactly
/// toml's list. Returns whether the lists are identical.
fn same_errors(text: &str) -> bool {
    let expected = oracle_errors(text);
    let got = builder_errors(text);
    assert_eq!(
        got.is_empty(),
        expected.is_empty(),
        "document:\n{text}\nbuilder: {got:#?}\ntoml: {expected:#?}"
    );
    if let (Some(g), Some(e)) = (got.first(), expected.first()) {
        assert_eq!(
            g, e,
            "first error of:\n{text}\nall: {got:#?}\ntoml: {expected:#?}"
        );
    }
    if !has_syntax_error(text) {
        assert_eq!(got, expected, "semantic errors of:\n{text}");
    }
    got == expected
}

#[test]
fn every_error_class_is_reported_as_toml_reports_it() {
    for text in [
        "a = 1\na = 2\n",
        "[a]\n[a]\n",
        "[a]\nb = 1\n[a]\nc = 2\nb = 3\n",
        "a.b = 1\n[a]\n",
        "a.b = 1\n[a.b]\n",
        "a = {}\n[a]\nb = 1\n[a.c]\n",
        "a = {}\na.b = 1\n",
        "a = { b = 1 }\n[a.c]\n",
        "a = []\n[[a]]\nb = 1\nb = 2\n[c]\n",
        "[[a]]\n[a]\n",
        "a = 1\na.b = 2\n",
        "a = { b.c = 1, b = 2 }\n",
        "a = { b = { c = 1 }, b.d = 2 }\n",
        "a = { b = 1, b = 2 }\n",
        "a = { b = 1, b.c = 2 }\n",
        "[a.b]\nc = 1\n[a]\nb = 2\n",
        "[a]\nb.c = 1\n[a.b]\n",
        "[a.b.c]\n[a]\nb.d = 1\n[a.b]\n",
        "[a]\nx = 1\n[a.x]\ny = 1\ny = 2\n",
        "[a]\nx = 1\n[[a.x]]\n",
        "x = [1]\n[x.y]\n",
        "x = [1]\nx.y = 2\n",
        "[t]\nk = 1\n[t.k.l]\n",
        "a = 1\n\"a\" = 2\n'a' = 3\n",
        "a = \"\\q\"\nb = 1\nb = 2\n",
        "a = 1979-13-45\n",
        "a = 1\na = 2\nb = 1\nb = 2\n[c]\n[c]\n",
        // Syntax errors: the first is toml's; later ones may differ.
        "a = \n",
        "a = 1 b = 2\n",
        "[a\n",
        "a = [1, 2\nb = 3\n",
        "= 1\n",
        "a.b. = 1\n",
        "[[a]\n",
        "]\n",
        "a = { b = 1\n",
        "a = { b = 1 }}\n",
        "a = 1 # comment with \u{7} bell\n",
        "a = \nb = = 2\nc = [\n",
    ] {
        same_errors(text);
    }
}

/// Random small documents with redefinitions, and random edits of the
/// corpus (most with syntax errors): the builder's first error is toml's,
/// and its whole list is toml's whenever the parser finds no syntax error.
#[test]
fn random_errors_agree_with_the_oracle() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut identical = 0;
    let mut with_errors = 0;
    for _ in 0..4000 {
        let text = random_document(&mut rng);
        with_errors += usize::from(!oracle_errors(&text).is_empty());
        identical += usize::from(same_errors(&text));
    }
    assert!(with_errors > 1000, "{with_errors} documents with errors");
    assert_eq!(identical, 4000);
    const EDITS: &[&str] = &["[", "]", "{", "}", "=", ".", ",", "\"", "\n", "a", "1"];
    for (_, text) in corpus() {
        for _ in 0..10 {
            let mut edited = text.clone();
            let mut at = (rng.next() % (edited.len() as u64 + 1)) as usize;
            while !edited.is_char_boundary(at) {
                at -= 1;
            }
            edited.insert_str(at, rng.pick(EDITS));
            same_errors(&edited);
        }
    }
}

/// Errors stop at one past the diagnostics cap, however many there are.
#[test]
fn errors_are_bounded() {
    let text = "a = 1\n".repeat(MAX_DIAGNOSTICS * 3);
    assert_eq!(builder_errors(&text).len(), MAX_DIAGNOSTICS + 1);
    let text = "a = = 1\n".repeat(MAX_DIAGNOSTICS * 3);
    assert_eq!(builder_errors(&text).len(), MAX_DIAGNOSTICS + 1);
}

/// Arrays and inline tables with long runs of whitespace, blank lines,
/// comments (some with invalid characters) and commas between their items:
/// the thinned-out trivia builds the oracle's tree and finds its first
/// error, and the tokens kept stay few.
#[test]
fn trivia_inside_brackets_is_thinned_without_changing_the_result() {
    const TRIVIA: &[&str] = &[
        " ",
        "\t",
        "\n",
        "\r\n",
        "# c\n",
        "#\n",
        ",",
        "# \u{7}\n",
        "\r",
    ];
    const ITEMS: &[&str] = &["1", "\"s\"", "[]", "{}", "[1 ,\n 2]", "{ a = 1 }"];
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let gap = |rng: &mut Rng| -> String { (0..rng.next() % 6).map(|_| rng.pick(TRIVIA)).collect() };
    for _ in 0..3000 {
        let mut text = String::from("a = [");
        for _ in 0..(rng.next() % 5) {
            text.push_str(&gap(&mut rng));
            text.push_str(rng.pick(ITEMS));
            text.push_str(&gap(&mut rng));
            if !rng.next().is_multiple_of(4) {
                text.push(',');
            }
        }
        text.push_str(&gap(&mut rng));
        text.push_str("]\nb = { x = 1");
        text.push_str(&gap(&mut rng));
        text.push_str("}\n");
        same(&text);
        same_errors(&text);
    }
    // Megabytes of blank lines and comments inside one array: few tokens.
    valid("a = [1,\n# c\n \n2]\n");
    let long = format!("a = [1,{}2]\n", "\n # c\n\t\n".repeat(100_000));
    assert!(built_tokens(&long) < 20, "{}", built_tokens(&long));
    valid(&long);
}

/// Tokens the builder keeps of `text` (all in one chunk when it is one
/// bracketed value).
fn built_tokens(text: &str) -> usize {
    let source = Source::new(text);
    let mut run = TriviaRun::default();
    let mut depth = 0usize;
    let mut last = None;
    let mut kept = 0;
    for token in source.lex() {
        if depth > 0
            && TriviaRun::is_trivia(token.kind())
            && !run.keep(token.kind(), last == Some(TokenKind::Comment))
        {
            continue;
        }
        if !TriviaRun::is_trivia(token.kind()) {
            run = TriviaRun::default();
        }
        match token.kind() {
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => depth -= 1,
            _ => {}
        }
        last = Some(token.kind());
        kept += 1;
    }
    kept
}
