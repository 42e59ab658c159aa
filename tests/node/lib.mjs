// Shared by the validators: read NDJSON from stdin, run a check per stream,
// report (exit status 0 valid, 1 invalid with the reason on stderr).
//
//   node verify-x.mjs [--partial]            stdin: one frame per line (one stream)
//   node verify-x.mjs --streams [--partial]  stdin: one JSON array of frames per line
//
// --partial: a stream may stop before its terminal frame.
export const partial = process.argv.includes("--partial");
const many = process.argv.includes("--streams");

export class Invalid extends Error {}

async function readLines() {
  let text = "";
  for await (const chunk of process.stdin) text += chunk;
  return text.split("\n").map((line, index) => [line, index + 1]).filter(([line]) => line.trim());
}

function parse(line, number) {
  try {
    return JSON.parse(line);
  } catch (err) {
    throw new Invalid(`line ${number}: not JSON: ${err.message}`);
  }
}

export async function main(check) {
  try {
    const lines = await readLines();
    if (!many) {
      const summary = await check(lines.map(([line, n]) => parse(line, n)));
      process.stdout.write(JSON.stringify(summary) + "\n");
      return;
    }
    const summaries = [];
    for (const [line, n] of lines) {
      try {
        summaries.push(await check(parse(line, n)));
      } catch (err) {
        throw new Invalid(`stream ${n}: ${err.message}`);
      }
    }
    process.stdout.write(JSON.stringify(summaries) + "\n");
  } catch (err) {
    process.stderr.write(`INVALID: ${err.message}\n`);
    process.exitCode = 1; // not process.exit(): let piped output drain
  }
}
