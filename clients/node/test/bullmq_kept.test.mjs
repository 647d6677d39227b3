// The BullMQ jobs the budget keeps in the failed set (no [amqp]) and their replay through
// `budgetctl replay --bullmq-queue`, against real BullMQ on a private redis-server: each kept job
// is recorded in the fleet's kept list (bounded, what is dropped counted); the receiver drains the
// replay list into BullMQ, finishing first the request a killed receiver had in hand (or, when it
// never comes back, another receiver takes that request back), each job put back once; an entry that is no job is parked, one whose job is gone is counted and dropped.
// (budgetctl moving the entries, with kills on both sides: tests/bullmq_replay.rs.)

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Queue, Worker } from "bullmq";
import { Config, FleetBudget } from "../dist/index.js";
import {
  ReplayReceiver, budgeted, bullmqQueueProblem, keepJob, keptEntry, keptKeys, putBackKept, readKeptEntry,
} from "../dist/bullmq.js";
import { randomHex, startRedis, waitFor } from "./helpers.mjs";

let server;
let redis;
const quiet = { warn() {}, info() {}, error() {} };

before(async () => {
  server = await startRedis();
  redis = server.client();
});

after(async () => {
  redis?.disconnect();
  await server?.stop();
});

const connection = () => ({ host: "127.0.0.1", port: server.port, maxRetriesPerRequest: null });

function budgetOf(keyPrefix) {
  const config = Config.fromToml(`
[redis]
url = "${server.url}"
key_prefix = "${keyPrefix}"
timeout_ms = 2000
deposit_flush_ms = 20

[defaults]
ratio = 0.0
min_allowance = 0

[dependencies.search]
tasks = ["index_document"]
`);
  return new FleetBudget(config, { log: quiet });
}

test("kept entries: read or refused with a reason; queue names bounded", () => {
  const e = readKeptEntry(JSON.stringify(keptEntry("doc-1", "index_document", "search", "budget_exhausted", "error", "503", 5)));
  assert.equal(e.id, "doc-1");
  assert.equal(e.dependency, "search");
  assert.equal(readKeptEntry('{"id":17,"dependency":"d"}').id, "17");
  for (const bad of ["not json", "[1]", "null", '{"dependency":"d"}', '{"id":"","dependency":"d"}', '{"id":-1,"dependency":"d"}',
    '{"id":{"a":1},"dependency":"d"}', '{"id":"x"}', `{"id":"${"x".repeat(513)}","dependency":"d"}`, "x".repeat(20_000)]) {
    assert.equal(typeof readKeptEntry(bad), "string", bad.slice(0, 40));
  }
  assert.equal(bullmqQueueProblem("search"), null);
  for (const bad of ["", "a:b", "a{b", "a}b", "a\nb", "q".repeat(201)]) assert.notEqual(bullmqQueueProblem(bad), null, bad);
  assert.equal(keptKeys("fb", "search").kept, "fb:v1:bullmq-kept:{search}");
  assert.equal(keptKeys("fb", "search").replaying("h1"), "fb:v1:bullmq-replaying:{search}:h1");
});

test("the kept list is bounded: when full, the entry just pushed is dropped and counted", async () => {
  const keys = keptKeys(`fbk${randomHex()}`, "q");
  const prefix = keys.kept.split(":")[0];
  const results = [];
  for (let i = 0; i < 5; i++) results.push(await keepJob(redis, prefix, "q", keptEntry(`j${i}`, "t", "d", "budget_exhausted", "error", "", i), 3));
  assert.deepEqual(results, ["kept", "kept", "kept", "dropped", "dropped"]);
  const ids = (await redis.lrange(keys.kept, 0, -1)).map((raw) => JSON.parse(raw).id);
  assert.deepEqual(ids, ["j2", "j1", "j0"], "the oldest kept, newest on the left");
  assert.equal(await redis.get(keys.dropped), "2");
});

/** A BullMQ queue whose jobs (`{ doc }`) fail with a 503 until `recover()`, under a budget that
 * keeps every one (floor 0); `completed` counts each doc's completions. */
function budgetedQueue(tag) {
  const keyPrefix = `fbk${randomHex()}`;
  const budget = budgetOf(keyPrefix);
  const name = `${tag}-${randomHex()}`;
  const keys = keptKeys(keyPrefix, name);
  const queue = new Queue(name, { connection: connection() });
  let failing = true;
  const completed = new Map();
  const processor = budgeted(budget, async (job) => {
    if (failing) throw new Error("503 from search");
    completed.set(job.data.doc, (completed.get(job.data.doc) ?? 0) + 1);
  });
  const worker = new Worker(name, processor, { connection: connection(), concurrency: 4 });
  const close = async () => {
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
  };
  return { budget, keys, queue, completed, recover: () => { failing = false; }, close };
}

test("without [amqp], kept jobs moved to the replay list are put back once each by the receiver", async () => {
  const { budget, keys, queue, completed, recover, close } = budgetedQueue("bqk");
  const receiverId = `test-${randomHex()}`;
  let receiver = null;
  const N = 12;
  try {
    for (let i = 0; i < N; i++) await queue.add("index_document", { doc: i }, { jobId: `doc-${i}` });
    await waitFor("every job kept in the failed set", async () => (await queue.getJobCounts("failed")).failed === N, 30_000);
    await waitFor("every job recorded", async () => (await redis.llen(keys.kept)) === N);
    const first = JSON.parse(await redis.lindex(keys.kept, -1));
    assert.equal(first.dependency, "search");
    assert.equal(first.reason, "budget_exhausted");
    assert.equal(first.task, "index_document");
    recover();
    // What `budgetctl replay --bullmq-queue` does, by hand: one LMOVE per entry.
    for (let i = 0; i < N; i++) assert.notEqual(await redis.lmove(keys.kept, keys.replay, "RIGHT", "LEFT"), null);
    // A receiver killed after BullMQ took a job, before it removed the request in hand: the
    // request is still in its list, its job added already.
    const inHand = await redis.lmove(keys.replay, keys.replaying(receiverId), "RIGHT", "LEFT");
    assert.equal(await putBackKept(queue, JSON.parse(inHand).id, 1), "added");
    // An entry that is no job, and one whose job is gone.
    await redis.lpush(keys.replay, "not json", JSON.stringify({ id: "nope", dependency: "search" }));
    receiver = new ReplayReceiver(queue, budget, { log: quiet, receiverId });
    await receiver.start();
    await waitFor("every job completed", async () => completed.size === N, 30_000);
    await waitFor("the replay list drained", async () => (await redis.llen(keys.replay)) === 0 && (await redis.llen(keys.replaying(receiverId))) === 0);
    await waitFor("the counts", async () => receiver.counts.added + receiver.counts.already + receiver.counts.parked + receiver.counts.gone === N + 2);
    // The job in hand was added by the killed receiver: `already` here; the rest added now.
    assert.deepEqual(receiver.counts, { added: N - 1, already: 1, parked: 1, gone: 1, takenBack: 0 });
    for (const [doc, n] of completed) assert.equal(n, 1, `doc ${doc} completed once`);
    const counts = await queue.getJobCounts("failed", "completed", "wait", "active", "delayed");
    assert.deepEqual(counts, { failed: 0, completed: N, wait: 0, active: 0, delayed: 0 }, "the originals removed from the failed set");
    assert.deepEqual(await redis.lrange(keys.parked, 0, -1), ["not json"]);
    console.log(`kept replay: receiver ${JSON.stringify(receiver.counts)}; completed ${completed.size} of ${N}, each once`);
  } finally {
    await receiver?.close();
    await close();
  }
});

test("a request in hand of a receiver that never comes back is taken back by another, and put back once", async () => {
  const { budget, keys, queue, completed, recover, close } = budgetedQueue("bqg");
  const gone = `gone-${randomHex()}`;
  let goneReceiver = null;
  let receiver = null;
  const N = 4;
  try {
    for (let i = 0; i < N; i++) await queue.add("index_document", { doc: i }, { jobId: `doc-${i}` });
    await waitFor("every job kept", async () => (await redis.llen(keys.kept)) === N, 30_000);
    recover();
    // A receiver of its own name that said it was alive, then went (its pod replaced under
    // another name) with a request in hand: what a BLMOVE cut off by its end leaves.
    goneReceiver = new ReplayReceiver(queue, budget, { log: quiet, receiverId: gone });
    await goneReceiver.start();
    await waitFor("the receiver said it is alive", async () => (await redis.zscore(keys.receivers, gone)) !== null);
    await goneReceiver.close();
    goneReceiver = null;
    assert.notEqual(await redis.lmove(keys.kept, keys.replaying(gone), "RIGHT", "LEFT"), null);
    for (let i = 1; i < N; i++) assert.notEqual(await redis.lmove(keys.kept, keys.replay, "RIGHT", "LEFT"), null);
    // What someone else wrote: a "receiver" long gone whose list in hand is a string.
    await redis.zadd(keys.receivers, 1, "odd");
    await redis.set(keys.replaying("odd"), "not a list");
    // Another receiver, under another id: the others at once, the one in hand once `gone` was not
    // heard from for a second.
    const warned = [];
    receiver = new ReplayReceiver(queue, budget, { log: { ...quiet, warn: (m) => warned.push(m) }, receiverId: `test-${randomHex()}`, staleAfterMs: 1_000 });
    await receiver.start();
    await waitFor("every job completed", async () => completed.size === N, 30_000);
    await waitFor("the gone receiver's list emptied and its id forgotten",
      async () => (await redis.llen(keys.replaying(gone))) === 0 && (await redis.zscore(keys.receivers, gone)) === null);
    assert.deepEqual(receiver.counts, { added: N, already: 0, parked: 0, gone: 0, takenBack: 1 });
    for (const [doc, n] of completed) assert.equal(n, 1, `doc ${doc} completed once`);
    assert.equal(await redis.llen(keys.replay), 0);
    assert.ok(warned.some((m) => m.includes(gone) && m.includes("went back")), warned.join("\n"));
    await waitFor("the odd receiver forgotten", async () => (await redis.zscore(keys.receivers, "odd")) === null);
    assert.equal(await redis.get(keys.replaying("odd")), "not a list", "someone else's key untouched");
    assert.equal(warned.filter((m) => m.includes("holds something else")).length, 1, warned.join("\n"));
    console.log(`gone receiver: its request taken back and put back once; receiver ${JSON.stringify(receiver.counts)}`);
  } finally {
    await goneReceiver?.close();
    await receiver?.close();
    await close();
  }
});

test("a receiver needs a broker or the budget's Redis, and a safe queue name", () => {
  const queue = { name: "bad:name" };
  assert.throws(() => new ReplayReceiver(queue, null, { redis, keyPrefix: "fb" }), /BullMQ queue name/);
  assert.throws(() => new ReplayReceiver({ name: "ok" }, null, {}), /needs a broker/);
  assert.throws(() => new ReplayReceiver({ name: "ok" }, null, { redis, keyPrefix: "fb", receiverId: "" }), /receiver id/);
  assert.throws(() => new ReplayReceiver({ name: "ok" }, null, { redis, keyPrefix: "fb", staleAfterMs: 10 }), /staleAfterMs/);
});
