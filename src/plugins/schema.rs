//! The JSON Schemas a package is checked against, compiled into the binary
//! (never fetched): the official Agent Plugins 1.0.0 `plugin.schema.json`
//! and `mcp.schema.json` (copied verbatim from the standard), and npc's own
//! closed schema of a hooks file, each turned into a validator when npc is
//! built ([`Schema`]).
//! Schema failures become [`Problem`]s with the instance's JSON Pointer and
//! a lowercase message that quotes no instance value at length.

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ErrorIterator, ValidationError};
use serde_json::Value;

use super::Problem;
use crate::model::diagnostics::clip;

/// The official plugin manifest schema (Agent Plugins 1.0.0).
pub const PLUGIN_SCHEMA: &str = include_str!("schemas/plugin.schema.json");
/// The official MCP configuration schema (Agent Plugins 1.0.0).
pub const MCP_SCHEMA: &str = include_str!("schemas/mcp.schema.json");
/// npc's schema of a hooks file (`{"version":1,"hooks":{…}}`, closed).
pub const HOOKS_SCHEMA: &str = include_str!("schemas/hooks.schema.json");

/// Most schema errors reported per document.
pub const MAX_SCHEMA_ERRORS: usize = 64;

/// Where the schemas npc checks with live, relative to the crate root: the
/// official files as they are, and under `derived/` the views the checks
/// need, written from them (a test keeps the two in step).
pub const SCHEMA_DIR: &str = "src/plugins/schemas";

// The validators are generated at build time from the files (the
// `jsonschema` crate's `validator` macro): compiling a schema at run time,
// with the meta-schema check that comes first, cost about a millisecond of
// every `npc validate` and `npc hook run`.

/// `plugin.json` without `additionalProperties: false` at the top: unknown
/// top-level fields are warnings (§5.2), reported by the caller. Its `name`
/// has no `pattern`: [`is_plugin_name`] checks it in code (a property test
/// holds the two to the official pattern), since compiling the pattern's
/// lookahead with fancy-regex cost about as many instructions as the whole
/// of `npc --version`, in every process that loads a plugin package.
#[jsonschema::validator(path = "src/plugins/schemas/derived/plugin.open.json", draft = Draft202012)]
struct PluginOpen;

/// `mcp.json` with the server entries left open: each entry is checked on
/// its own (§7.2.2), so one bad entry skips only itself.
#[jsonschema::validator(path = "src/plugins/schemas/derived/mcp.document.json", draft = Draft202012)]
struct McpDocument;

/// One `$defs` variant of the official MCP schema, as its own schema.
#[jsonschema::validator(path = "src/plugins/schemas/derived/mcp.stdio.json", draft = Draft202012)]
struct McpStdio;

#[jsonschema::validator(path = "src/plugins/schemas/derived/mcp.streamable-http.json", draft = Draft202012)]
struct McpStreamableHttp;

#[jsonschema::validator(path = "src/plugins/schemas/derived/mcp.sse.json", draft = Draft202012)]
struct McpSse;

#[jsonschema::validator(path = "src/plugins/schemas/hooks.schema.json", draft = Draft202012)]
struct Hooks;

/// The official `name` pattern of `plugin.json`, as its errors quote it.
pub const PLUGIN_NAME_PATTERN: &str = r"^(?!.*(?:--|\.\.))[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?$";

/// Whether `name` matches [`PLUGIN_NAME_PATTERN`]: lowercase ASCII letters,
/// digits, `.` and `-`, starting and ending with a letter or digit, with no
/// `--` and no `..`.
pub fn is_plugin_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) if alnum(first) && alnum(last) => {}
        _ => return false,
    }
    bytes.iter().all(|b| alnum(b) || *b == b'.' || *b == b'-')
        && !bytes.windows(2).any(|w| w == b"--" || w == b"..")
}

/// The plugin `name` error the schema's pattern stood for, if any.
fn plugin_name_problem(value: &Value, file: &str, base: &str) -> Option<Problem> {
    let name = value.get("name")?.as_str()?;
    (!is_plugin_name(name)).then(|| {
        Problem::error(
            file,
            format!("{base}/name"),
            format!("does not match the pattern `{}`", clip(PLUGIN_NAME_PATTERN)),
        )
    })
}

/// A schema a package document is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// `plugin.json`, unknown top-level fields allowed.
    Plugin,
    /// `mcp.json` as a whole, entries open.
    McpDocument,
    /// One `stdio` server entry.
    McpStdio,
    /// One `streamable-http` server entry.
    McpStreamableHttp,
    /// One `sse` server entry.
    McpSse,
    /// npc's hooks file.
    Hooks,
}

impl Schema {
    /// Every schema, for tests.
    pub const ALL: [Schema; 6] = [
        Self::Plugin,
        Self::McpDocument,
        Self::McpStdio,
        Self::McpStreamableHttp,
        Self::McpSse,
        Self::Hooks,
    ];

    /// Does `value` pass?
    pub fn is_valid(self, value: &Value) -> bool {
        match self {
            Self::Plugin => {
                PluginOpen::is_valid(value) && plugin_name_problem(value, "", "").is_none()
            }
            Self::McpDocument => McpDocument::is_valid(value),
            Self::McpStdio => McpStdio::is_valid(value),
            Self::McpStreamableHttp => McpStreamableHttp::is_valid(value),
            Self::McpSse => McpSse::is_valid(value),
            Self::Hooks => Hooks::is_valid(value),
        }
    }

    fn iter_errors(self, value: &Value) -> ErrorIterator<'_> {
        match self {
            Self::Plugin => PluginOpen::iter_errors(value),
            Self::McpDocument => McpDocument::iter_errors(value),
            Self::McpStdio => McpStdio::iter_errors(value),
            Self::McpStreamableHttp => McpStreamableHttp::iter_errors(value),
            Self::McpSse => McpSse::iter_errors(value),
            Self::Hooks => Hooks::iter_errors(value),
        }
    }
}

/// Every failure of `value` against `schema`, as errors of `file`, with
/// pointers under `base` (the instance's place in its document).
pub fn check(schema: Schema, value: &Value, file: &str, base: &str) -> Vec<Problem> {
    let mut problems: Vec<Problem> = schema
        .iter_errors(value)
        // Reserved `env` names: the callers report them with their own words.
        .filter(|e| {
            !matches!(e.kind(), ValidationErrorKind::PropertyNames { .. })
                && !e.schema_path().as_str().contains("/propertyNames")
        })
        .take(MAX_SCHEMA_ERRORS)
        .map(|e| {
            let pointer = format!("{base}{}", e.instance_path().as_str());
            Problem::error(file, pointer, describe(&e))
        })
        .collect();
    if schema == Schema::Plugin && problems.len() < MAX_SCHEMA_ERRORS {
        problems.extend(plugin_name_problem(value, file, base));
    }
    problems
}

/// A lowercase message for one schema failure.
fn describe(e: &ValidationError<'_>) -> String {
    match e.kind() {
        ValidationErrorKind::Required { property } => {
            format!("`{}` is required", property.as_str().unwrap_or("?"))
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let names: Vec<String> = unexpected
                .iter()
                .take(8)
                .map(|n| format!("`{}`", clip(n)))
                .collect();
            format!("unknown field {}", names.join(", "))
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("must be `{}`", clip(&expected_value.to_string()))
        }
        ValidationErrorKind::Pattern { .. } if e.instance_path().as_str().ends_with("/cwd") => {
            "must start with `./`, `${PLUGIN_ROOT}` or `${PLUGIN_DATA}`".to_string()
        }
        ValidationErrorKind::Pattern { pattern } => {
            format!("does not match the pattern `{}`", clip(pattern))
        }
        ValidationErrorKind::Type { kind } => format!("must be of type {}", type_name(kind)),
        ValidationErrorKind::MinLength { limit } => {
            format!(
                "must be at least {limit} character{}",
                if *limit == 1 { "" } else { "s" }
            )
        }
        ValidationErrorKind::MaxLength { limit } => format!("must be at most {limit} characters"),
        ValidationErrorKind::Minimum { limit } => format!("must be at least {limit}"),
        ValidationErrorKind::Maximum { limit } => format!("must be at most {limit}"),
        ValidationErrorKind::Enum { options } => {
            format!("must be one of {}", clip(&options.to_string()))
        }
        _ => {
            let text = e.masked().to_string();
            let mut chars = text.chars();
            match chars.next() {
                Some(c) => c.to_lowercase().chain(chars).collect(),
                None => text,
            }
        }
    }
}

fn type_name(kind: &jsonschema::error::TypeKind) -> String {
    match kind {
        jsonschema::error::TypeKind::Single(t) => t.to_string(),
        jsonschema::error::TypeKind::Multiple(ts) => {
            let names: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
            names.join(" or ")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).expect("the embedded schemas are JSON")
    }

    proptest::proptest! {
        /// The checks in code accept exactly the names the official
        /// schema does.
        #[test]
        fn the_name_check_is_the_official_pattern(
            name in "[a-z0-9.\\-_A\n\u{e9}\u{2028}]{0,70}"
        ) {
            let mut opened = parse(PLUGIN_SCHEMA);
            opened["additionalProperties"] = Value::Bool(true);
            let official = jsonschema::draft202012::new(&opened).expect("compiles");
            let doc = json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": name});
            proptest::prop_assert_eq!(Schema::Plugin.is_valid(&doc), official.is_valid(&doc), "{:?}", name);
        }
    }

    fn derived(name: &str) -> Value {
        let path = format!("{}/{SCHEMA_DIR}/derived/{name}", env!("CARGO_MANIFEST_DIR"));
        parse(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
    }

    /// The derived views are the official schemas with exactly the changes
    /// their docs name, so the build-time validators check what the
    /// standard says.
    #[test]
    fn the_derived_schemas_are_the_official_ones_opened_where_documented() {
        let mut plugin = parse(PLUGIN_SCHEMA);
        assert_eq!(plugin["$id"], super::super::PLUGIN_SCHEMA_URL);
        plugin["additionalProperties"] = Value::Bool(true);
        assert_eq!(plugin["properties"]["name"]["pattern"], PLUGIN_NAME_PATTERN);
        plugin["properties"]["name"]
            .as_object_mut()
            .expect("an object")
            .remove("pattern");
        assert_eq!(derived("plugin.open.json"), plugin);
        let official = parse(MCP_SCHEMA);
        assert_eq!(official["$id"], super::super::MCP_SCHEMA_URL);
        let mut document = official.clone();
        document["properties"]["mcpServers"]["additionalProperties"] = Value::Bool(true);
        assert_eq!(derived("mcp.document.json"), document);
        for (def, file) in [
            ("stdioServer", "mcp.stdio.json"),
            ("streamableHttpServer", "mcp.streamable-http.json"),
            ("sseServer", "mcp.sse.json"),
        ] {
            let variant = json!({
                "$schema": official["$schema"],
                "$defs": official["$defs"],
                "$ref": format!("#/$defs/{def}"),
            });
            assert_eq!(derived(file), variant, "{file}");
        }
    }

    /// The generated validators agree with ones compiled at run time from
    /// the same documents.
    #[test]
    fn build_time_validators_agree_with_run_time_ones() {
        let runtime = |v: &Value| jsonschema::draft202012::new(v).expect("compiles");
        let pairs = [
            (Schema::Plugin, derived("plugin.open.json")),
            (Schema::McpDocument, derived("mcp.document.json")),
            (Schema::McpStdio, derived("mcp.stdio.json")),
            (
                Schema::McpStreamableHttp,
                derived("mcp.streamable-http.json"),
            ),
            (Schema::McpSse, derived("mcp.sse.json")),
            (Schema::Hooks, parse(HOOKS_SCHEMA)),
        ];
        let samples = [
            json!(42),
            json!({}),
            json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": "a", "version": "1.0.0"}),
            json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": "A b", "version": "x"}),
            json!({"mcpServers": {"a": {"command": "x"}}}),
            json!({"type": "stdio", "command": "x", "args": ["a"]}),
            json!({"type": "stdio", "command": "x", "env": {"PLUGIN_DATA": "y"}}),
            json!({"type": "streamable-http", "url": "https://example.com/mcp"}),
            json!({"type": "sse", "url": 3}),
            json!({"version": 1, "hooks": {}}),
        ];
        for (schema, document) in &pairs {
            let live = runtime(document);
            for sample in &samples {
                let expect: Vec<String> = live.iter_errors(sample).map(|e| e.to_string()).collect();
                let got: Vec<String> = schema.iter_errors(sample).map(|e| e.to_string()).collect();
                assert_eq!(got, expect, "{schema:?} on {sample}");
                let name_ok =
                    *schema != Schema::Plugin || plugin_name_problem(sample, "", "").is_none();
                assert_eq!(schema.is_valid(sample), expect.is_empty() && name_ok);
            }
        }
    }

    #[test]
    fn a_bad_name_is_one_problem_quoting_the_official_pattern() {
        let doc =
            json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": "a--b", "version": "1.0.0"});
        let problems = check(Schema::Plugin, &doc, "plugin.json", "");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].pointer, "/name");
        assert!(
            problems[0].message.contains(PLUGIN_NAME_PATTERN),
            "{problems:?}"
        );
    }

    #[test]
    fn the_name_pattern_keeps_its_lookahead() {
        let doc = |name: &str| json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": name});
        for good in ["a", "review-kit", "a.b", "x9", "a-b.c"] {
            assert!(Schema::Plugin.is_valid(&doc(good)), "{good}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a--b",
            "a..b",
            ".a",
            "a_b",
            &"a".repeat(65),
        ] {
            assert!(!Schema::Plugin.is_valid(&doc(bad)), "{bad}");
        }
    }
}
