"""MCP server of the {{name}} plugin (stdio). Diagnostics go to stderr; stdout is the protocol."""

try:  # MCP Python SDK 1.x
    from mcp.server.fastmcp import FastMCP
except ImportError:  # 2.x renamed it
    from mcp.server.mcpserver import MCPServer as FastMCP

mcp = FastMCP("{{name}}")


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def main() -> None:
    mcp.run()


if __name__ == "__main__":
    main()
