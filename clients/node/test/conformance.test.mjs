// The contract's conformance vectors (lua/conformance/README.md), run with this package's shipped
// scripts on a private redis-server: its scripts hash to lua/SHA1SUMS, every vector's replies are
// the recorded ones, and a vector changed by one byte of a reply fails at that step.
//
// The vectors are read from the repository (FLEET_BUDGET_REPO, default the checkout this package
// is in); their absence fails the test.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Script, scriptText } from "../dist/index.js";
import { PACKAGE, REPO, randomHex, startRedis } from "./helpers.mjs";

const VECTORS = join(REPO, "lua", "conformance", "vectors");
const CLOCK = "redis.call('TIME')";
const FILE_KEYS = ["about", "format", "vectors"];
const VECTOR_KEYS = ["about", "name", "steps"];
const STEP_KEYS = new Set(["script", "keys", "args", "now_ms", "redis", "reply", "error", "error_prefix"]);

/** A step whose answer is not the vector's. */
export class Mismatch extends Error {}

function vectorFiles() {
  const files = readdirSync(VECTORS).filter((f) => f.endsWith(".json")).sort();
  assert.ok(files.length > 0, `no vectors in ${VECTORS}`);
  return files;
}

function load(file) {
  const doc = JSON.parse(readFileSync(join(VECTORS, file), "utf8"));
  assert.deepEqual(Object.keys(doc).sort(), FILE_KEYS, `${file}: not a vector file`);
  assert.equal(doc.format, 1, `${file}: format ${doc.format}, this runner reads 1`);
  for (const vector of doc.vectors) {
    assert.deepEqual(Object.keys(vector).sort(), VECTOR_KEYS, `${file}: vector keys ${Object.keys(vector)}`);
    vector.steps.forEach((step, i) => {
      const keys = Object.keys(step);
      const expectations = keys.filter((k) => k === "reply" || k === "error" || k === "error_prefix");
      assert.ok(keys.every((k) => STEP_KEYS.has(k)) && expectations.length === 1 && ("script" in step) !== ("redis" in step),
        `${file}: ${JSON.stringify(vector.name)} step ${i}: bad step ${keys}`);
    });
  }
  return doc;
}

function clocked(text, nowMs) {
  assert.equal(text.split(CLOCK).length - 1, 1, "the script does not read the clock exactly once");
  return text.replace(CLOCK, `{'${Math.floor(nowMs / 1000)}', '${(nowMs % 1000) * 1000}'}`);
}

function subst(value, prefix) {
  if (typeof value === "string") return value.replaceAll("$P", prefix);
  if (Array.isArray(value)) return value.map((v) => subst(v, prefix));
  return value;
}

function matches(expected, got) {
  if (expected !== null && typeof expected === "object" && !Array.isArray(expected)) {
    return Object.keys(expected).length === 1 && expected.any_integer === true && Number.isInteger(got);
  }
  if (Array.isArray(expected)) {
    return Array.isArray(got) && got.length === expected.length && expected.every((e, i) => matches(e, got[i]));
  }
  if (typeof expected === "boolean" || typeof got === "boolean") return false;
  return typeof expected === typeof got && expected === got;
}

/** Runs the steps in order; throws Mismatch at the first answer that is not the vector's. */
export async function runVector(redis, vector, prefix) {
  for (const [i, step] of vector.steps.entries()) {
    let got = null;
    let error = null;
    try {
      if ("script" in step) {
        let text = scriptText(step.script);
        if ("now_ms" in step) text = clocked(text, step.now_ms);
        const keys = subst(step.keys, prefix);
        got = await redis.call("EVAL", text, keys.length, ...keys, ...subst(step.args, prefix));
      } else {
        got = await redis.call(...subst(step.redis, prefix));
      }
    } catch (e) {
      if (e?.name !== "ReplyError") throw e;
      // Redis's own errors start "ERR ", which the vectors leave out.
      error = e.message.startsWith("ERR ") ? e.message.slice(4) : e.message;
    }
    const where = `${JSON.stringify(vector.name)} step ${i}`;
    if ("reply" in step) {
      if (error !== null) throw new Mismatch(`${where}: expected a reply, got the error ${JSON.stringify(error)}`);
      const expected = subst(step.reply, prefix);
      if (!matches(expected, got)) throw new Mismatch(`${where}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(got)}`);
    } else {
      if (error === null) throw new Mismatch(`${where}: expected an error, got ${JSON.stringify(got)}`);
      if ("error" in step && error !== subst(step.error, prefix)) {
        throw new Mismatch(`${where}: expected the error ${JSON.stringify(subst(step.error, prefix))}, got ${JSON.stringify(error)}`);
      }
      if ("error_prefix" in step && !error.startsWith(subst(step.error_prefix, prefix))) {
        throw new Mismatch(`${where}: expected an error starting ${JSON.stringify(step.error_prefix)}, got ${JSON.stringify(error)}`);
      }
    }
  }
  return vector.steps.length;
}

async function clean(redis, prefix) {
  let cursor = "0";
  do {
    const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
    if (keys.length > 0) await redis.del(...keys);
    cursor = next;
  } while (cursor !== "0");
}

/** A small deterministic generator (the mutations are the same on every run). */
function rng(seed) {
  let s = [...seed].reduce((h, c) => (Math.imul(h, 31) + c.charCodeAt(0)) >>> 0, 2166136261);
  return () => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return s / 2 ** 32;
  };
}

/** The expectation with one byte of its JSON text changed (a digit or a letter). */
function mutate(reply, random) {
  const text = JSON.stringify(reply);
  const spots = [...text].flatMap((ch, i) => (/[A-Za-z0-9]/.test(ch) ? [i] : []));
  for (let n = 0; n < 100; n++) {
    const i = spots[Math.floor(random() * spots.length)];
    const ch = text[i];
    const changed = text.slice(0, i) + (/[0-9]/.test(ch) ? String((Number(ch) + 1) % 10) : ch === "x" ? "y" : "x") + text.slice(i + 1);
    try {
      const value = JSON.parse(changed);
      if (JSON.stringify(value) !== text) return value;
    } catch {
      // not JSON any more: another spot
    }
  }
  throw new Error(`no one-byte change of ${text}`);
}

let server;
let redis;

before(async () => {
  server = await startRedis();
  redis = server.client();
});

after(async () => {
  redis?.disconnect();
  await server?.stop();
});

test("the shipped scripts hash to lua/SHA1SUMS, and Redis agrees", async () => {
  const lines = readFileSync(join(REPO, "lua", "SHA1SUMS"), "utf8").trim().split("\n");
  const shipped = readdirSync(join(PACKAGE, "lua")).filter((f) => f.endsWith(".lua"));
  assert.equal(lines.length, shipped.length, "SHA1SUMS names every script the package ships");
  for (const line of lines) {
    const [digest, file] = line.split(/\s+/);
    const name = file.replace(/\.lua$/, "");
    const text = scriptText(name);
    assert.equal(createHash("sha1").update(text, "utf8").digest("hex"), digest, file);
    assert.equal(new Script(name).sha, digest, file);
    assert.equal(await redis.call("SCRIPT", "LOAD", text), digest, file);
  }
});

for (const file of vectorFiles()) {
  test(`vectors: ${file}`, async () => {
    const doc = load(file);
    const run = randomHex();
    let steps = 0;
    for (const [n, vector] of doc.vectors.entries()) {
      const prefix = `fbconf-node-${run}-${n}`;
      try {
        steps += await runVector(redis, vector, prefix);
      } finally {
        await clean(redis, prefix);
      }
    }
    console.log(`${file}: ${doc.vectors.length} vectors, ${steps} steps passed`);
  });

  test(`vectors: ${file}, an answer changed by one byte fails at its step`, async () => {
    const doc = load(file);
    const random = rng(file);
    for (const [n, vector] of doc.vectors.entries()) {
      const answers = vector.steps.flatMap((s, i) => ["reply", "error", "error_prefix"]
        .filter((k) => k in s && /[A-Za-z0-9]/.test(JSON.stringify(s[k]))).map((k) => [i, k]));
      const [i, k] = answers[Math.floor(random() * answers.length)];
      const changed = structuredClone(vector);
      changed.steps[i][k] = mutate(vector.steps[i][k], random);
      const prefix = `fbconf-node-mut-${randomHex()}-${n}`;
      try {
        await assert.rejects(runVector(redis, changed, prefix), (e) => e instanceof Mismatch && e.message.includes(`step ${i}:`),
          `${vector.name}: step ${i} changed to ${JSON.stringify(changed.steps[i][k])} was not caught`);
      } finally {
        await clean(redis, prefix);
      }
    }
  });
}
