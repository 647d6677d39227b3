// A Node.js worker of a mixed fleet, for tests/three_language_fleet.rs and scripts/bench-languages:
// `node fleet_worker.mjs <config.toml> <failures> [concurrency]` reads one line on stdin (the
// start), then asks the budget about that many failed first attempts of `index_document`, at most
// `concurrency` at a time, closes the budget (sending the denials it answered itself), and prints
// one JSON line: granted, denied, the deposits it could not send, and the seconds the decisions
// took.

import { createInterface } from "node:readline";
import { Config, Failure, FleetBudget } from "../../dist/index.js";

const [path, count, width = "1"] = process.argv.slice(2);
const n = Number(count);
const concurrency = Math.max(1, Number(width));
const budget = new FleetBudget(Config.fromPath(path), { log: { warn() {}, info() {}, error: console.error } });
await budget.ready();
process.stdout.write("ready\n");
const lines = createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));
lines.close();
process.stdin.unref();

let granted = 0;
let asked = 0;
const started = performance.now();
await Promise.all(Array.from({ length: concurrency }, async () => {
  while (asked < n) {
    asked += 1;
    const d = await budget.onFailure("index_document", 1, Failure.retryable("503 from search"));
    if (d.kind === "retry") granted += 1;
  }
}));
const seconds = (performance.now() - started) / 1000;
const unsent = await budget.close();
process.stdout.write(`${JSON.stringify({ granted, denied: n - granted, unsent, seconds })}\n`);
