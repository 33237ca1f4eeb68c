// MCP server of the {{name}} plugin (stdio). Diagnostics go to stderr; stdout is the protocol.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

export function echo(text: string): string {
  return text;
}

export function createServer(): McpServer {
  const server = new McpServer({ name: "{{name}}", version: "0.1.0" });
  server.tool("echo", "Return the text unchanged.", { text: z.string() }, async ({ text }) => ({
    content: [{ type: "text", text: echo(text) }],
  }));
  return server;
}

// Under Vitest the module is imported for its functions only.
if (!process.env.VITEST) {
  await createServer().connect(new StdioServerTransport());
}
