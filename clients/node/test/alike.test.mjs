// The Node.js client and the Python client decide alike: the same random sequence of attempts,
// successes and failures (three tasks, two of them mapped to dependencies with policies of their
// own, one unmapped) is run by both against one private redis-server, each under its own key
// prefix, and every decision (retry or dead letter, the reason, the next attempt, the source, the
// snapshot) must be equal; the delays, drawn with jitter, must both lie in the nominal's bounds.
// tests/python_client.rs holds the Python client to the Rust library the same way.
//
// Needs the Python of scripts/test (FLEET_BUDGET_PYTHON, or .venv at the repository's root).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { Config, Failure, FleetBudget } from "../dist/index.js";
import { REPO, randomHex, startRedis } from "./helpers.mjs";

const DRIVER = `
import json, sys
from fleet_budget import Config, DeadLetter, Failure, FleetBudget
budget = FleetBudget(Config.from_toml(sys.argv[1]), seed=1)
def snap(s):
    if s is None:
        return None
    c, k = s.current, s.control
    return [s.allowance, s.window_index, c.successes, c.first_attempts, c.retries, c.denied,
            int(k.conflict), int(k.frozen), int(k.overridden)]
for line in sys.stdin:
    op = json.loads(line)
    if op[0] == "attempt":
        budget.on_attempt(op[1], op[2]); out = None
    elif op[0] == "success":
        budget.on_success(op[1]); out = None
    else:
        _, task, attempt, kind, after = op
        failure = {"retryable": Failure.retryable("x"), "non_retryable": Failure.non_retryable("x"),
                   "after": Failure.after(after, "x")}[kind]
        d = budget.on_failure(task, attempt, failure)
        if isinstance(d, DeadLetter):
            out = ["dead", d.reason, d.source, snap(d.snapshot)]
        else:
            out = ["retry", d.next_attempt, d.source, snap(d.snapshot), d.delay]
    print(json.dumps(out), flush=True)
budget.close()
`;

function text(url, prefix) {
  // Deposits sent at once (deposit_flush_ms = 0), so that each language's next decision sees them;
  // the deny cache off, so that every decision is the store's.
  return `
[redis]
url = "${url}"
key_prefix = "${prefix}"
timeout_ms = 2000
deposit_flush_ms = 0
deny_cache_ms = 0
heartbeat_ms = 0

[defaults]
max_attempts = 6
backoff_base_ms = 100
backoff_cap_ms = 5000

[dependencies.search]
window_secs = 3600
ratio = 0.3
min_allowance = 4
tasks = ["index", "reindex"]

[dependencies.billing]
window_secs = 3600
ratio = 0.1
min_allowance = 1
deposit = "request"
mode = "fixed"
tasks = ["charge"]

[tasks.charge]
class = "paid"
`;
}

function snap(s) {
  if (s === null) return null;
  const c = s.current;
  const k = s.control;
  return [s.allowance, s.windowIndex, c.successes, c.firstAttempts, c.retries, c.denied, Number(k.conflict), Number(k.frozen), Number(k.overridden)];
}

let server;

before(async () => {
  server = await startRedis();
});

after(async () => {
  await server?.stop();
});

test("the same random sequence gets the same decisions from the Node.js and the Python clients", async () => {
  const python = process.env.FLEET_BUDGET_PYTHON ?? join(REPO, ".venv", "bin", "python");
  assert.ok(existsSync(python), `no Python at ${python}: scripts/test makes .venv (or set FLEET_BUDGET_PYTHON)`);
  const run = randomHex();
  const budget = new FleetBudget(Config.fromToml(text(server.url, `fbalike-js-${run}`)), { log: { warn() {}, info() {}, error() {} } });
  await budget.ready();
  const child = spawn(python, ["-c", DRIVER, text(server.url, `fbalike-py-${run}`)], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const ask = async (op) => {
    child.stdin.write(`${JSON.stringify(op)}\n`);
    const { value } = await lines.next();
    return JSON.parse(value);
  };
  let seed = 7;
  const random = (n) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return (seed >>> 8) % n;
  };
  const counts = { retry: 0, dead: 0 };
  try {
    for (let step = 0; step < 300; step++) {
      const task = ["index", "reindex", "charge", "lone"][random(4)];
      const roll = random(10);
      if (roll <= 2) {
        const attempt = 1 + random(2);
        await budget.onAttempt(task, attempt);
        assert.equal(await ask(["attempt", task, attempt]), null);
      } else if (roll <= 4) {
        await budget.onSuccess(task);
        assert.equal(await ask(["success", task]), null);
      } else {
        const attempt = 1 + random(9);
        const kind = ["non_retryable", "after", "retryable", "retryable", "retryable", "retryable"][random(6)];
        const after = kind === "after" ? random(5) : 0;
        const failure = kind === "non_retryable" ? Failure.nonRetryable("x") : kind === "after" ? Failure.after(after * 1000, "x") : Failure.retryable("x");
        const d = await budget.onFailure(task, attempt, failure);
        const theirs = await ask(["failure", task, attempt, kind, after]);
        const where = `step ${step}: ${task} attempt ${attempt} ${kind}`;
        if (d.kind === "dead_letter") {
          assert.deepEqual(theirs, ["dead", d.reason, d.source, snap(d.snapshot)], where);
          counts.dead += 1;
        } else {
          assert.deepEqual(theirs.slice(0, 4), ["retry", d.nextAttempt, d.source, snap(d.snapshot)], where);
          const nominal = budget.config.ceiling(task).backoff.nominal(attempt);
          const low = Math.max(nominal * 0.75, after * 1000);
          for (const [who, ms] of [["node", d.delayMs], ["python", theirs[4] * 1000]]) {
            assert.ok(ms >= low - 1 && ms <= Math.max(nominal * 1.25, after * 1000) + 1, `${where}: ${who} delay ${ms} ms, nominal ${nominal}`);
          }
          counts.retry += 1;
        }
      }
    }
  } finally {
    child.stdin.end();
    await budget.close();
  }
  console.log(`alike: ${counts.retry} retries, ${counts.dead} dead letters`);
  assert.ok(counts.retry > 10 && counts.dead > 10, "both outcomes exercised");
});
