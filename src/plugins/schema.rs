//! The JSON Schemas a package is checked against, compiled into the binary
//! (never fetched): the official Agent Plugins 1.0.0 `plugin.schema.json`
//! and `mcp.schema.json` (copied verbatim from the standard), and npc's own
//! closed schema of a hooks file. Each is compiled once per process.
//! Schema failures become [`Problem`]s with the instance's JSON Pointer and
//! a lowercase message that quotes no instance value at length.

use std::sync::LazyLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde_json::{Value, json};

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

fn compile(schema: &Value) -> Validator {
    jsonschema::draft202012::new(schema).expect("the embedded schemas compile")
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("the embedded schemas are JSON")
}

/// `plugin.json` without `additionalProperties: false` at the top: unknown
/// top-level fields are warnings (§5.2), reported by the caller.
pub static PLUGIN: LazyLock<Validator> = LazyLock::new(|| {
    let mut schema = parse(PLUGIN_SCHEMA);
    schema["additionalProperties"] = Value::Bool(true);
    compile(&schema)
});

/// `mcp.json` with the server entries left open: each entry is checked on
/// its own (§7.2.2), so one bad entry skips only itself.
pub static MCP_DOCUMENT: LazyLock<Validator> = LazyLock::new(|| {
    let mut schema = parse(MCP_SCHEMA);
    schema["properties"]["mcpServers"]["additionalProperties"] = Value::Bool(true);
    compile(&schema)
});

/// One `$defs` variant of the official MCP schema, as its own schema.
fn mcp_variant(def: &str) -> Validator {
    let schema = parse(MCP_SCHEMA);
    compile(&json!({
        "$schema": schema["$schema"],
        "$defs": schema["$defs"],
        "$ref": format!("#/$defs/{def}"),
    }))
}

pub static MCP_STDIO: LazyLock<Validator> = LazyLock::new(|| mcp_variant("stdioServer"));
pub static MCP_STREAMABLE_HTTP: LazyLock<Validator> =
    LazyLock::new(|| mcp_variant("streamableHttpServer"));
pub static MCP_SSE: LazyLock<Validator> = LazyLock::new(|| mcp_variant("sseServer"));

pub static HOOKS: LazyLock<Validator> = LazyLock::new(|| compile(&parse(HOOKS_SCHEMA)));

/// Every failure of `value` against `validator`, as errors of `file`, with
/// pointers under `base` (the instance's place in its document).
pub fn check(validator: &Validator, value: &Value, file: &str, base: &str) -> Vec<Problem> {
    validator
        .iter_errors(value)
        // Reserved `env` names: the callers report them with their own words.
        .filter(|e| !matches!(e.kind(), ValidationErrorKind::PropertyNames { .. }))
        .take(MAX_SCHEMA_ERRORS)
        .map(|e| {
            let pointer = format!("{base}{}", e.instance_path().as_str());
            Problem::error(file, pointer, describe(&e))
        })
        .collect()
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
    use super::*;

    #[test]
    fn the_embedded_schemas_are_the_official_ones_and_compile() {
        let plugin = parse(PLUGIN_SCHEMA);
        assert_eq!(plugin["$id"], super::super::PLUGIN_SCHEMA_URL);
        let mcp = parse(MCP_SCHEMA);
        assert_eq!(mcp["$id"], super::super::MCP_SCHEMA_URL);
        for v in [
            &*PLUGIN,
            &*MCP_DOCUMENT,
            &*MCP_STDIO,
            &*MCP_STREAMABLE_HTTP,
            &*MCP_SSE,
            &*HOOKS,
        ] {
            assert!(!v.is_valid(&json!(42)));
        }
    }

    #[test]
    fn the_name_pattern_keeps_its_lookahead() {
        let doc = |name: &str| json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": name});
        for good in ["a", "review-kit", "a.b", "x9", "a-b.c"] {
            assert!(PLUGIN.is_valid(&doc(good)), "{good}");
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
            assert!(!PLUGIN.is_valid(&doc(bad)), "{bad}");
        }
    }
}
