// Putting BullMQ dead letters back, against real BullMQ on a private redis-server and the shared
// RabbitMQ (names of the test's own, deleted at the end): a receiver drains the replay queue the
// dead letters name into the BullMQ queue, acking only once BullMQ took the job, so a message
// given twice (a receiver killed before its ack) adds its job once; a message that cannot be a
// job is parked with the reason; jobs kept in the failed set (no [amqp]) are put back, paced,
// each once, and a job replayed max_replays times stays. (budgetctl replay moving the dead
// letters: tests/three_language_brownout.rs.)

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "amqplib";
import { Queue, Worker } from "bullmq";
import { Config, FleetBudget } from "../dist/index.js";
import { ReplayReceiver, budgeted, replayFailed, replayJobId, replayQueueName, replaysOf } from "../dist/bullmq.js";
import { AMQP_URL, randomHex, startRedis, waitFor } from "./helpers.mjs";

let server;
let amqp;
let channel;
const quiet = { warn() {}, info() {}, error() {} };

before(async () => {
  server = await startRedis();
  amqp = await connect(AMQP_URL, { timeout: 10_000 });
  channel = await amqp.createChannel();
});

after(async () => {
  await amqp?.close();
  await server?.stop();
});

function budgetOf({ amqpPrefix = null, floor = 0 } = {}) {
  const config = Config.fromToml(`
[redis]
url = "${server.url}"
key_prefix = "fbbullr${randomHex()}"
timeout_ms = 2000
deposit_flush_ms = 20
${amqpPrefix === null ? "" : `[amqp]\nurl = "${AMQP_URL}"\nprefix = "${amqpPrefix}"\n`}
[defaults]
ratio = 0.0
min_allowance = 0

[dependencies.search]
ratio = 0.0
min_allowance = ${floor}
tasks = ["index_document"]
`);
  return new FleetBudget(config, { log: quiet });
}

const connection = () => ({ host: "127.0.0.1", port: server.port, maxRetriesPerRequest: null });

/** What `budgetctl replay` does to a dead letter, by hand: its copy to the original exchange and
 * routing key with fb-replays raised (tests/three_language_brownout.rs runs the real one). */
async function moveBack(deadQueue, { redeliverFirst = false } = {}) {
  let moved = 0;
  for (;;) {
    const m = await channel.get(deadQueue, { noAck: false });
    if (m === false) return moved;
    const h = m.properties.headers;
    channel.publish(h["fb-original-exchange"], h["fb-original-routing-key"], m.content, {
      headers: { ...h, "fb-replays": (h["fb-replays"] ?? 0) + 1 }, contentType: m.properties.contentType, messageId: m.properties.messageId,
      persistent: true,
    });
    if (redeliverFirst && moved === 0) {
      // The same copy twice: what a receiver killed between BullMQ's add and its ack sees.
      channel.publish(h["fb-original-exchange"], h["fb-original-routing-key"], m.content, {
        headers: { ...h, "fb-replays": (h["fb-replays"] ?? 0) + 1 }, contentType: m.properties.contentType, messageId: m.properties.messageId,
      });
    }
    channel.ack(m);
    moved += 1;
  }
}

test("the replay ids: the count rides in the job id", () => {
  assert.equal(replayJobId("doc-1", 1), "doc-1~r1");
  assert.equal(replayJobId("doc-1~r1", 2), "doc-1~r2");
  assert.equal(replayJobId("17", 1), "17~r1");
  assert.equal(replaysOf("doc-1~r3"), 3);
  assert.equal(replaysOf("doc-1"), 0);
  assert.equal(replayQueueName("fleet", "search"), "fleet.bullmq.search");
});

test("dead letters moved back to their replay queue are added to BullMQ once each, and complete", async () => {
  const amqpPrefix = `fbnoder-${randomHex()}`;
  const dead = `${amqpPrefix}.dead`;
  const parked = `${amqpPrefix}.parked`;
  for (const x of [dead, parked]) {
    await channel.assertExchange(x, "fanout", { durable: true });
    await channel.assertQueue(x, { durable: true });
    await channel.bindQueue(x, x, "");
  }
  const budget = budgetOf({ amqpPrefix });
  const name = `bqr-${randomHex()}`;
  const queue = new Queue(name, { connection: connection() });
  let failing = true;
  const completed = new Map();
  const processor = budgeted(budget, async (job) => {
    if (failing) throw new Error("503 from search");
    completed.set(job.data.doc, (completed.get(job.data.doc) ?? 0) + 1);
    return job.id;
  });
  const worker = new Worker(name, processor, { connection: connection(), concurrency: 4 });
  const receiver = new ReplayReceiver(queue, budget, { log: quiet });
  const N = 12;
  try {
    for (let i = 0; i < N; i++) await queue.add("index_document", { doc: i }, { jobId: `doc-${i}`, attempts: 3, removeOnFail: false });
    await waitFor("every job dead-lettered", async () => (await queue.getJobCounts("failed")).failed === N, 30_000);
    const replayQueue = replayQueueName(amqpPrefix, name);
    assert.equal((await channel.checkQueue(replayQueue)).messageCount, 0, "declared before the first dead letter");
    await waitFor("the dead letters", async () => (await channel.checkQueue(dead)).messageCount === N);
    failing = false;
    assert.equal(await moveBack(dead, { redeliverFirst: true }), N);
    // A message that is not a job: parked, not added.
    channel.sendToQueue(replayQueue, Buffer.from("not json"), { headers: { "fb-replays": 1 } });
    await receiver.start();
    await waitFor("every replayed job completed", async () => completed.size === N, 30_000);
    await waitFor("the receiver drained its queue", async () => (await channel.checkQueue(replayQueue)).messageCount === 0);
    await waitFor("the unreadable message parked", async () => receiver.counts.parked === 1);
    assert.deepEqual(receiver.counts, { added: N, already: 1, parked: 1, gone: 0, takenBack: 0 });
    for (const [doc, n] of completed) assert.equal(n, 1, `doc ${doc} completed once`);
    const counts = await queue.getJobCounts("failed", "completed", "wait", "active", "delayed");
    assert.deepEqual(counts, { failed: 0, completed: N, wait: 0, active: 0, delayed: 0 }, "the originals removed from the failed set");
    const again = await queue.getJob("doc-3~r1");
    assert.equal(again.name, "index_document");
    assert.deepEqual(again.data, { doc: 3 });
    assert.equal(again.opts.attempts, 3, "the original's options");
    const park = await channel.get(parked, { noAck: true });
    assert.match(park.properties.headers["fb-park-reason"], /^not a BullMQ job: the body is not JSON/);
    console.log(`receiver: ${JSON.stringify(receiver.counts)}; completed ${completed.size} of ${N}, each once`);
  } finally {
    await receiver.close();
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
    for (const q of [dead, parked, replayQueueName(amqpPrefix, name)]) await channel.deleteQueue(q).catch(() => {});
    for (const x of [dead, parked]) await channel.deleteExchange(x).catch(() => {});
  }
});

test("without [amqp], the jobs kept in the failed set are put back, paced, each completed once", async () => {
  const budget = budgetOf({ floor: 0 });
  const name = `bqf-${randomHex()}`;
  const queue = new Queue(name, { connection: connection() });
  let failing = true;
  const completed = new Map();
  const processor = budgeted(budget, async (job) => {
    if (failing || job.data.doomed) throw new Error("503 from search");
    completed.set(job.data.doc, (completed.get(job.data.doc) ?? 0) + 1);
  });
  const worker = new Worker(name, processor, { connection: connection(), concurrency: 4 });
  const N = 16;
  try {
    for (let i = 0; i < N; i++) await queue.add("index_document", { doc: i }, { jobId: `doc-${i}` });
    await queue.add("other", {}, { jobId: "not-the-budgets" });
    await waitFor("every job failed", async () => (await queue.getJobCounts("failed")).failed === N + 1, 30_000);
    const dry = await replayFailed(queue, { dryRun: true });
    assert.deepEqual([dry.matched, dry.moved], [N + 1, 0]);
    // The one named "other" is a task of its own budget: matched too. Only index_document here.
    failing = false;
    const started = Date.now();
    const report = await replayFailed(queue, { rate: 16, tasks: ["index_document"], budget });
    const secs = (Date.now() - started) / 1000;
    assert.equal(report.moved, N);
    assert.equal(report.skipped, 1, "another task's job stays");
    assert.ok(secs >= 1.0, `paced: 16 jobs at 2/s rising to 16/s take more than a second (${secs.toFixed(2)} s)`);
    await waitFor("every job completed", async () => completed.size === N, 30_000);
    for (const [doc, n] of completed) assert.equal(n, 1, `doc ${doc} completed once`);
    const second = await replayFailed(queue, { tasks: ["index_document"] });
    assert.equal(second.matched, 0, "nothing left to put back");
    // A job that keeps failing stops at max_replays.
    await queue.add("index_document", { doomed: true }, { jobId: "doomed" });
    for (let n = 1; n <= 2; n++) {
      await waitFor(`doomed failed (${n})`, async () => (await queue.getJobCounts("failed")).failed === 2);
      const r = await replayFailed(queue, { rate: 100, tasks: ["index_document"], maxReplays: 2 });
      assert.equal(r.moved, 1);
    }
    await waitFor("doomed failed again", async () => (await queue.getJob("doomed~r2"))?.failedReason !== undefined);
    const last = await replayFailed(queue, { rate: 100, tasks: ["index_document"], maxReplays: 2 });
    assert.deepEqual([last.moved, last.looping], [0, 1]);
    console.log(`replay-failed: ${N} put back in ${secs.toFixed(2)} s, each completed once; doomed stopped at replay 2`);
  } finally {
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
  }
});
