// The official TypeScript MCP SDK against recallserve's /mcp (streamable HTTP).
// Usage: node flow.mjs URL KEY_A KEY_B  -> prints one JSON object of what the client saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, keyA, keyB] = process.argv.slice(2);

async function connect(key) {
  const client = new Client({ name: "recallserve-node-check", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  await client.connect(transport);
  return client;
}

const a = await connect(keyA);
const b = await connect(keyB);
const tools = (await a.listTools()).tools.map((t) => t.name);
const added = await a.callTool({
  name: "add_memories",
  arguments: { memories: [{ text: "Node says the harbour code is GULL-12.", source_id: "node:1" }] },
});
const id = added.structuredContent.ids[0];
const mine = await a.callTool({ name: "search_memories", arguments: { query: "harbour code", k: 5, threshold: -1 } });
const theirs = await b.callTool({ name: "search_memories", arguments: { query: "harbour code", k: 5, threshold: -1 } });
const bad = await a.callTool({ name: "search_memories", arguments: { query: "harbour code", k: 0 } });
const server = a.getServerVersion();
console.log(JSON.stringify({
  server,
  tools,
  id,
  mine: mine.structuredContent.data.map((h) => h.id),
  theirs: theirs.structuredContent.data.map((h) => h.id),
  theirsText: JSON.stringify(theirs.content),
  bad: { isError: bad.isError, text: bad.content[0].text },
}));
await a.close();
await b.close();
