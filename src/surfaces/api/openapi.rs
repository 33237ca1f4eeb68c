//! The API's OpenAPI 3.1 document, generated from [`super::ROUTES`] and the
//! answer types' JSON Schemas, so it cannot say something the router does
//! not do. `npc schema --openapi` prints it; the committed copy is
//! `schemas/openapi.json` (a test fails when it drifts).

use serde_json::{Map, Value, json};

use super::{ErrorBody, ROUTES};

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for route in &ROUTES {
        let ok = match route.answer {
            Some(schema) => json!({
                "description": "OK",
                "content": { "application/json": { "schema": schema() } },
            }),
            None => json!({
                "description": "An event stream: `id` is the event id, `event` its kind, `data` the event as JSON",
                "content": { "text/event-stream": { "schema": { "type": "string" } } },
            }),
        };
        let parameters: Vec<Value> = route
            .query
            .iter()
            .map(|(name, description)| {
                let schema = if *name == "kind" {
                    json!({ "type": "string" })
                } else {
                    json!({ "type": "integer", "minimum": 0 })
                };
                json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
            })
            .collect();
        let mut responses = Map::new();
        responses.insert("200".into(), ok);
        for (status, why) in [
            ("400", "A malformed query or header"),
            ("401", "A token is configured and the request lacks it"),
            ("403", "The `Host` header is not a trusted name"),
        ] {
            responses.insert(status.into(), error_response(why));
        }
        match route.operation {
            "getPlan" | "apply" | "reload" => {
                responses.insert(
                    "422".into(),
                    error_response(
                        "The manifest on disk is invalid (`detail` has the diagnostics)",
                    ),
                );
                responses.insert(
                    "503".into(),
                    error_response("An operational failure; the daemon retries by itself"),
                );
            }
            "streamEvents" => {
                responses.insert("503".into(), error_response("Too many open streams"));
            }
            _ => {}
        }
        if matches!(route.operation, "apply" | "reload") {
            responses.insert(
                "409".into(),
                error_response("The change cannot be applied while the daemon runs"),
            );
        }
        let operation = json!({
            "operationId": route.operation,
            "summary": route.summary,
            "parameters": parameters,
            "responses": responses,
        });
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
            "description": "The per-repository runtime of `npc daemon`, on loopback. Requests need a trusted `Host` (localhost, 127.0.0.1, [::1]) and, when `daemon.token_env` is set, `Authorization: Bearer <token>`.",
        },
        "servers": [{ "url": "http://127.0.0.1:8766" }],
        "components": {
            "schemas": { "Error": schemars::schema_for!(ErrorBody) },
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
        "security": [{}, { "bearer": [] }],
        "paths": paths,
    })
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
    })
}
