// FleetBudget against a private redis-server: the contract's decision order, the floor granted
// exactly (group commit and deny cache on), the denials answered in the process counted in Redis,
// deposits, the fallback while Redis is gone, NOSCRIPT, a policy conflict, a lost budget restored,
// and the metrics under the Rust library's names.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Config, Failure, FleetBudget, Metrics, ratioText } from "../dist/index.js";
import { randomHex, startRedis } from "./helpers.mjs";

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

/** A budget hash's count of `field` over both windows (a test may cross a window's end). */
async function counted(client, key, field) {
  const [current, previous] = await client.hmget(key, `c${field}`, `p${field}`);
  return Number(current ?? 0) + Number(previous ?? 0);
}

function config(extra = "", url = server.url) {
  const prefix = `fbnode${randomHex()}`;
  return Config.fromToml(`
[redis]
url = "${url}"
key_prefix = "${prefix}"
${extra.includes("timeout_ms") ? "" : "timeout_ms = 2000"}
${extra}

[dependencies.search]
window_secs = 3600
ratio = 0.5
min_allowance = 10
tasks = ["index_document"]
`);
}

test("ratios are sent as the Rust library writes them", () => {
  assert.equal(ratioText(0.2), "0.2");
  assert.equal(ratioText(1), "1");
  assert.equal(ratioText(1e-7), "0.0000001");
  assert.equal(ratioText(2.5e-10), "0.00000000025");
  assert.equal(ratioText(10), "10");
});

test("an exhausted budget grants exactly its floor to 200 concurrent failures, and Redis counts every denial", async () => {
  const metrics = new Metrics(undefined, quiet);
  const budget = new FleetBudget(config(), { metrics, log: quiet });
  assert.ok(await budget.ready());
  await redis.call("CONFIG", "RESETSTAT");
  const decisions = await Promise.all(Array.from({ length: 200 }, () => budget.onFailure("index_document", 1, Failure.retryable("503"))));
  const granted = decisions.filter((d) => d.kind === "retry");
  assert.equal(granted.length, 10);
  for (const d of decisions.filter((d) => d.kind === "dead_letter")) assert.equal(d.reason, "budget_exhausted");
  const sources = new Set(decisions.map((d) => d.source));
  assert.deepEqual([...sources], ["fleet"]);
  const calls = Number(/cmdstat_evalsha:calls=(\d+),/.exec(await redis.call("INFO", "commandstats"))[1]);
  console.log(`200 concurrent decisions in ${calls} store calls (group commit)`);
  assert.ok(calls < 200, "decisions that arrive while one is in flight go together");
  // Later ones, one at a time: the deny cache answers while the denial stands.
  for (let i = 0; i < 20; i++) {
    const d = await budget.onFailure("index_document", 1, Failure.retryable("503"));
    assert.equal(d.kind, "dead_letter");
  }
  const inProcess = await metrics.value("fleet_budget_retries_denied_in_process_total", { dependency: "search" });
  assert.ok(inProcess > 0, "the deny cache answered some");
  assert.equal(await budget.close(), 0);
  const key = `${budget.config.redis.keyPrefix}:v1:{search}`;
  assert.equal(await counted(redis, key, "r"), 10);
  assert.equal(await counted(redis, key, "d"), 210, "every denial, those answered in the process included, is counted in Redis");
  assert.equal(await metrics.value("fleet_budget_retries_granted_total", { dependency: "search" }), 10);
  assert.equal(await metrics.value("fleet_budget_retries_denied_total", { dependency: "search" }), 210);
  assert.equal(await metrics.value("fleet_budget_dead_letters_total", { dependency: "search", reason: "budget_exhausted" }), 210);
});

test("the decision order: not retryable, then the ceiling, then a Retry-After past max_delay, each without spending", async () => {
  const budget = new FleetBudget(config(`
[tasks.index_document]
max_attempts = 3
max_delay_secs = 60
`), { log: quiet });
  await budget.ready();
  let d = await budget.onFailure("index_document", 1, Failure.nonRetryable("400"));
  assert.deepEqual([d.kind, d.reason, d.source], ["dead_letter", "non_retryable", "not_consulted"]);
  d = await budget.onFailure("index_document", 3, Failure.retryable("503"));
  assert.deepEqual([d.kind, d.reason], ["dead_letter", "attempts_exhausted"]);
  d = await budget.onFailure("index_document", 1, Failure.after(120_000, "429"));
  assert.deepEqual([d.kind, d.reason], ["dead_letter", "delay_exceeded"]);
  d = await budget.onFailure("index_document", 2, Failure.after(30_000, "429"));
  assert.equal(d.kind, "retry");
  assert.equal(d.delayMs, 30_000, "a Retry-After is a lower bound of the delay");
  assert.equal(d.nextAttempt, 3);
  const key = `${budget.config.redis.keyPrefix}:v1:{search}`;
  assert.equal(await counted(redis, key, "r"), 1, "only the last one spent");
  await budget.close();
});

test("deposits are coalesced, sent within the flush interval, and raise the allowance", async () => {
  const budget = new FleetBudget(config("deposit_flush_ms = 50"), { log: quiet });
  await budget.ready();
  for (let i = 0; i < 40; i++) {
    await budget.onAttempt("index_document", 1);
    await budget.onSuccess("index_document");
  }
  const key = `${budget.config.redis.keyPrefix}:v1:{search}`;
  for (let i = 0; i < 100 && (await counted(redis, key, "s")) < 40; i++) await sleep(20);
  assert.equal(await counted(redis, key, "s"), 40);
  assert.equal(await counted(redis, key, "a"), 40);
  const [snap, source] = await budget.status("search");
  assert.equal(source, "fleet");
  assert.equal(snap.allowance, 20, "floor(0.5 x 40)");
  await budget.close();
});

test("NOSCRIPT: the scripts are loaded again after SCRIPT FLUSH, with EVALSHA, never EVAL", async () => {
  const budget = new FleetBudget(config(), { log: quiet });
  await budget.ready();
  await redis.call("CONFIG", "RESETSTAT");
  await redis.call("SCRIPT", "FLUSH");
  const d = await budget.onFailure("index_document", 1, Failure.retryable("503"));
  assert.equal(d.kind, "retry");
  assert.equal(d.source, "fleet");
  const stats = await redis.call("INFO", "commandstats");
  assert.match(stats, /cmdstat_evalsha:calls=2,/);
  assert.match(stats, /cmdstat_script\|load:calls=1,/);
  assert.doesNotMatch(stats, /cmdstat_eval:/);
  await budget.close();
});

test("a policy conflict is served by the policy in force and counted", async () => {
  const first = config();
  const prefix = first.redis.keyPrefix;
  const other = Config.fromToml(`
[redis]
url = "${server.url}"
key_prefix = "${prefix}"
timeout_ms = 2000
[dependencies.search]
ratio = 0.25
min_allowance = 3
tasks = ["index_document"]
`);
  const a = new FleetBudget(first, { log: quiet });
  const metrics = new Metrics(undefined, quiet);
  const b = new FleetBudget(other, { log: quiet, metrics });
  await a.ready();
  await b.ready();
  await a.onFailure("index_document", 1, Failure.retryable("503"));
  const d = await b.onFailure("index_document", 1, Failure.retryable("503"));
  assert.equal(d.kind, "retry");
  assert.equal(d.snapshot.allowance, 10, "the floor in force, not the caller's 3");
  assert.equal(d.snapshot.control.conflict, true);
  assert.equal(await metrics.value("fleet_budget_policy_conflicts_total", { dependency: "search" }), 1);
  await a.close();
  await b.close();
});

test("a budget hash lost mid-window (FLUSHALL) is restored from this process's memory", async () => {
  const metrics = new Metrics(undefined, quiet);
  const budget = new FleetBudget(config("deny_cache_ms = 0"), { log: quiet, metrics });
  await budget.ready();
  for (let i = 0; i < 10; i++) assert.equal((await budget.onFailure("index_document", 1, Failure.retryable("x"))).kind, "retry");
  await redis.flushall();
  const d = await budget.onFailure("index_document", 1, Failure.retryable("x"));
  assert.equal(d.kind, "dead_letter", "the 10 retries granted before the loss still count");
  assert.equal(d.snapshot.control.lost, true);
  assert.equal(await metrics.value("fleet_budget_budget_lost_total", { dependency: "search" }), 1);
  await budget.close();
});

test("Redis gone: the local fallback decides within the deadline, deposits wait, and Redis takes over again", async () => {
  const own = await startRedis();
  const metrics = new Metrics(undefined, quiet);
  const budget = new FleetBudget(config("timeout_ms = 100\ndeposit_flush_ms = 50", own.url), { log: quiet, metrics });
  await budget.ready();
  assert.equal((await budget.onFailure("index_document", 1, Failure.retryable("x"))).source, "fleet");
  await own.stop();
  const started = performance.now();
  const d = await budget.onFailure("index_document", 1, Failure.retryable("x"));
  console.log(`first decision with Redis gone: ${(performance.now() - started).toFixed(1)} ms`);
  assert.equal(d.kind, "retry");
  assert.equal(d.source, "local_fallback");
  assert.equal(await metrics.value("fleet_budget_fallback_active", { dependency: "search" }), 1);
  assert.ok(await metrics.value("fleet_budget_fallback_decisions_total", { mode: "local" }) >= 1);
  assert.ok((await metrics.value("fleet_budget_store_errors_total", { kind: "connection" })) >= 1);
  await budget.onSuccess("index_document");
  await budget.flush();
  assert.equal(budget.pendingDeposits(), 1, "a deposit refused by a dead connection is kept");
  const again = await startRedis([], own.port);
  try {
    await budget.ready();
    await sleep(250); // the probe interval
    const back = await budget.onFailure("index_document", 1, Failure.retryable("x"));
    assert.equal(back.source, "fleet");
    assert.equal(await metrics.value("fleet_budget_fallback_active", { dependency: "search" }), 0);
    await budget.close();
    const probe = again.client();
    assert.equal(await counted(probe, `${budget.config.redis.keyPrefix}:v1:{search}`, "s"), 1, "the kept deposit reached Redis");
    probe.disconnect();
  } finally {
    await again.stop();
  }
});

test("a Redis that does not answer within redis.timeout_ms: the fallback decides, the error counted as a timeout", async () => {
  const own = await startRedis();
  const metrics = new Metrics(undefined, quiet);
  const budget = new FleetBudget(config("timeout_ms = 100", own.url), { log: quiet, metrics });
  const probe = own.client();
  try {
    await budget.ready();
    await probe.call("CLIENT", "PAUSE", "1500", "WRITE");
    const d = await budget.onFailure("index_document", 1, Failure.retryable("x"));
    assert.equal(d.source, "local_fallback");
    assert.equal(await metrics.value("fleet_budget_store_errors_total", { kind: "timeout" }), 1);
  } finally {
    await budget.close();
    probe.disconnect();
    await own.stop();
  }
});

test("the configuration refuses what the Rust library refuses, naming the key", () => {
  assert.throws(() => Config.fromToml("[redis]\ntimeout = 5\n"), /unknown field `timeout` in `redis`/);
  assert.throws(() => Config.fromToml("[defaults]\nratio = 11.0\n"), /defaults.ratio = 11: must be a finite number from 0 to 10/);
  assert.throws(() => Config.fromToml("[defaults]\nwindow_secs = 60.0\n"), /invalid type for `defaults.window_secs`/);
  assert.throws(() => Config.fromToml('[dependencies."a{b"]\n'), /dependency name contains U\+007B/);
  assert.throws(() => Config.fromToml('[redis]\nkey_prefix = "a b"\n'), /redis.key_prefix/);
  assert.throws(() => Config.fromToml('[redis]\nurl = "redis://user:hunter2@h:6379#x"\n'), (e) => !e.message.includes("hunter2"));
  assert.throws(() => Config.fromToml('[dependencies.a]\ntasks = ["t"]\n[dependencies.b]\ntasks = ["t"]\n'), /already mapped to dependency "a"/);
  const c = Config.fromToml('[amqp]\nprefix = "fleetx"\nurl = "amqp://guest:guest@127.0.0.1:5672"\nexchange_durable = true\n[defaults]\nwindow_secs = 30\n[dependencies.s]\ndeposit = "request"\n');
  assert.equal(c.deadLetterExchange, "fleetx.dead");
  assert.equal(c.policy("s").windowMs, 30_000);
  assert.equal(c.policy("s").deposit, "request");
  assert.equal(c.policy("other").windowMs, 30_000);
});
