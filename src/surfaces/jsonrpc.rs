//! Newline-delimited JSON-RPC 2.0 framing, for both sides of ACP (`npc
//! acp`, the agent; `providers::acp`, npc's client of the agent CLIs): lines are read by
//! `stdx::lines` (a line over [`MAX_LINE_BYTES`] is skipped without being
//! held, and reported), then classified into a request, a
//! notification or a response ([`Incoming`]), and the error frames a bad
//! line gets. Nothing here panics or waits on a peer's goodwill: every
//! malformed frame becomes an [`Incoming::Invalid`] answered with a
//! JSON-RPC error.

use serde_json::{Value, json};

/// Longest frame read from a peer (prompts may embed file contents).
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Longest method name echoed back in an error.
pub const MAX_QUOTED_METHOD_CHARS: usize = 64;

/// JSON-RPC error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP's "resource not found" (an unknown session).
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// npc: a bound was reached (too many requests in flight, sessions, …).
pub const BUSY: i64 = -32000;

/// What one frame is.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// The peer's answer to one of npc's requests.
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
    /// Not a JSON-RPC message: answer with `error` (to `id`, `null` when unknown).
    Invalid {
        id: Value,
        error: Value,
    },
    /// Blank line: ignored.
    Empty,
}

/// Classify one frame.
pub fn classify(bytes: &[u8]) -> Incoming {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Incoming::Empty;
    }
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return Incoming::Invalid {
                id: Value::Null,
                error: error(PARSE_ERROR, &format!("the frame is not JSON: {e}")),
            };
        }
    };
    let Value::Object(mut map) = value else {
        return Incoming::Invalid {
            id: Value::Null,
            error: error(
                INVALID_REQUEST,
                "the frame is not a JSON-RPC object (batches are not supported)",
            ),
        };
    };
    let id = map.remove("id");
    let valid_id = |id: &Option<Value>| {
        matches!(
            id,
            None | Some(Value::Null | Value::Number(_) | Value::String(_))
        )
    };
    if map.get("jsonrpc") != Some(&Value::String("2.0".into())) || !valid_id(&id) {
        let echo = if valid_id(&id) { id } else { None };
        return Incoming::Invalid {
            id: echo.unwrap_or(Value::Null),
            error: error(
                INVALID_REQUEST,
                "not a JSON-RPC 2.0 message: `jsonrpc` must be \"2.0\" and `id` a number or string",
            ),
        };
    }
    let params = map.remove("params").unwrap_or(Value::Null);
    match (map.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Incoming::Request { id, method, params },
        (Some(Value::String(method)), None) => Incoming::Notification { method, params },
        (Some(_), id) => Incoming::Invalid {
            id: id.unwrap_or(Value::Null),
            error: error(INVALID_REQUEST, "`method` must be a string"),
        },
        (None, Some(id)) => match (map.remove("result"), map.remove("error")) {
            (Some(result), None) => Incoming::Response {
                id,
                outcome: Ok(result),
            },
            (None, Some(err)) => Incoming::Response {
                id,
                outcome: Err(err),
            },
            _ => Incoming::Invalid {
                id,
                error: error(
                    INVALID_REQUEST,
                    "a response needs exactly one of `result` and `error`",
                ),
            },
        },
        (None, None) => Incoming::Invalid {
            id: Value::Null,
            error: error(INVALID_REQUEST, "a message needs a `method` or an `id`"),
        },
    }
}

/// A JSON-RPC error object.
pub fn error(code: i64, message: &str) -> Value {
    json!({ "code": code, "message": message })
}

/// The error of an unknown method (its name clipped).
pub fn method_not_found(method: &str) -> Value {
    let clipped: String = method.chars().take(MAX_QUOTED_METHOD_CHARS).collect();
    error(
        METHOD_NOT_FOUND,
        &format!("`{clipped}` is not a method npc serves here"),
    )
}

/// A response frame.
pub fn response(id: Value, outcome: Result<Value, Value>) -> Value {
    match outcome {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
    }
}

/// A request or notification frame (`id` `None` for a notification).
pub fn message(id: Option<i64>, method: &str, params: Value) -> Value {
    match id {
        Some(id) => json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
        None => json!({ "jsonrpc": "2.0", "method": method, "params": params }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classified_and_bad_ones_get_errors() {
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#),
            Incoming::Request {
                id: json!(1),
                method: "initialize".into(),
                params: json!({})
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#),
            Incoming::Notification {
                method: "session/cancel".into(),
                params: json!({"sessionId":"s"})
            }
        );
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":"7","result":{"a":1}}"#),
            Incoming::Response {
                id: json!("7"),
                outcome: Ok(json!({"a":1}))
            }
        );
        assert_eq!(classify(b"  "), Incoming::Empty);
        let code = |i: Incoming| match i {
            Incoming::Invalid { error, .. } => error["code"].as_i64().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(code(classify(b"{not json")), PARSE_ERROR);
        assert_eq!(code(classify(b"[1,2]")), INVALID_REQUEST);
        assert_eq!(code(classify(br#"{"id":1,"method":"x"}"#)), INVALID_REQUEST);
        assert_eq!(
            code(classify(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#)),
            INVALID_REQUEST
        );
        assert_eq!(
            code(classify(br#"{"jsonrpc":"2.0","id":1,"method":5}"#)),
            INVALID_REQUEST
        );
        assert_eq!(
            code(classify(br#"{"jsonrpc":"2.0","id":1}"#)),
            INVALID_REQUEST
        );
        assert_eq!(code(classify(br#"{"jsonrpc":"2.0"}"#)), INVALID_REQUEST);
        // The id of an invalid request is echoed when it is usable.
        match classify(br#"{"jsonrpc":"1.0","id":3,"method":"x"}"#) {
            Incoming::Invalid { id, .. } => assert_eq!(id, json!(3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_method_is_quoted_clipped() {
        let e = method_not_found(&"m".repeat(1000));
        assert_eq!(e["code"], METHOD_NOT_FOUND);
        assert!(e["message"].as_str().unwrap().len() < 200);
    }
}
