// Validate Vercel AI SDK UI message streams: each chunk against `ai`'s
// uiMessageChunkSchema, each stream through readUIMessageStream (see lib.mjs
// for input modes).
import { readUIMessageStream, uiMessageChunkSchema, UIMessageStreamError } from "ai";
import { main, partial, Invalid } from "./lib.mjs";

const schema = uiMessageChunkSchema();

async function check(chunks) {
  for (const [index, chunk] of chunks.entries()) {
    const result = await schema.validate(chunk);
    if (!result.success) throw new Invalid(`chunk ${index + 1} (${chunk?.type}): ${result.error.message}`);
  }
  const streamErrors = []; // "error" chunks belong to a valid stream; reported in the summary
  const processingErrors = [];
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  let message = null;
  try {
    for await (const snapshot of readUIMessageStream({
      stream,
      onError: (err) => (UIMessageStreamError.isInstance(err) ? processingErrors : streamErrors).push(err),
    })) {
      message = snapshot;
    }
  } catch (err) {
    processingErrors.push(err);
  }
  if (processingErrors.length) {
    throw new Invalid(`readUIMessageStream: ${processingErrors.map((e) => e.message).join("; ")}`);
  }
  const last = chunks.at(-1)?.type;
  if (!partial && last !== "finish" && last !== "abort") {
    throw new Invalid(`stream does not end with finish or abort (last: ${last})`);
  }
  const open = (message?.parts ?? []).filter((p) => p.state === "streaming");
  if (!partial && open.length) throw new Invalid(`parts still streaming at the end: ${JSON.stringify(open)}`);
  return { chunks: chunks.length, errors: streamErrors.map((e) => e.message), message };
}

await main(check);
