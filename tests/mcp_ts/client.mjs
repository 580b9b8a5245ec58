// The official MCP TypeScript SDK's client calling `qbroker mcp` over stdio (tests/workers/test_mcp_ts.py).
// argv: the server's command and arguments; stdin: one JSON array of tool arguments, one call each.
// stdout: one JSON line per call, the result as the SDK returns it, or {protocolError: {code, message}}
// when the SDK throws (it validates structuredContent against the tool's outputSchema, errors too).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { readFileSync } from "node:fs";

const [command, ...args] = process.argv.slice(2);
const calls = JSON.parse(readFileSync(0, "utf8"));
const client = new Client({ name: "ts-sdk-client", version: "1.0.0" });
await client.connect(new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" }));
await client.listTools(); // the client learns the outputSchema it validates results against
for (const argumentsOfCall of calls) {
  try {
    const result = await client.callTool({ name: "ask_user_question", arguments: argumentsOfCall });
    console.log(JSON.stringify(result));
  } catch (error) {
    console.log(JSON.stringify({ protocolError: { code: error.code ?? null, message: String(error.message) } }));
  }
}
await client.close();
