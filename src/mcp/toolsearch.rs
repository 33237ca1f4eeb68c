//! Tool search (`mcp.tools = "search"`): the gateway's `tools/list` offers
//! only [`SEARCH_TOOLS`] and [`CALL_TOOL`], the way Claude Code's and
//! Codex's tool search keep an agent's context small. `search_tools` ranks
//! the tools the caller may call ([`rank`], BM25 over each tool's name,
//! description and input-schema property names and descriptions) and
//! answers the best ones with their full input schemas; `call_tool` is
//! unwrapped by [`super::CallPath`] into a call of the named tool, which
//! then takes the one call path like any other (stages, the profile's
//! tools, events, timeouts).

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{Value, json};

/// The search tool's name.
pub const SEARCH_TOOLS: &str = "search_tools";
/// The call tool's name.
pub const CALL_TOOL: &str = "call_tool";
/// Tools a search answers when the caller names no `limit`.
pub const DEFAULT_SEARCH_LIMIT: usize = 8;
/// Most tools one search answers.
pub const MAX_SEARCH_LIMIT: usize = 50;
/// Longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = 1024;
/// BM25's term-frequency saturation.
const BM25_K1: f64 = 1.2;
/// BM25's length normalisation.
const BM25_B: f64 = 0.75;
/// How much more a term in a tool's name counts than one in its text.
const NAME_WEIGHT: usize = 3;
/// Deepest input-schema nesting whose property names and descriptions are indexed.
const MAX_SCHEMA_DEPTH: usize = 4;
/// Most bytes of one tool's description and schema text that are indexed:
/// an upstream's huge description costs a search no more than this.
pub const MAX_INDEXED_TEXT_BYTES: usize = 16 * 1024;
/// Most properties of one schema object that are indexed.
pub const MAX_INDEXED_PROPERTIES: usize = 256;

/// `search_tools`' arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Words describing what the tool should do (matched against tool names, descriptions and parameters).
    pub query: String,
    /// Most tools to return (default 8, at most 50).
    pub limit: Option<usize>,
}

/// `call_tool`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallArgs {
    /// The tool's name, as `search_tools` returned it.
    pub name: String,
    /// The tool's arguments, per its input schema.
    #[serde(default)]
    pub arguments: Option<JsonObject>,
}

/// The two tools `tools/list` offers in search mode.
pub fn tools() -> Vec<Tool> {
    vec![
        super::builtin::tool::<SearchArgs>(
            SEARCH_TOOLS,
            "Find the tools available here: returns the best matches for the query with their full input schemas. Call one with `call_tool`.",
            ToolAnnotations::new().read_only(true),
        ),
        super::builtin::tool::<CallArgs>(
            CALL_TOOL,
            "Call a tool `search_tools` returned, by its name, with its arguments.",
            ToolAnnotations::new(),
        ),
    ]
}

/// Lowercase words of letters and digits; `snake_case`, `kebab-case` and
/// `camelCase` split into their parts.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && prev_lower && !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = c.is_lowercase() || c.is_ascii_digit();
            word.extend(c.to_lowercase());
        } else {
            prev_lower = false;
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out.into_iter()
}

/// Appends `text` to `out` while `out` stays within [`MAX_INDEXED_TEXT_BYTES`]
/// (cut at a character boundary); false once it is full.
fn push_bounded(out: &mut String, text: &str) -> bool {
    let room = MAX_INDEXED_TEXT_BYTES.saturating_sub(out.len());
    if room == 0 {
        return false;
    }
    out.push(' ');
    let mut end = text.len().min(room.saturating_sub(1));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.push_str(&text[..end]);
    end == text.len()
}

/// Property names and descriptions of an input schema object, down to
/// [`MAX_SCHEMA_DEPTH`], at most [`MAX_INDEXED_PROPERTIES`] per object.
fn schema_text(object: &serde_json::Map<String, Value>, depth: usize, out: &mut String) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    if let Some(Value::String(d)) = object.get("description")
        && !push_bounded(out, d)
    {
        return;
    }
    if let Some(Value::Object(props)) = object.get("properties") {
        for (name, prop) in props.iter().take(MAX_INDEXED_PROPERTIES) {
            if !push_bounded(out, name) {
                return;
            }
            if let Value::Object(prop) = prop {
                schema_text(prop, depth + 1, out);
            }
        }
    }
    if let Some(Value::Object(items)) = object.get("items") {
        schema_text(items, depth + 1, out);
    }
}

/// A tool's terms: its name's ([`NAME_WEIGHT`] times), its description's
/// and its input schema's (together at most [`MAX_INDEXED_TEXT_BYTES`]).
fn terms(tool: &Tool) -> Vec<String> {
    let mut text = String::new();
    push_bounded(&mut text, tool.description.as_deref().unwrap_or(""));
    schema_text(&tool.input_schema, 0, &mut text);
    let name: Vec<String> = words(&tool.name).collect();
    let mut out = Vec::new();
    for _ in 0..NAME_WEIGHT {
        out.extend(name.iter().cloned());
    }
    out.extend(words(&text));
    out
}

/// The indices of `tools` that match `query`, best first (BM25; ties in
/// list order), at most `limit`. A tool matching no term of the query is
/// not returned; an empty query matches every tool in list order.
pub fn rank(tools: &[Tool], query: &str, limit: usize) -> Vec<usize> {
    let query: std::collections::BTreeSet<String> = words(query).collect();
    if query.is_empty() {
        return (0..tools.len().min(limit)).collect();
    }
    let docs: Vec<Vec<String>> = tools.iter().map(terms).collect();
    let n = docs.len() as f64;
    let average = docs.iter().map(Vec::len).sum::<usize>() as f64 / n.max(1.0);
    let mut scores: Vec<(usize, f64)> = Vec::new();
    let frequencies: Vec<std::collections::HashMap<&str, usize>> = docs
        .iter()
        .map(|d| {
            let mut f = std::collections::HashMap::new();
            for t in d {
                *f.entry(t.as_str()).or_insert(0) += 1;
            }
            f
        })
        .collect();
    let idf: Vec<f64> = query
        .iter()
        .map(|q| {
            let with = frequencies
                .iter()
                .filter(|f| f.contains_key(q.as_str()))
                .count() as f64;
            ((n - with + 0.5) / (with + 0.5) + 1.0).ln()
        })
        .collect();
    for (i, (doc, f)) in docs.iter().zip(&frequencies).enumerate() {
        let len = doc.len() as f64;
        let score: f64 = query
            .iter()
            .zip(&idf)
            .map(|(q, idf)| {
                let tf = *f.get(q.as_str()).unwrap_or(&0) as f64;
                idf * tf * (BM25_K1 + 1.0)
                    / (tf + BM25_K1 * (1.0 - BM25_B + BM25_B * len / average.max(1.0)))
            })
            .sum();
        if score > 0.0 {
            scores.push((i, score));
        }
    }
    scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scores.into_iter().take(limit).map(|(i, _)| i).collect()
}

/// `search_tools`' answer: the matching tools with their input schemas.
pub fn answer(tools: &[Tool], found: &[usize], total: usize) -> Value {
    let tools: Vec<Value> = found
        .iter()
        .map(|&i| {
            let t = &tools[i];
            json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": Value::Object((*t.input_schema).clone()),
            })
        })
        .collect();
    json!({ "tools": tools, "searched": total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, schema: Value) -> Tool {
        let Value::Object(schema) = schema else {
            panic!("an object")
        };
        Tool::new(name.to_string(), description.to_string(), schema)
    }

    fn tools() -> Vec<Tool> {
        vec![
            tool(
                "fs__read_file",
                "Read a file's contents",
                json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            ),
            tool(
                "everything__echo",
                "Echoes back the input",
                json!({"type": "object", "properties": {"message": {"type": "string", "description": "Message to echo"}}}),
            ),
            tool(
                "everything__get-sum",
                "Returns the sum of two numbers",
                json!({"type": "object", "properties": {"a": {}, "b": {}}}),
            ),
            tool(
                "web__fetch",
                "Fetch a URL",
                json!({"type": "object", "properties": {"url": {"type": "string", "description": "the address of the web page"}}}),
            ),
        ]
    }

    #[test]
    fn words_split_every_naming_style() {
        let w: Vec<String> = words("get-sum read_file camelCaseName URL2x").collect();
        assert_eq!(
            w,
            [
                "get", "sum", "read", "file", "camel", "case", "name", "url2x"
            ]
        );
    }

    #[test]
    fn ranking_prefers_names_then_descriptions_then_schemas() {
        let t = tools();
        assert_eq!(rank(&t, "echo", 8), [1]);
        assert_eq!(rank(&t, "sum numbers", 8), [2]);
        // Only a schema property's description says "web page".
        assert_eq!(rank(&t, "web page", 8)[0], 3);
        assert_eq!(rank(&t, "file", 8), [0]);
        assert!(rank(&t, "nothing-matches-this", 8).is_empty());
    }

    #[test]
    fn an_empty_query_lists_in_order_and_limits_apply() {
        let t = tools();
        assert_eq!(rank(&t, "", 2), [0, 1]);
        assert_eq!(rank(&t, "  ", 8), [0, 1, 2, 3]);
        assert_eq!(rank(&t, "the", 1).len(), 1);
    }

    #[test]
    fn the_answer_carries_full_input_schemas() {
        let t = tools();
        let a = answer(&t, &[1], 4);
        assert_eq!(a["tools"][0]["name"], "everything__echo");
        assert_eq!(
            a["tools"][0]["inputSchema"]["properties"]["message"]["type"],
            "string"
        );
        assert_eq!(a["searched"], 4);
    }

    #[test]
    fn the_two_tools_have_object_schemas() {
        let t = super::tools();
        assert_eq!(t[0].name, SEARCH_TOOLS);
        assert_eq!(t[1].name, CALL_TOOL);
        for tool in &t {
            assert_eq!(tool.input_schema["type"], "object");
        }
        assert!(t[0].input_schema["properties"]["query"].is_object());
    }

    #[test]
    fn a_tool_s_indexed_text_is_bounded_however_large_its_description_and_schema() {
        let huge = "lorem ".repeat(MAX_INDEXED_TEXT_BYTES);
        let properties: serde_json::Map<String, Value> = (0..10 * MAX_INDEXED_PROPERTIES)
            .map(|i| (format!("p{i}"), json!({"description": huge})))
            .collect();
        let big = tool(
            "big__tool",
            &format!("{huge} ünïcode"),
            json!({"type": "object", "properties": properties}),
        );
        let found = terms(&big);
        let indexed: usize = found.iter().map(String::len).sum();
        assert!(indexed <= MAX_INDEXED_TEXT_BYTES, "{indexed}");
        // The name is always there, and still ranks.
        assert!(found.iter().filter(|t| *t == "big").count() >= NAME_WEIGHT);
        let mut all = tools();
        all.push(big);
        let ranked = rank(&all, "big tool", 3);
        assert_eq!(ranked.first(), Some(&(all.len() - 1)));
    }
}
