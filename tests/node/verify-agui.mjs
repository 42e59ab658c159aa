// Validate AG-UI event streams with @ag-ui/core's event schemas and
// @ag-ui/client's verifyEvents (see lib.mjs for input modes).
import { EventSchemas } from "@ag-ui/core/schemas";
import { AbstractAgent, verifyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";
import { main, partial, Invalid } from "./lib.mjs";

async function check(events) {
  events.forEach((event, index) => {
    const parsed = EventSchemas.safeParse(event);
    if (!parsed.success) {
      throw new Invalid(`event ${index + 1} (${event?.type}): ${JSON.stringify(parsed.error.issues)}`);
    }
  });
  let seen;
  try {
    seen = await lastValueFrom(from(events).pipe(verifyEvents(false), toArray()), { defaultValue: [] });
  } catch (err) {
    throw new Invalid(`verifyEvents: ${err.message}`);
  }
  const last = events.at(-1)?.type;
  if (!partial && last !== "RUN_FINISHED" && last !== "RUN_ERROR") {
    throw new Invalid(`stream does not end with RUN_FINISHED or RUN_ERROR (last: ${last})`);
  }
  const counts = {};
  for (const e of seen) counts[e.type] = (counts[e.type] ?? 0) + 1;
  return { events: seen.length, counts, messages: await transcript(events) };
}

// The messages @ag-ui/client's own agent builds from the stream (as a UI would).
class ReplayAgent extends AbstractAgent {
  constructor(events) {
    super({ threadId: events.find((e) => e.type === "RUN_STARTED")?.threadId });
    this.events = events;
  }
  run() {
    return from(this.events);
  }
}

async function transcript(events) {
  if (!events.length || partial) return null;
  const agent = new ReplayAgent(events);
  try {
    await agent.runAgent({ runId: events[0].runId });
  } catch (err) {
    throw new Invalid(`AbstractAgent.runAgent: ${err.message}`);
  }
  return agent.messages.map((m) => ({
    role: m.role,
    content: m.content ?? null,
    toolCalls: (m.toolCalls ?? []).map((c) => [c.function.name, c.function.arguments]),
    toolCallId: m.toolCallId ?? null,
    subagentRunId: m.subagentRunId ?? null,
  }));
}

await main(check);
