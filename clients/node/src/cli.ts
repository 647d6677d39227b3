#!/usr/bin/env node
// `fleet-budget-bullmq`: the BullMQ side of a replay, for operators.
//
//   fleet-budget-bullmq receive --config fleet-budget.toml --queue search [--queue mail ...]
//       [--receiver-id ID]
//       puts back on each BullMQ queue what `budgetctl replay` moved for it: the dead letters
//       in its replay queue (<amqp.prefix>.bullmq.<queue>, with [amqp]) and the kept jobs in its
//       replay list (<key_prefix>:v1:bullmq-replay:{<queue>}, `--bullmq-queue`); runs until
//       SIGINT or SIGTERM, then prints what it did as JSON. --receiver-id names the list of the
//       request in hand (default the host's name): one per receiver of a queue on a host.
//   fleet-budget-bullmq replay-failed --config fleet-budget.toml --queue search [--rate 10]
//       [--limit N] [--reason budget_exhausted ...] [--task index_document ...] [--max-replays 3]
//       [--dry-run]
//       puts the jobs the budget refused and BullMQ kept in the failed set (no [amqp]) back on
//       the queue, paced; prints the report as JSON.
//
// BullMQ's Redis is the budget's (`redis.url`) unless --bullmq-redis names another; its key
// prefix is BullMQ's default, `bull`, unless --bullmq-prefix says otherwise.

import { parseArgs } from "node:util";
import { Queue } from "bullmq";
import { Config } from "./config.js";
import { FleetBudget } from "./budget.js";
import { ReplayReceiver, replayFailed } from "./bullmqReplay.js";
import { errorMessage } from "./decision.js";
import { redactText } from "./names.js";

const USAGE = `usage: fleet-budget-bullmq receive --config PATH --queue NAME [--queue NAME ...] [--receiver-id ID]
       fleet-budget-bullmq replay-failed --config PATH --queue NAME [--rate N] [--limit N]
           [--reason R ...] [--task T ...] [--max-replays N] [--dry-run]
   both: [--bullmq-redis URL] [--bullmq-prefix PREFIX]`;

function number(name: string, text: string | undefined, min: number): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n) || n < min) throw new Error(`--${name} ${JSON.stringify(text)} must be a number of at least ${min}`);
  return n;
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command !== "receive" && command !== "replay-failed") {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const { values } = parseArgs({
    args: rest,
    options: {
      config: { type: "string" },
      queue: { type: "string", multiple: true },
      rate: { type: "string" },
      limit: { type: "string" },
      reason: { type: "string", multiple: true },
      task: { type: "string", multiple: true },
      "max-replays": { type: "string" },
      "dry-run": { type: "boolean" },
      "bullmq-redis": { type: "string" },
      "bullmq-prefix": { type: "string" },
      "receiver-id": { type: "string" },
    },
    strict: true,
  });
  if (values.config === undefined || !values.queue?.length) throw new Error(`--config and --queue are required\n${USAGE}`);
  const config = Config.fromPath(values.config);
  const url = new URL(values["bullmq-redis"] ?? config.redis.url);
  const connection = {
    host: url.hostname, port: Number(url.port || 6379), username: url.username ? decodeURIComponent(url.username) : undefined,
    password: url.password ? decodeURIComponent(url.password) : undefined, db: Number(url.pathname.slice(1) || 0),
    tls: url.protocol === "rediss:" ? {} : undefined, maxRetriesPerRequest: null,
  };
  const prefix = values["bullmq-prefix"];
  const queues = values.queue.map((name) => new Queue(name, { connection, ...(prefix ? { prefix } : {}) }));
  try {
    if (command === "receive") {
      const receiverId = values["receiver-id"];
      const receivers = queues.map((q) => new ReplayReceiver(q, { config }, receiverId === undefined ? {} : { receiverId }));
      for (const r of receivers) await r.start();
      process.stderr.write(`fleet-budget-bullmq: receiving ${receivers.map((r) => r.name).join(", ")}\n`);
      await new Promise<void>((resolve) => {
        process.once("SIGINT", resolve);
        process.once("SIGTERM", resolve);
      });
      for (const r of receivers) await r.close();
      process.stdout.write(`${JSON.stringify(Object.fromEntries(receivers.map((r) => [r.name, r.counts])))}\n`);
      return 0;
    }
    if (queues.length !== 1) throw new Error("replay-failed takes one --queue");
    const budget = new FleetBudget(config, { log: { warn() {}, info() {}, error: (m: string) => process.stderr.write(`${m}\n`) } });
    try {
      await budget.ready();
      const report = await replayFailed(queues[0]!, {
        rate: number("rate", values.rate, 0.1), limit: number("limit", values.limit, 0), reasons: values.reason, tasks: values.task,
        maxReplays: number("max-replays", values["max-replays"], 0), dryRun: values["dry-run"] ?? false, budget,
      });
      process.stdout.write(`${JSON.stringify(report)}\n`);
      return 0;
    } finally {
      await budget.close();
    }
  } finally {
    for (const q of queues) await q.close();
  }
}

main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
  process.stderr.write(`fleet-budget-bullmq: ${redactText(errorMessage(e))}\n`);
  process.exit(1);
});
