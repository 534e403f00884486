// The engine's contract from TypeScript: the generated stubs (src/gen, `make proto-ts`) over
// @connectrpc/connect's gRPC transport for Node. A tiny client, the TypeScript twin of
// vlmserve.client: every call has a deadline, and the engine token (when the engine asks for
// one, --auth-token-file) goes as `authorization: Bearer <token>` like the Python client's.
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  EngineService,
  GenerateRequestSchema,
  type GenerateRequest,
  type GenerateResult,
} from "./gen/vlmserve/engine/v1/engine_pb.js";

export * from "./gen/vlmserve/engine/v1/engine_pb.js";
export { create };

export type EngineClient = Client<typeof EngineService>;

export interface EngineOptions {
  /** The engine token, sent as `authorization: Bearer <token>`. */
  token?: string;
}

/** A client of the engine at `address` (host:port, plaintext HTTP/2). */
export function engineClient(address: string, options: EngineOptions = {}): EngineClient {
  const interceptors: Interceptor[] = [];
  if (options.token) {
    const token = options.token;
    interceptors.push((next) => async (request) => {
      request.header.set("authorization", `Bearer ${token}`);
      return next(request);
    });
  }
  const transport = createGrpcTransport({ baseUrl: `http://${address}`, interceptors });
  return createClient(EngineService, transport);
}

export interface Streamed {
  text: string;
  chunks: number;
  result: GenerateResult | undefined;
}

/** Generate, streamed: `onText` sees each piece of text as it comes; resolves with the whole. */
export async function generate(
  client: EngineClient,
  request: GenerateRequest | MessageInitShape<typeof GenerateRequestSchema>,
  options: { timeoutMs?: number; onText?: (text: string) => void } = {},
): Promise<Streamed> {
  const message = "$typeName" in request ? request : create(GenerateRequestSchema, request);
  const streamed: Streamed = { text: "", chunks: 0, result: undefined };
  for await (const response of client.generate(message, { timeoutMs: options.timeoutMs ?? 120_000 })) {
    if (response.event.case === "chunk") {
      streamed.chunks += 1;
      const kind = response.event.value.kind;
      if (kind.case === "text") {
        streamed.text += kind.value;
        options.onText?.(kind.value);
      }
    } else if (response.event.case === "complete") {
      streamed.result = response.event.value;
    }
  }
  return streamed;
}
