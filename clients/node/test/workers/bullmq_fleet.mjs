// A BullMQ worker of a mixed fleet, for tests/three_language_brownout.rs: the Node.js side of the
// Rust worker (tests/src/bin/fleet-worker.rs) and the Celery app (tests/python/celery_fleet.py).
//
//   node bullmq_fleet.mjs worker     consumes the BullMQ queue FB_BULLMQ_QUEUE through
//                                    `budgeted` (dead letters to [amqp]'s exchange) and runs the
//                                    queue's ReplayReceiver (not with FB_NO_RECEIVER=1); stops
//                                    on SIGTERM and prints its receiver's counts as one JSON line
//   node bullmq_fleet.mjs add ID...  adds one job `index` per ID (its job id and data.id)
//
// Each execution calls the dependency as the other two do: one TCP line `CALL <id> index
// <attempt> <replays> <pid>` to FB_UPSTREAM (HOST:PORT), answered `OK` or `FAIL <class>`. The
// budget's configuration is FB_CONFIG; BullMQ lives in the budget's Redis.

import { createConnection } from "node:net";
import { Queue, Worker } from "bullmq";
import { Config, FleetBudget } from "../../dist/index.js";
import { ReplayReceiver, budgeted, replaysOf } from "../../dist/bullmq.js";

const [mode, ...ids] = process.argv.slice(2);
const config = Config.fromPath(process.env.FB_CONFIG);
const url = new URL(config.redis.url);
const connection = { host: url.hostname, port: Number(url.port || 6379), maxRetriesPerRequest: null };
const name = process.env.FB_BULLMQ_QUEUE;
const queue = new Queue(name, { connection });

function call(id, attempt, replays) {
  const [host, port] = process.env.FB_UPSTREAM.split(":");
  return new Promise((resolve, reject) => {
    const socket = createConnection({ host, port: Number(port) });
    socket.setTimeout(2000, () => socket.destroy(new Error("no answer in 2 s")));
    let answer = "";
    socket.on("data", (d) => {
      answer += d.toString("utf8");
    });
    socket.on("end", () => resolve(answer.trim()));
    socket.on("close", () => resolve(answer.trim()));
    socket.on("error", reject);
    socket.write(`CALL ${id} index ${attempt} ${replays} ${process.pid}\n`);
  });
}

if (mode === "add") {
  for (const id of ids) await queue.add("index", { id }, { jobId: id });
  await queue.close();
  process.exit(0);
}

const budget = new FleetBudget(config, { log: { warn: console.warn, info() {}, error: console.error } });
await budget.ready();
const processor = budgeted(budget, async (job) => {
  const answer = await call(job.data.id, Math.max(1, job.attemptsStarted), replaysOf(job.id));
  if (!answer.startsWith("OK")) throw new Error(`search answered ${answer || "nothing"}`);
  return "ok";
});
const worker = new Worker(name, processor, { connection, concurrency: 4 });
// FB_NO_RECEIVER=1: the replay queue is drained by another process (`fleet-budget-bullmq receive`).
const receiver = process.env.FB_NO_RECEIVER === "1" ? null : new ReplayReceiver(queue, budget);
await receiver?.start();
console.log(`ready: ${name}${receiver === null ? "" : ` and ${receiver.name}`}`);
await new Promise((resolve) => {
  process.once("SIGTERM", resolve);
  process.once("SIGINT", resolve);
});
await receiver?.close();
await worker.close();
await processor.close();
await queue.close();
await budget.close();
console.log(JSON.stringify(receiver?.counts ?? null));
process.exit(0);
