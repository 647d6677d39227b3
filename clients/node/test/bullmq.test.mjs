// The BullMQ integration with real BullMQ on a private redis-server and the shared RabbitMQ
// (names of the test's own, deleted at the end): granted retries come back after the budget's
// delay, denied jobs are dead-lettered with the fb- headers to <amqp.prefix>.dead and counted in
// the dead-letter index, or kept in BullMQ's failed set with the reason when [amqp] is not
// configured, and a dead letter the broker does not confirm leaves the job to run again.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "amqplib";
import { Queue, Worker } from "bullmq";
import { Config, FleetBudget } from "../dist/index.js";
import { budgeted } from "../dist/bullmq.js";
import { AMQP_URL, randomHex, startRedis, waitFor } from "./helpers.mjs";

let server;
let redis;
let amqp;
let channel;
const quiet = { warn() {}, info() {}, error() {} };

before(async () => {
  server = await startRedis();
  redis = server.client();
  amqp = await connect(AMQP_URL, { timeout: 10_000 });
  channel = await amqp.createChannel();
});

after(async () => {
  await amqp?.close();
  redis?.disconnect();
  await server?.stop();
});

function setup({ amqpPrefix = null, floor = 3 } = {}) {
  const keyPrefix = `fbbull${randomHex()}`;
  const config = Config.fromToml(`
[redis]
url = "${server.url}"
key_prefix = "${keyPrefix}"
timeout_ms = 2000
deposit_flush_ms = 20
${amqpPrefix === null ? "" : `[amqp]\nurl = "${AMQP_URL}"\nprefix = "${amqpPrefix}"\n`}
[defaults]
backoff_base_ms = 30
backoff_cap_ms = 60

[dependencies.search]
ratio = 0.0
min_allowance = ${floor}
tasks = ["index_document"]
`);
  return { config, keyPrefix, budget: new FleetBudget(config, { log: quiet }) };
}

const connection = () => ({ host: "127.0.0.1", port: server.port, maxRetriesPerRequest: null });

async function dead(queue) {
  const got = [];
  for (;;) {
    const message = await channel.get(queue, { noAck: true });
    if (message === false) return got;
    got.push(message);
  }
}

test("granted retries run again after the budget's delay; denied jobs are dead-lettered to RabbitMQ with the fb- headers", async () => {
  const amqpPrefix = `fbnode-${randomHex()}`;
  const exchange = `${amqpPrefix}.dead`;
  await channel.assertExchange(exchange, "fanout", { durable: true });
  await channel.assertQueue(exchange, { durable: true });
  await channel.bindQueue(exchange, exchange, "");
  const { budget, keyPrefix } = setup({ amqpPrefix });
  const name = `bq-${randomHex()}`;
  const queue = new Queue(name, { connection: connection() });
  const runs = new Map();
  const processor = budgeted(budget, async (job) => {
    runs.set(job.id, (runs.get(job.id) ?? 0) + 1);
    throw new Error("503 from search (password=hunter2 at amqp://u:hunter2@h)");
  });
  const worker = new Worker(name, processor, { connection: connection(), concurrency: 4 });
  try {
    for (let i = 0; i < 6; i++) await queue.add("index_document", { doc: i }, { jobId: `doc-${i}` });
    await waitFor("every job failed", async () => (await queue.getJobCounts("failed")).failed === 6, 30_000);
    const failed = await queue.getFailed();
    const executions = [...runs.values()].reduce((a, b) => a + b, 0);
    assert.equal(executions, 6 + 3, "each job once, and exactly the floor's 3 retries");
    for (const job of failed) assert.match(job.failedReason, new RegExp(`^fleet-budget: budget_exhausted: .* \\(dead-lettered to ${exchange}\\)$`));
    const messages = await waitFor("6 dead letters", async () => {
      const got = await dead(exchange);
      return got.length > 0 ? got : null;
    });
    const all = [...messages, ...(await dead(exchange))];
    assert.equal(all.length, 6);
    for (const m of all) {
      const h = m.properties.headers;
      assert.equal(h["fb-reason"], "budget_exhausted");
      assert.equal(h["fb-dependency"], "search");
      assert.equal(h["fb-task"], "index_document");
      assert.equal(h["fb-original-routing-key"], `${amqpPrefix}.bullmq.${name}`, "the BullMQ queue's replay queue");
      assert.equal(h["fb-original-exchange"], "");
      assert.equal(h["fb-original-queue"], name);
      assert.equal(h["fb-budget-allowance"], 3);
      assert.equal(h["fb-budget-window-ms"], 60_000);
      assert.ok(["fleet", "fleet_cache"].includes(h["fb-budget-source"]));
      assert.ok(!String(h["fb-error"]).includes("hunter2"), "secrets never leave the process");
      assert.equal(m.properties.contentType, "application/json");
      const body = JSON.parse(m.content.toString("utf8"));
      assert.equal(body.queue, name);
      assert.equal(body.name, "index_document");
      assert.equal(m.properties.messageId, body.id);
    }
    const index = await redis.hgetall(`${keyPrefix}:v1:dead-letters:{${exchange}}`);
    const counted = Object.values(index).reduce((a, b) => a + Number(b), 0);
    assert.equal(counted, 6, "every confirmed dead letter is in the dead-letter index");
    const row = JSON.parse(Object.keys(index)[0]);
    assert.deepEqual(row.slice(0, 5), ["search", "budget_exhausted", "error", "index_document", ""]);
  } finally {
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
    await channel.deleteQueue(exchange);
    await channel.deleteQueue(`${amqpPrefix}.bullmq.${name}`);
    await channel.deleteExchange(exchange);
  }
});

test("without [amqp], a denied job stays in BullMQ's failed set with the reason; a granted one can succeed", async () => {
  const { budget } = setup({ floor: 1 });
  const name = `bq-${randomHex()}`;
  const queue = new Queue(name, { connection: connection() });
  const processor = budgeted(budget, async (job) => {
    if (job.data.flaky && job.attemptsStarted === 1) throw new Error("first try fails");
    if (job.data.flaky) return "ok";
    throw new Error("always fails");
  });
  const worker = new Worker(name, processor, { connection: connection() });
  try {
    await queue.add("index_document", { flaky: true }, { jobId: "flaky" });
    await waitFor("the flaky job completed", async () => (await queue.getJobCounts("completed")).completed === 1, 20_000);
    const done = await queue.getJob("flaky");
    assert.equal(done.returnvalue, "ok");
    assert.equal(done.attemptsStarted, 2, "retried once, by the budget, whatever the job's own attempts");
    await queue.add("index_document", {}, { jobId: "doomed" });
    await waitFor("the doomed job failed", async () => (await queue.getJobCounts("failed")).failed === 1, 20_000);
    const doomed = await queue.getJob("doomed");
    assert.equal(doomed.failedReason, "fleet-budget: budget_exhausted: always fails");
    assert.equal(doomed.attemptsStarted, 1, "the floor of 1 went to the flaky job");
  } finally {
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
  }
});

test("a dead letter the broker does not confirm leaves the job to run again, never lost", async () => {
  const amqpPrefix = `fbnode-${randomHex()}`;
  const exchange = `${amqpPrefix}.dead`;
  const { budget } = setup({ amqpPrefix, floor: 0 });
  const name = `bq-${randomHex()}`;
  const queue = new Queue(name, { connection: connection() });
  let runs = 0;
  const processor = budgeted(budget, async () => {
    runs += 1;
    throw new Error("down");
  });
  const warn = console.warn;
  console.warn = () => {};
  const worker = new Worker(name, processor, { connection: connection() });
  try {
    await queue.add("index_document", {}, { jobId: "only" });
    // No exchange yet: the publish is refused (404), the job goes back to wait.
    await waitFor("a second run", async () => runs >= 2, 20_000);
    assert.equal((await queue.getJobCounts("failed")).failed, 0);
    await channel.assertExchange(exchange, "fanout", { durable: true });
    await channel.assertQueue(exchange, { durable: true });
    await channel.bindQueue(exchange, exchange, "");
    await waitFor("the job dead-lettered", async () => (await queue.getJobCounts("failed")).failed === 1, 20_000);
    const got = await waitFor("its dead letter", async () => {
      const m = await dead(exchange);
      return m.length > 0 ? m : null;
    });
    assert.equal(got.length, 1);
    assert.equal(got[0].properties.headers["fb-reason"], "budget_exhausted");
    console.log(`runs before the exchange existed and after: ${runs}`);
  } finally {
    console.warn = warn;
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
    await channel.deleteQueue(exchange).catch(() => {});
    await channel.deleteQueue(`${amqpPrefix}.bullmq.${name}`).catch(() => {});
    await channel.deleteExchange(exchange).catch(() => {});
  }
});
