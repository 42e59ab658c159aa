// Drives @durable-streams/client (the Durable Streams TypeScript client, unchanged) against
// runwire's edge for tests/edge/test_durable_clients.py. One JSON argument says what to do;
// one JSON line on stdout says what happened.
//
//   {"mode": "read", "url": …, "offset": "-1", "live": "sse"|"long-poll"|false,
//    "count": N, "headers": {…}}
//     subscribeJson until N messages arrived (or the stream closed):
//     {"items": [...], "offset": "<Stream-Next-Offset>", "closed": bool}
//   {"mode": "produce", "url": …, "producer": "p1", "epoch": 0, "messages": [...],
//    "repeat_seq": 1, "headers": {…}}
//     IdempotentProducer appends the messages one batch per flush; the request carrying
//     Producer-Seq = repeat_seq is sent twice (a retrying proxy whose first answer was lost);
//     with "close": true the producer closes the stream at the end; with "pipelined": true and
//     "in_flight": N, "batch_bytes": B, batches of at most B bytes go out N at a time:
//     {"statuses": [every HTTP status the edge answered, in order]}
//   {"mode": "create", "url": …, "headers": {…}}
//     DurableStream.create (a JSON-mode stream; a fork with Stream-Forked-From / Stream-Fork-Offset
//     among the headers): {"created": true} or {"error": "…"}
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client";

const args = JSON.parse(process.argv[2]);
const out = (value) => process.stdout.write(JSON.stringify(value) + "\n");

if (args.mode === "read") {
  const response = await stream({
    url: args.url, offset: args.offset ?? "-1", live: args.live ?? true, json: true,
    headers: args.headers ?? {}, warnOnHttp: false,
  });
  const items = [];
  let offset = response.offset;
  let closed = false;
  await new Promise((resolve, reject) => {
    const stop = response.subscribeJson(async (batch) => {
      items.push(...batch.items);
      offset = batch.offset;
      closed = batch.streamClosed;
      if (closed || (args.count && items.length >= args.count)) {
        stop();
        response.cancel();
        resolve();
      }
    });
    // `closed` can settle before the subscriber has seen the last batch: give it a moment.
    response.closed.then(() => setTimeout(resolve, 200), reject);
  });
  out({ items, offset, closed });
} else if (args.mode === "produce") {
  const statuses = [];
  const retrying = async (url, init) => {
    const first = await fetch(url, init);
    statuses.push(first.status);
    const seq = new Headers(init.headers).get("Producer-Seq");
    if (Number(seq) !== args.repeat_seq) return first;
    const again = await fetch(url, init);  // the answer above was "lost": the request goes again
    statuses.push(again.status);
    return again;
  };
  const handle = new DurableStream({ url: args.url, contentType: "application/json", headers: args.headers ?? {} });
  const producer = new IdempotentProducer(handle, args.producer, {
    epoch: args.epoch ?? 0, fetch: retrying, headers: args.headers ?? {}, lingerMs: 0,
    maxInFlight: args.in_flight ?? 1, maxBatchBytes: args.batch_bytes ?? 1024 * 1024,
    onError: (error) => { out({ error: String(error) }); process.exit(1); },
  });
  for (const message of args.messages) {
    producer.append(JSON.stringify(message));
    if (!args.pipelined) await producer.flush();  // pipelined: batches go out concurrently
  }
  await producer.flush();
  if (args.close) await producer.close();
  else await producer.detach();
  out({ statuses });
} else if (args.mode === "create") {
  try {
    await DurableStream.create({ url: args.url, contentType: "application/json", headers: args.headers ?? {},
                                 warnOnHttp: false });
    out({ created: true });
  } catch (error) {
    out({ error: String(error) });
  }
} else {
  throw new Error(`unknown mode ${args.mode}`);
}
