//! `npc plugin init`: the files of a new package, as the Orcacode scaffolds
//! lay them out: `plugin.json` and `mcp.json` with the canonical 1.0.0
//! `$schema`s and one stdio server, an empty tracked `skills/`, an empty
//! hooks file in npc's namespace folder, and the server's source and test.
//! Python (≥ 3.11, the MCP Python SDK) runs `python3 -m MODULE.server` with
//! `PYTHONPATH=${PLUGIN_ROOT}/src`; TypeScript (Node ≥ 20, the 1.x
//! TypeScript SDK) runs `node ${PLUGIN_ROOT}/dist/server.mjs` after
//! `npm install && npm run build`. Only text is produced here; the CLI
//! writes it, refusing a non-empty target.

use serde_json::json;

use super::{HOOKS_FILE, MCP_SCHEMA_URL, NPC_NAMESPACE, PLUGIN_SCHEMA_URL};

/// The language of the scaffolded MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    TypeScript,
}

/// One file to write: path relative to the package root, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub text: String,
}

/// Whether `name` is a valid Agent Plugins name (§5.5).
pub fn valid_name(name: &str) -> bool {
    super::schema::Schema::Plugin.is_valid(&json!({"$schema": PLUGIN_SCHEMA_URL, "name": name}))
}

fn fill(template: &str, name: &str, module: &str, setup: &str) -> String {
    template
        .replace("{{name}}", name)
        .replace("{{module}}", module)
        .replace("{{setup}}", setup)
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).expect("JSON") + "\n"
}

/// The files of package `name` (which must be [`valid_name`]).
pub fn files(name: &str, language: Language) -> Vec<File> {
    let module = name.replace(['-', '.'], "_");
    let file = |path: &str, text: String| File {
        path: path.to_string(),
        text,
    };
    let server = match language {
        Language::Python => json!({
            "type": "stdio",
            "command": "python3",
            "args": ["-m", format!("{module}.server")],
            "env": {"PYTHONPATH": "${PLUGIN_ROOT}/src"}
        }),
        Language::TypeScript => json!({
            "type": "stdio",
            "command": "node",
            "args": ["${PLUGIN_ROOT}/dist/server.mjs"]
        }),
    };
    let mut out = vec![
        file(
            super::MANIFEST_FILE,
            pretty(&json!({
                "$schema": PLUGIN_SCHEMA_URL,
                "name": name,
                "version": "0.1.0",
                "description": format!("The {name} plugin"),
            })),
        ),
        file(
            super::MCP_FILE,
            pretty(&json!({"$schema": MCP_SCHEMA_URL, "mcpServers": {name: server}})),
        ),
        file("skills/.gitkeep", String::new()),
        file(
            &format!("{NPC_NAMESPACE}/{HOOKS_FILE}"),
            pretty(&json!({"version": 1, "hooks": {}})),
        ),
    ];
    match language {
        Language::Python => {
            let setup = "\nSetup: Python 3.11 or newer with the MCP Python SDK (`uv sync` or\n`pip install -e .`); run the tests with `pytest`.\n";
            out.extend([
                file(
                    "pyproject.toml",
                    fill(include_str!("scaffold/pyproject.toml"), name, &module, ""),
                ),
                file(
                    "README.md",
                    fill(include_str!("scaffold/README.md"), name, &module, setup),
                ),
                file(".gitignore", "__pycache__/\n.venv/\n*.egg-info/\n".into()),
                file(&format!("src/{module}/__init__.py"), String::new()),
                file(
                    &format!("src/{module}/server.py"),
                    fill(include_str!("scaffold/python_server.py"), name, &module, ""),
                ),
                file(
                    "tests/test_server.py",
                    fill(include_str!("scaffold/python_test.py"), name, &module, ""),
                ),
            ]);
        }
        Language::TypeScript => {
            let setup = "\nSetup: Node 20 or newer; `npm install`, `npm test`, then `npm run build`\n(which writes `dist/server.mjs`, the file `mcp.json` starts).\n";
            out.extend([
                file(
                    "package.json",
                    fill(include_str!("scaffold/package.json"), name, &module, ""),
                ),
                file(
                    "tsconfig.json",
                    include_str!("scaffold/tsconfig.json").into(),
                ),
                file(
                    "README.md",
                    fill(include_str!("scaffold/README.md"), name, &module, setup),
                ),
                file(".gitignore", "node_modules/\ndist/\n".into()),
                file(
                    "src/index.ts",
                    fill(include_str!("scaffold/index.ts"), name, &module, ""),
                ),
                file(
                    "test/server.test.ts",
                    include_str!("scaffold/server.test.ts").into(),
                ),
            ]);
        }
    }
    out
}
