// The pinned Vercel AI SDK's Anthropic provider (npm `ai` + `@ai-sdk/anthropic`, package.json) as a
// real client of the facade's POST /v1/messages.
//
//   node tests/vercel/ai_sdk_anthropic_client.mjs BASE_URL CASE PNG PROMPT
//
// CASE: `image-tool` (generateText: the screenshot tool's result is the PNG, as image content) or
// `stream` (streamText of a user message holding the PNG). Prints one JSON object on stdout for
// tests/vercel/test_ai_sdk_anthropic.py; any SDK error fails the process with the error on stderr.

import { readFileSync } from "node:fs";

import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, caseName, pngPath, prompt] = process.argv.slice(2);
const anthropic = createAnthropic({ baseURL, apiKey: "x" });
const model = anthropic("default");
const maxOutputTokens = 32;
const png = readFileSync(pngPath);

async function imageTool() {
  let taken = 0;
  const result = await generateText({
    model,
    maxOutputTokens,
    maxRetries: 0,
    prompt,
    tools: {
      screenshot: tool({
        description: "Take a screenshot.",
        inputSchema: z.object({}),
        execute: async () => {
          taken += 1;
          return png.toString("base64");
        },
        // The tool's result as the model sees it: the image itself (a tool_result image block).
        toModelOutput: ({ output }) => ({
          type: "content",
          value: [{ type: "image-data", data: output, mediaType: "image/png" }],
        }),
      }),
    },
    // Step 1 must call the tool (tool_choice any), step 2 answers from its image.
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "auto" }),
    stopWhen: stepCountIs(2),
  });
  return {
    taken,
    text: result.text,
    steps: result.steps.map((step) => ({
      finishReason: step.finishReason,
      toolCalls: step.toolCalls.map((call) => call.toolName),
    })),
    usage: result.totalUsage,
    warnings: result.warnings ?? [],
  };
}

async function stream() {
  const result = streamText({
    model,
    maxOutputTokens,
    maxRetries: 0,
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: prompt },
          { type: "image", image: png, mediaType: "image/png" },
        ],
      },
    ],
  });
  const deltas = [];
  for await (const delta of result.textStream) deltas.push(delta);
  return { deltas, text: await result.text, finishReason: await result.finishReason, usage: await result.usage };
}

const cases = { "image-tool": imageTool, stream };
process.stdout.write(`${JSON.stringify(await cases[caseName]())}\n`);
