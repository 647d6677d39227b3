// The worker registry, the concurrency budget and the circuit breaker in Node, on private
// redis-servers and the shared scripts: a Node worker's report as the Rust reader reads it (its
// fields, its fallback, gone on close); a retry refused a slot at the cap and admitted once one
// is given back, leases seen in Redis; a breaker opened by failures holds calls, half-opens after
// its open period and closes on probe successes; and BullMQ jobs under a cap of one, held without
// spending an attempt (every job's first attempt deposited once, none run beside another).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Queue, Worker } from "bullmq";
import { Config, Failure, FleetBudget } from "../dist/index.js";
import { budgeted } from "../dist/bullmq.js";
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

function budgetOf(section, { heartbeat = 0, url = server.url } = {}) {
  const keyPrefix = `fbadm${randomHex()}`;
  const config = Config.fromToml(`
[redis]
url = "${url}"
key_prefix = "${keyPrefix}"
timeout_ms = 500
heartbeat_ms = ${heartbeat}
deposit_flush_ms = 0

[dependencies.search]
ratio = 0.0
min_allowance = 5
tasks = ["index_document"]
${section}
`);
  return { keyPrefix, budget: new FleetBudget(config, { log: quiet }) };
}

test("the configuration reads concurrency and breaker sections with the Rust library's ranges", () => {
  const { budget } = budgetOf(`
[dependencies.search.concurrency]
cap = 10
planned_primary = 8
lease_secs = 5

[dependencies.search.breaker]
min_volume = 4
open_secs = 2
half_open_probes = 2
`);
  assert.deepEqual(budget.config.concurrency.get("search"), {
    cap: 10, maxRetryFraction: 0.25, minRetrySlots: 3, leaseMs: 5000, primaryWaits: false, maxWaitMs: 600_000,
  });
  assert.equal(budget.config.breakers.get("search").closeAfter, 2);
  void budget.close();
  assert.throws(() => Config.fromToml(`
[dependencies.search]
min_allowance = 1
[dependencies.search.concurrency]
cap = 0
[dependencies.search.breaker]
half_open_probes = 3
`), (e) => /dependencies\.search\.concurrency\.cap.*1 to 1000000000/s.test(e.message)
    && /dependencies\.search\.concurrency\.planned_primary/.test(e.message)
    && /half_open_probes.*at most min_allowance \(1\)/s.test(e.message));
});

test("a Node worker is in the worker registry with lang node, its fallback listed, and leaves on close", async () => {
  const { keyPrefix, budget } = budgetOf("", { heartbeat: 100 });
  const key = `${keyPrefix}:v1:workers:{workers}`;
  try {
    await budget.ready();
    const id = budget.registry.id;
    const report = await waitFor("the first beat", async () => {
      const text = await redis.hget(key, id);
      return text === null ? null : JSON.parse(text);
    });
    assert.deepEqual(Object.keys(report), ["v", "id", "host", "pid", "lang", "version", "started_ms", "interval_ms", "fallback", "fallback_more"]);
    assert.equal(report.lang, "node");
    assert.equal(report.pid, process.pid);
    assert.equal(report.version, "0.2.0");
    assert.equal(report.interval_ms, 100);
    assert.deepEqual(report.fallback, []);
    assert.ok((await redis.zscore(`${key}:seen`, id)) !== null, "its last-seen time");
  } finally {
    await budget.close();
  }
  assert.equal(await redis.hexists(key, budget.registry.id), 0, "gone from the registry on close");
  assert.equal(await redis.zscore(`${key}:seen`, budget.registry.id), null);
});

test("a worker whose store fails reports the dependency in fallback", async () => {
  const other = await startRedis();
  const { keyPrefix, budget } = budgetOf("", { heartbeat: 100, url: other.url });
  const key = `${keyPrefix}:v1:workers:{workers}`;
  const reader = other.client();
  try {
    await budget.ready();
    // The budget's writes refused (Redis's memory full): the dependency goes into the fallback,
    // and the next beat, which Redis takes again once memory is freed, lists it.
    await reader.call("CONFIG", "SET", "maxmemory", "1");
    await reader.call("CONFIG", "SET", "maxmemory-policy", "noeviction");
    await budget.onFailure("index_document", 1, Failure.retryable("503"));
    assert.ok(budget.inFallback, "the spend failed: OOM");
    await reader.call("CONFIG", "SET", "maxmemory", "0");
    const report = await waitFor("a beat listing search", async () => {
      const r = JSON.parse((await reader.hget(key, budget.registry.id)) ?? "null");
      return r?.fallback?.length ? r : null;
    });
    assert.equal(report.fallback[0].dependency, "search");
    assert.ok(report.fallback[0].for_ms >= 0);
  } finally {
    await budget.close();
    reader.disconnect();
    await other.stop();
  }
});

test("the concurrency budget: a retry is refused a slot at the cap and admitted once one is given back", async () => {
  const { keyPrefix, budget } = budgetOf(`
[dependencies.search.concurrency]
cap = 2
max_retry_fraction = 1.0
min_retry_slots = 0
`);
  try {
    await budget.ready();
    const a = await budget.admit("index_document", 1);
    const b = await budget.admit("index_document", 1);
    assert.equal(a.kind, "call");
    assert.ok(a.lease !== null && b.lease !== null);
    assert.equal(await redis.zcard(`${keyPrefix}:v1:{search}:lp`), 2, "two primary leases in Redis");
    const refused = await budget.admit("index_document", 2);
    assert.equal(refused.kind, "dead_letter");
    assert.equal(refused.reason, "concurrency_cap");
    await budget.finish(a, "succeeded");
    const retry = await budget.admit("index_document", 2);
    assert.equal(retry.kind, "call");
    assert.equal(await redis.zcard(`${keyPrefix}:v1:{search}:lr`), 1, "a retry lease");
    assert.equal(await budget.metrics.value("fleet_budget_calls_in_flight", { dependency: "search", kind: "retry" }), 1);
    await budget.finish(retry, "failed");
    await budget.finish(b, "succeeded");
    assert.equal(await redis.zcard(`${keyPrefix}:v1:{search}:lp`), 0);
    assert.equal(await redis.zcard(`${keyPrefix}:v1:{search}:lr`), 0);
  } finally {
    await budget.close();
  }
});

test("the breaker opens on failures, holds calls, half-opens after its open period and closes on probe successes", async () => {
  const { keyPrefix, budget } = budgetOf(`
[dependencies.search.breaker]
min_volume = 4
failure_ratio = 0.5
open_secs = 1
half_open_probes = 2
max_wait_secs = 60
`);
  try {
    await budget.ready();
    for (let i = 0; i < 4; i++) {
      const call = await budget.admit("index_document", 1);
      assert.equal(call.kind, "call");
      await budget.finish(call, "failed");
    }
    assert.equal(await redis.hget(`${keyPrefix}:v1:{search}:cb`, "st"), "1", "open in Redis");
    const held = await budget.admit("index_document", 1);
    assert.equal(held.kind, "hold");
    assert.equal(held.reason, "circuit_open");
    assert.ok(held.pauseMs >= 1000 && held.pauseMs <= 1250, `${held.pauseMs}`);
    const late = await budget.admit("index_document", 1, 60_000);
    assert.equal(late.kind, "dead_letter", "held past max_wait");
    assert.equal(late.reason, "circuit_open");
    await sleep(1100);
    const probes = [await budget.admit("index_document", 1), await budget.admit("index_document", 1)];
    assert.ok(probes.every((p) => p.kind === "call" && p.probe !== null), "two probes, half-open");
    assert.equal((await budget.admit("index_document", 1)).kind, "hold", "every probe out");
    for (const p of probes) await budget.finish(p, "succeeded");
    assert.equal(await redis.hget(`${keyPrefix}:v1:{search}:cb`, "st"), "0", "closed");
    assert.equal((await budget.admit("index_document", 1)).kind, "call");
    assert.equal(await budget.metrics.value("fleet_budget_breaker_transitions_total", { dependency: "search", to: "open" }), 1);
    assert.equal(await budget.metrics.value("fleet_budget_breaker_transitions_total", { dependency: "search", to: "closed" }), 1);
  } finally {
    await budget.close();
  }
});

test("BullMQ jobs under a cap of one run one at a time, held without spending an attempt", async () => {
  const { keyPrefix, budget } = budgetOf(`
[dependencies.search.concurrency]
cap = 1
max_retry_fraction = 0.0
min_retry_slots = 0
primary_waits = true
max_wait_secs = 60
`);
  const connection = { host: "127.0.0.1", port: server.port, maxRetriesPerRequest: null };
  const name = `bqa-${randomHex()}`;
  const queue = new Queue(name, { connection });
  let running = 0;
  let most = 0;
  const attempts = [];
  const processor = budgeted(budget, async (job) => {
    running += 1;
    most = Math.max(most, running);
    await sleep(150);
    running -= 1;
    attempts.push(job.attemptsStarted);
  });
  const worker = new Worker(name, processor, { connection, concurrency: 3 });
  const N = 4;
  try {
    for (let i = 0; i < N; i++) await queue.add("index_document", { i }, { jobId: `j${i}` });
    await waitFor("every job completed", async () => (await queue.getJobCounts("completed")).completed === N, 30_000);
    assert.equal(most, 1, "never two calls at once");
    assert.ok(attempts.some((a) => a > 1), `some jobs were held: BullMQ counted starts ${attempts}`);
    const hash = await redis.hgetall(`${keyPrefix}:v1:{search}`);
    assert.equal(Number(hash.ca), N, "each job's first attempt deposited once, the holds not counted");
    assert.equal(Number(hash.cr ?? 0), 0, "no retry spent");
    assert.equal(await redis.hlen(`${keyPrefix}:v1:bullmq-held:{${name}}`), 0, "no hold left remembered");
    console.log(`cap 1: ${N} jobs, at most ${most} at once, BullMQ starts ${attempts.join(",")}`);
  } finally {
    await worker.close();
    await processor.close();
    await queue.obliterate({ force: true });
    await queue.close();
    await budget.close();
  }
});
