// The pinned Vercel AI SDK (npm `ai` + `@ai-sdk/openai`, package.json) as a real client of the facade.
//
//   node tests/vercel/ai_sdk_client.mjs BASE_URL PROVIDER CASE [FILE]
//
// PROVIDER: `responses` (openai.responses(...), POST /v1/responses) or `chat` (openai.chat(...),
// POST /v1/chat/completions). CASE: image-tool | stream | stream-tool | object | pdf. FILE: the PNG (image-tool)
// or PDF (pdf) to send. Prints one JSON object on stdout for the Python test to check
// (tests/vercel/test_ai_sdk.py); any SDK error fails the process with the error on stderr.

import { readFileSync } from "node:fs";

import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, Output, stepCountIs, streamObject, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, providerName, caseName, filePath] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "x" });
const providers = { responses: (id) => openai.responses(id), chat: (id) => openai.chat(id) };
const model = providers[providerName]("default");
// The random-weight fixture never ends a turn by itself: every text answer runs to this cap.
const maxOutputTokens = 12;
// A forced call of `lookup` needs room for the `<tool_call>` wrapper and its JSON arguments.
const toolMaxOutputTokens = 48;

async function imageTool() {
  const looked = [];
  const result = await generateText({
    model,
    maxOutputTokens: toolMaxOutputTokens,
    maxRetries: 0,
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "Which city is on this postcard? Look it up." },
          { type: "image", image: readFileSync(filePath), mediaType: "image/png" },
        ],
      },
    ],
    tools: {
      lookup: tool({
        description: "Facts about a city.",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          looked.push(city);
          return `${city}: population 1000`;
        },
      }),
    },
    // The loop: the first step must call the tool (the grammar makes the fixture model do it),
    // the tool result goes back, and the second step answers in text.
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
    stopWhen: stepCountIs(2),
  });
  return {
    looked,
    steps: result.steps.map((step) => ({
      finishReason: step.finishReason,
      toolCalls: step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
      toolResults: step.toolResults.map((r) => ({ name: r.toolName, output: r.output })),
      text: step.text,
      requestBody: step.request.body,
    })),
    text: result.text,
    usage: result.totalUsage,
  };
}

async function stream() {
  const result = streamText({ model, maxOutputTokens, maxRetries: 0, prompt: "Tell me a story." });
  const parts = [];
  for await (const part of result.fullStream) {
    if (part.type === "error") throw part.error;
    parts.push(part.type);
  }
  const deltas = [];
  for await (const delta of result.textStream) deltas.push(delta);
  return {
    parts,
    deltas,
    text: await result.text,
    finishReason: await result.finishReason,
    usage: await result.usage,
  };
}

async function streamTool() {
  // The tool loop again, streamed: the call arrives as tool-input deltas, its result goes back.
  const result = streamText({
    model,
    maxOutputTokens: toolMaxOutputTokens,
    maxRetries: 0,
    prompt: "Look up Oslo.",
    tools: {
      lookup: tool({
        description: "Facts about a city.",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => `${city}: population 1000`,
      }),
    },
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
    stopWhen: stepCountIs(2),
  });
  const parts = [];
  for await (const part of result.fullStream) {
    if (part.type === "error") throw part.error;
    parts.push(part.type);
  }
  const steps = await result.steps;
  return {
    parts,
    steps: steps.map((step) => ({
      finishReason: step.finishReason,
      toolCalls: step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
      toolResults: step.toolResults.map((r) => ({ name: r.toolName, output: r.output })),
      text: step.text,
    })),
  };
}

async function object() {
  const schema = z.object({ city: z.string(), days: z.number().int(), rain: z.boolean() });
  const settings = { model, maxOutputTokens: 64, maxRetries: 0, prompt: "Forecast for Oslo." };
  const generated = await generateObject({ ...settings, schemaName: "weather", schema });
  // AI SDK 6's own way: generateText with an output spec; and the object streamed.
  const output = await generateText({ ...settings, output: Output.object({ schema }) });
  const streamed = streamObject({ ...settings, schema });
  let partials = 0;
  for await (const _ of streamed.partialObjectStream) partials += 1;
  return {
    object: generated.object,
    finishReason: generated.finishReason,
    output: output.output,
    streamedObject: await streamed.object,
    partials,
  };
}

async function pdf() {
  const ask = (file) =>
    generateText({
      model,
      maxOutputTokens,
      maxRetries: 0,
      messages: [{ role: "user", content: [{ type: "text", text: "What is in this document?" }, ...file] }],
    });
  const file = {
    type: "file",
    data: readFileSync(filePath),
    mediaType: "application/pdf",
    filename: "report.pdf",
  };
  const result = await ask([file]);
  // The same question without the file, to show the pages reached the model.
  const alone = await ask([]);
  return {
    text: result.text,
    finishReason: result.finishReason,
    usage: result.usage,
    sent: result.request.body,
    aloneUsage: alone.usage,
  };
}

const cases = { "image-tool": imageTool, stream, "stream-tool": streamTool, object, pdf };
process.stdout.write(`${JSON.stringify(await cases[caseName]())}\n`);
