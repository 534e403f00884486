// An agent's turn over gRPC from TypeScript: the user asks, the assistant called a screenshot
// tool, and the tool's output carries the screenshot as an image part. Streams the answer to
// stdout and ends with one JSON line: {"text", "chunks", "usage"}.
//
//   node dist/examples/tool_screenshot.js ENGINE_ADDRESS IMAGE.png SCENARIO.json
//
// SCENARIO.json: {"prompt", "tool": {"name", "description", "parameters_json"},
//                 "call": {"id", "arguments"}, "tool_text", "max_tokens"}
import { readFileSync } from "node:fs";
import { Role, ToolKind, engineClient, generate } from "../src/client.js";

interface Scenario {
  prompt: string;
  tool: { name: string; description: string; parameters_json: string };
  call: { id: string; arguments: string };
  tool_text: string;
  max_tokens: number;
}

async function main(): Promise<void> {
  const [address, imagePath, scenarioPath] = process.argv.slice(2);
  if (!address || !imagePath || !scenarioPath) {
    throw new Error("usage: tool_screenshot ENGINE_ADDRESS IMAGE.png SCENARIO.json");
  }
  const scenario = JSON.parse(readFileSync(scenarioPath, "utf-8")) as Scenario;
  const screenshot = readFileSync(imagePath);
  const client = engineClient(address, { token: process.env.VLMSERVE_ENGINE_TOKEN });
  const streamed = await generate(
    client,
    {
      messages: [
        { role: Role.USER, parts: [{ kind: { case: "text", value: { text: scenario.prompt } } }] },
        {
          role: Role.ASSISTANT,
          toolCalls: [
            { id: scenario.call.id, name: scenario.tool.name, arguments: scenario.call.arguments, kind: ToolKind.FUNCTION },
          ],
        },
        {
          role: Role.TOOL,
          toolOutput: {
            callId: scenario.call.id,
            kind: ToolKind.FUNCTION,
            output: {
              case: "parts",
              value: {
                parts: [
                  { kind: { case: "text", value: { text: scenario.tool_text } } },
                  { kind: { case: "image", value: { data: new Uint8Array(screenshot), mediaType: "image/png" } } },
                ],
              },
            },
          },
        },
      ],
      tools: [{ kind: { case: "function", value: { name: scenario.tool.name, description: scenario.tool.description, parametersJson: scenario.tool.parameters_json } } }],
      sampling: { maxTokens: scenario.max_tokens },
    },
    { onText: (text) => process.stdout.write(text) },
  );
  const usage = streamed.result?.usage;
  process.stdout.write("\n");
  console.log(
    JSON.stringify({
      text: streamed.text,
      chunks: streamed.chunks,
      usage: usage ? { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens, image_count: usage.imageCount } : null,
    }),
  );
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
