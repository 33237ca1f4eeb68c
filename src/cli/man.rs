//! `npc man [--out DIR]`: the man pages, generated — `npc(1)` and one
//! `npc-SUBCOMMAND(1)` per subcommand (nested ones too) from the clap
//! definitions with `clap_mangen`, and `npcagent.toml(5)` from the
//! manifest's JSON Schema. The committed copies live in `man/`; a test
//! fails when they drift (`cargo run -- man --out man` regenerates them).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::CommandFactory as _;
use serde_json::Value;

use super::{Cli, Exit};

/// One page: its path under the output directory (`man1/npc.1`) and text.
pub type Page = (PathBuf, Vec<u8>);

/// Every page, in a stable order.
pub fn pages() -> anyhow::Result<Vec<Page>> {
    let mut out = Vec::new();
    let mut root = Cli::command();
    root.build();
    command_pages(&root, "npc", &mut out)?;
    out.push((
        PathBuf::from("man5/npcagent.toml.5"),
        manifest_page().into_bytes(),
    ));
    Ok(out)
}

fn command_pages(cmd: &clap::Command, name: &str, out: &mut Vec<Page>) -> anyhow::Result<()> {
    let cmd = cmd.clone().name(name.to_string());
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .section("1")
        .source(format!("npc {}", env!("CARGO_PKG_VERSION")))
        .manual("npc manual")
        .render(&mut text)
        .context("rendering a man page")?;
    out.push((PathBuf::from(format!("man1/{name}.1")), text));
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        command_pages(sub, &format!("{name}-{}", sub.get_name()), out)?;
    }
    Ok(())
}

/// Text safe in a roff paragraph: backslashes escaped, no line starting
/// with a control character.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e")
        .lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The schema a property points at (following one `$ref`).
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    let reference = node["$ref"].as_str().or_else(|| {
        node["anyOf"]
            .as_array()
            .and_then(|v| v.iter().find_map(|s| s["$ref"].as_str()))
    });
    match reference.and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => &schema["$defs"][name],
        None => node,
    }
}

fn type_of(schema: &Value, node: &Value) -> String {
    let node = resolve(schema, node);
    if let Some(t) = node["type"].as_str() {
        return t.to_string();
    }
    if let Some(ts) = node["type"].as_array() {
        let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
        return names.join(" or ");
    }
    if node["properties"].is_object() {
        return "table".into();
    }
    "value".into()
}

/// `npcagent.toml(5)`: every top-level section and the keys one level in.
pub fn manifest_page() -> String {
    let schema = crate::model::json_schema();
    let mut page = String::new();
    page.push_str(&format!(
        ".TH NPCAGENT.TOML 5 \"\" \"npc {}\" \"npc manual\"\n",
        env!("CARGO_PKG_VERSION")
    ));
    page.push_str(".SH NAME\nnpcagent.toml \\- the npc manifest of a repository\n");
    page.push_str(
        ".SH SYNOPSIS\n\\fBnpcagent.toml\\fR or \\fBnpcagent.json\\fR at the repository's root\n",
    );
    page.push_str(".SH DESCRIPTION\n");
    page.push_str(&roff(schema["description"].as_str().unwrap_or_default()));
    page.push_str("\n.PP\nCheck it with \\fBnpc validate\\fR(1); the JSON Schema is printed by \\fBnpc schema\\fR.\n");
    page.push_str(".SH SECTIONS\n");
    let empty = serde_json::Map::new();
    let top = schema["properties"].as_object().unwrap_or(&empty);
    for (key, node) in top {
        if key == "$schema" {
            continue;
        }
        page.push_str(&format!(".SS {}\n", roff(key)));
        if let Some(d) = node["description"].as_str() {
            page.push_str(&roff(d));
            page.push('\n');
        }
        let mut target = resolve(&schema, node);
        // A map of named entries: describe one entry.
        if let Some(entry) = target.get("additionalProperties").filter(|v| v.is_object()) {
            page.push_str(&format!(".PP\nEach \\fB{}.NAME\\fR entry:\n", roff(key)));
            target = resolve(&schema, entry);
        }
        if let Some(props) = target["properties"].as_object() {
            for (name, prop) in props {
                page.push_str(&format!(
                    ".TP\n\\fB{}\\fR (\\fI{}\\fR)\n",
                    roff(name),
                    type_of(&schema, prop)
                ));
                let description = prop["description"]
                    .as_str()
                    .or_else(|| resolve(&schema, prop)["description"].as_str())
                    .unwrap_or("");
                page.push_str(&roff(description));
                page.push('\n');
            }
        }
    }
    page.push_str(".SH SEE ALSO\n\\fBnpc\\fR(1), \\fBnpc-validate\\fR(1), \\fBnpc-schema\\fR(1)\n");
    page
}

/// Write every page under `out` (`man1/`, `man5/`), or list them.
pub fn run(out: Option<&Path>) -> anyhow::Result<Exit> {
    let pages = pages()?;
    match out {
        Some(dir) => {
            for (path, text) in &pages {
                let path = dir.join(path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create `{}`", parent.display()))?;
                }
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write `{}`", path.display()))?;
            }
            errln!(
                "wrote {} pages under `{}`; add it to MANPATH, or copy man1/ and man5/ into ~/.local/share/man",
                pages.len(),
                dir.display()
            );
        }
        None => {
            for (path, _) in &pages {
                outln!("{}", path.display())?;
            }
        }
    }
    Ok(Exit::Ok)
}
