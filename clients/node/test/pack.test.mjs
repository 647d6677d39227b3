// The package as users get it: `npm pack`, the tarball installed into a fresh project with npm,
// then imported (ESM), type-checked (its .d.ts), and run against a private redis-server, where
// Redis holds its scripts under the SHA1s of lua/SHA1SUMS.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PACKAGE, startRedis } from "./helpers.mjs";

let server;
let dir;

before(async () => {
  server = await startRedis();
  dir = mkdtempSync(join(tmpdir(), "fleet-budget-node-pack-"));
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const run = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, encoding: "utf8", timeout: 300_000, stdio: ["ignore", "pipe", "pipe"] });

test("the npm tarball installs into a fresh project and works there", () => {
  // Packed from the build scripts/test made (its `prepack`, the build, is skipped: other tests
  // of the run import dist/ meanwhile).
  const packed = JSON.parse(run("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", dir], PACKAGE));
  const tarball = join(dir, packed[0].filename);
  const files = packed[0].files.map((f) => f.path);
  assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts") && files.includes("dist/bullmq.js"));
  assert.ok(files.includes("lua/spend.lua") && files.includes("lua/deposit.lua"));
  assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/") || f.startsWith("node_modules/")), files.join(", "));

  const app = join(dir, "app");
  run("mkdir", ["-p", app], dir);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true }));
  run("npm", ["install", "--no-audit", "--no-fund", tarball], app);
  const installed = join(app, "node_modules", "@fleet-budget", "client");
  assert.deepEqual(readdirSync(join(installed, "lua")).sort(), readdirSync(join(PACKAGE, "lua")).sort());

  writeFileSync(join(app, "fleet-budget.toml"), `
[redis]
url = "${server.url}"
key_prefix = "fbpack"
timeout_ms = 2000

[dependencies.search]
ratio = 0.2
min_allowance = 2
tasks = ["index_document"]
`);
  writeFileSync(join(app, "main.mjs"), `
import { FleetBudget, Failure } from "@fleet-budget/client";
const budget = await FleetBudget.fromConfig("fleet-budget.toml");
const kinds = [];
for (let i = 0; i < 3; i++) kinds.push((await budget.onFailure("index_document", 1, Failure.retryable("503"))).kind);
await budget.onSuccess("index_document");
console.log(JSON.stringify({ kinds, unsent: await budget.close() }));
`);
  const out = JSON.parse(run("node", ["main.mjs"], app).trim());
  assert.deepEqual(out, { kinds: ["retry", "retry", "dead_letter"], unsent: 0 });

  // Its types, as a TypeScript user of the package sees them.
  writeFileSync(join(app, "check.ts"), `
import { FleetBudget, Failure, type Decision } from "@fleet-budget/client";
export async function decide(budget: FleetBudget): Promise<number> {
  const d: Decision = await budget.onFailure("t", 1, Failure.retryable("x"));
  return d.kind === "retry" ? d.delayMs : 0;
}
`);
  writeFileSync(join(app, "tsconfig.json"), JSON.stringify({ compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", strict: true, noEmit: true, skipLibCheck: true, types: [] }, files: ["check.ts"] }));
  run("node", [join(PACKAGE, "node_modules", "typescript", "bin", "tsc"), "-p", "."], app);

  // The shipped scripts' SHA1s (conformance.test.mjs holds them to lua/SHA1SUMS): loaded as they are.
  const sha = (name) => createHash("sha1").update(readFileSync(join(installed, "lua", name))).digest("hex");
  const exists = run("redis-cli", ["-p", String(server.port), "SCRIPT", "EXISTS", sha("spend.lua"), sha("deposit.lua")], dir);
  assert.equal(exists.trim(), "1\n1");
});
