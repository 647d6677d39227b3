// What the tests share: a private redis-server on a free port (stopped at the end), the
// repository's paths, and the shared RabbitMQ's URL.

import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { Redis } from "ioredis";

export const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
export const REPO = process.env.FLEET_BUDGET_REPO ?? fileURLToPath(new URL("../../..", import.meta.url));
export const AMQP_URL = process.env.FLEET_BUDGET_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";

export async function freePort() {
  return await new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** A redis-server of the test's own, without persistence. `stop()` ends it. */
export async function startRedis(extra = [], port = undefined) {
  port ??= await freePort();
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", ...extra], {
    stdio: "ignore",
  });
  const url = `redis://127.0.0.1:${port}`;
  const probe = new Redis(url, { lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
  probe.on("error", () => {});
  let up = false;
  for (let i = 0; i < 100 && !up; i++) {
    try {
      await probe.connect();
      up = (await probe.ping()) === "PONG";
    } catch {
      await sleep(50);
    }
  }
  probe.disconnect();
  if (!up) {
    child.kill("SIGKILL");
    throw new Error(`redis-server on ${port} did not start`);
  }
  return {
    url,
    port,
    child,
    client: () => new Redis(url),
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

export function randomHex(n = 8) {
  return [...crypto.getRandomValues(new Uint8Array(n / 2))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function waitFor(what, check, ms = 10_000) {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}
