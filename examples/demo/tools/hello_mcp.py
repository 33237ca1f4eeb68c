#!/usr/bin/env python3
"""A tiny MCP server for the npc demo: stdio, newline-delimited JSON-RPC,
Python's standard library only (nothing from the network).

Tools: `hello` (greets a name) and `add` (adds two numbers).
"""

import json
import sys

PROTOCOL_VERSION = "2025-06-18"
TOOLS = [
    {
        "name": "hello",
        "description": "Greet someone by name",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "add",
        "description": "Add two numbers",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
]


def result(request_id, value):
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id, code, message):
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def text(value, is_error=False):
    return {"content": [{"type": "text", "text": value}], "isError": is_error}


def call(params):
    name = params.get("name")
    args = params.get("arguments") or {}
    if name == "hello":
        return text(f"hello, {args.get('name', 'world')}")
    if name == "add":
        try:
            return text(str(float(args["a"]) + float(args["b"])))
        except (KeyError, TypeError, ValueError):
            return text("`add` needs two numbers, `a` and `b`", is_error=True)
    return text(f"no tool `{name}`", is_error=True)


def answer(message):
    method = message.get("method")
    request_id = message.get("id")
    if request_id is None:
        return None  # a notification
    if method == "initialize":
        return result(request_id, {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "npc-demo-hello", "version": "1.0.0"},
        })
    if method == "ping":
        return result(request_id, {})
    if method == "tools/list":
        return result(request_id, {"tools": TOOLS})
    if method == "tools/call":
        return result(request_id, call(message.get("params") or {}))
    return error(request_id, -32601, f"method not found: {method}")


def main():
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            print(json.dumps(error(None, -32700, "parse error")), flush=True)
            continue
        reply = answer(message) if isinstance(message, dict) else None
        if reply is not None:
            print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
