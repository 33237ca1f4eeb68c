//! The API's OpenAPI 3.1 document, generated from [`super::ROUTES`] and the
//! answer types' JSON Schemas, so it cannot say something the router does
//! not do. The committed copy is `schemas/openapi.json` (a test fails when
//! it drifts); the binary serves and prints that copy ([`DOCUMENT_TEXT`]),
//! which keeps the generating code out of it.

use serde_json::{Map, Value, json};

use super::{ErrorBody, In, ROUTES};

/// `schemas/openapi.json` as committed: what `npc schema --openapi` prints
/// and `GET /api/v1/openapi.json` answers.
pub const DOCUMENT_TEXT: &str = include_str!("../../schemas/openapi.json");

/// The document, generated (what [`DOCUMENT_TEXT`] must equal).
pub fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let ok = match (route.answer, route.status) {
            (Some(schema), _) => json!({
                "description": "OK",
                "content": { "application/json": { "schema": schema() } },
            }),
            (None, 101) => json!({
                "description": "Switching Protocols: the WebSocket (subprotocol `npc.v1`)",
            }),
            (None, _) => json!({
                "description": "An event stream: `id` is the event id, `event` its kind, `data` the event as JSON",
                "content": { "text/event-stream": { "schema": { "type": "string" } } },
            }),
        };
        let parameters: Vec<Value> = route
            .params
            .iter()
            .map(|p| {
                let schema = if p.kind == "integer" {
                    json!({ "type": "integer", "minimum": 0 })
                } else {
                    json!({ "type": "string" })
                };
                let location = match p.location {
                    In::Path => "path",
                    In::Query => "query",
                };
                json!({
                    "name": p.name,
                    "in": location,
                    "required": p.location == In::Path,
                    "description": p.description,
                    "schema": schema,
                })
            })
            .collect();
        let mut responses = Map::new();
        responses.insert(route.status.to_string(), ok);
        for (status, why) in [
            (400, "A malformed query, path, header or body"),
            (
                401,
                "The request carries neither the bearer token nor the dashboard's session cookie",
            ),
            (
                403,
                "The `Host` header is not a trusted name, or a request that changes state (or opens a terminal) comes from another page's `Origin`",
            ),
        ]
        .iter()
        .chain(route.errors)
        {
            let entry = responses
                .entry(status.to_string())
                .or_insert_with(|| error_response(""));
            let text = entry["description"].as_str().unwrap_or_default();
            entry["description"] = if text.is_empty() {
                json!(why)
            } else {
                json!(format!("{text}; {why}"))
            };
        }
        let mut operation = json!({
            "operationId": route.operation,
            "summary": route.summary,
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(body) = route.body {
            operation["requestBody"] = json!({
                "required": !route.body_optional,
                "content": { "application/json": { "schema": body() } },
            });
        }
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[route.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "npc daemon API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The per-repository runtime of `npc daemon`, on loopback. Requests need a trusted `Host` (localhost, 127.0.0.1, [::1]); a credential: `Authorization: Bearer <token>` (the repository's token in `STATE_DIR/api.token`, or the one `daemon.token_env` names) or the dashboard's session cookie (`POST /api/v1/session` with the one-time code `npc dashboard` prints), unless `daemon.auth = \"none\"`; a `Content-Type: application/json` on any body; and, for a request that changes state, no `Origin` (or `Sec-Fetch-Site`) of another page.",
        },
        "servers": [{ "url": "http://127.0.0.1:8766" }],
        "components": {
            "schemas": { "Error": super::schema_of::<ErrorBody>() },
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer" },
                "session": { "type": "apiKey", "in": "cookie", "name": super::auth::SESSION_COOKIE },
            },
        },
        "security": [{ "bearer": [] }, { "session": [] }],
        "paths": paths,
    })
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
    })
}
