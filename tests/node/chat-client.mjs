// Drive the AI SDK's own chat transports against a runwire edge, as a browser app would.
//
//   node chat-client.mjs '<json options>'
//
// options: { edge, chatId, mode, token?, lastSequence?, abortAfter?, messages? }
//   mode "http-resume": DefaultChatTransport({ api: `${edge}/v1/threads` }).reconnectToStream
//   mode "ws-resume":   WebSocketChatTransport({ url: `${edge}/v1/threads` }).reconnectToStream
//   mode "ws-send":     WebSocketChatTransport.sendMessages (a new turn for the agent)
//   mode "ws-frames":   the raw protocol over `ws`: one resume frame with `lastSequence`
// abortAfter: abort (stop()) after that many chunks (ws-send, ws-resume).
//
// Prints one JSON line: { result: null } when the transport resolved to "no active
// stream", else { result: { chunks, message, errors } } with the chunks read and the
// message readUIMessageStream assembled from them; { error } when the transport failed.
import { DefaultChatTransport, WebSocketChatTransport, readUIMessageStream } from "ai";
import WebSocket from "ws";

const options = JSON.parse(process.argv[2]);
const headers = options.token ? { Authorization: `Bearer ${options.token}` } : {};
const params = options.token ? { access_token: options.token } : {};
const wsUrl = `${options.edge.replace(/^http/, "ws")}/v1/threads`;

async function collect(stream, controller) {
  const chunks = [];
  const [mine, forMessage] = stream.tee();
  const assembled = (async () => {
    let message = null;
    const errors = [];
    for await (const snapshot of readUIMessageStream({ stream: forMessage, onError: (e) => errors.push(e.message) })) {
      message = snapshot;
    }
    return { message, errors };
  })();
  for await (const chunk of mine) {
    chunks.push(chunk);
    if (controller && options.abortAfter && chunks.length === options.abortAfter) controller.abort();
  }
  const { message, errors } = await assembled;
  return { chunks, message, errors };
}

async function viaTransport() {
  if (options.mode === "http-resume") {
    const transport = new DefaultChatTransport({ api: `${options.edge}/v1/threads`, headers });
    const stream = await transport.reconnectToStream({ chatId: options.chatId });
    return stream === null ? null : collect(stream);
  }
  const transport = new WebSocketChatTransport({ url: wsUrl, params, webSocket: WebSocket });
  const controller = new AbortController();
  try {
    if (options.mode === "ws-resume") {
      const stream = await transport.reconnectToStream({ chatId: options.chatId, abortSignal: controller.signal });
      return stream === null ? null : await collect(stream, controller);
    }
    const stream = await transport.sendMessages({
      chatId: options.chatId,
      trigger: "submit-message",
      messageId: undefined,
      messages: options.messages ?? [{ id: "u1", role: "user", parts: [{ type: "text", text: "hello" }] }],
      abortSignal: controller.signal,
      body: { temperature: 0 },
    });
    return await collect(stream, controller);
  } finally {
    // let an abort frame go out before the socket closes
    await new Promise((resolve) => setTimeout(resolve, 200));
    transport.close();
  }
}

// The protocol without the transport: a resume with lastSequence, frames as they come.
async function viaFrames() {
  const socket = new WebSocket(wsUrl + (options.token ? `?access_token=${options.token}` : ""));
  const frames = [];
  await new Promise((resolve, reject) => {
    socket.on("open", () =>
      socket.send(JSON.stringify({
        type: "resume", requestId: "r1", id: options.chatId, lastSequence: options.lastSequence,
        headers: {}, body: {}, metadata: null,
      })));
    socket.on("message", (data) => {
      const frame = JSON.parse(data.toString());
      frames.push(frame);
      if (["end", "no-active", "error"].includes(frame.type)) resolve();
    });
    socket.on("error", reject);
    socket.on("close", resolve);
  });
  socket.close();
  return { frames };
}

try {
  const result = options.mode === "ws-frames" ? await viaFrames() : await viaTransport();
  process.stdout.write(JSON.stringify({ result }) + "\n");
} catch (err) {
  process.stdout.write(JSON.stringify({ error: String(err?.message ?? err) }) + "\n");
}
