// The worker registry, written (the Rust `budget/heartbeat.rs`; the Python client's
// registry.py): every `redis.heartbeat_ms` (default 5 s; 0 is off) a budget sends this worker's
// report with `lua/heartbeat.lua`, so that tools (`budgetctl workers`, `budgetctl status`, the
// console) list the Node workers beside the Rust and Python ones, and which dependencies each
// decides from its fallback, which only the worker's own metrics show otherwise.
//
// The registry never affects a decision: a beat that fails is not a store failure (no dependency
// goes into the fallback for it), is logged once per run of failures, and waits no longer than
// any store call (the client's command timeout). `leave()` (from `FleetBudget.close()`) takes the
// worker out, so a stopped worker is gone rather than silent; one that is killed stops being
// refreshed, and readers call it silent after three beats.
//
// The report is the Rust library's, version 1, with `"lang":"node"`, at most MAX_REPORT_BYTES:
//
//     {"v":1,"id":"web-1-4242-9f3a","host":"web-1","pid":4242,"lang":"node","version":"0.2.0",
//      "started_ms":1764950000000,"interval_ms":5000,
//      "fallback":[{"dependency":"search","for_ms":1200}],"fallback_more":0}

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import type { Redis } from "ioredis";
import { isUnsafeChar, redactText } from "./names.js";
import { Script } from "./scripts.js";

/** The version of the report's JSON. */
export const REPORT_VERSION = 1;
/** The largest report `lua/heartbeat.lua` takes. */
export const MAX_REPORT_BYTES = 4096;
/** Dependencies in fallback listed in one report, at most. */
export const MAX_FALLBACK_LISTED = 64;
/** The longest host name kept in a worker id. */
export const MAX_HOST_BYTES = 160;

const PACKAGE_VERSION: string = (() => {
  try {
    return (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version?: string }).version ?? "unknown";
  } catch {
    return "unknown";
  }
})();

/** How long a worker that stopped beating stays listed: twenty beats, at least ten minutes. */
export function retentionMs(intervalMs: number): number {
  return Math.min(Math.max(intervalMs * 20, 600_000), 7 * 24 * 3600 * 1000);
}

/** `text` without whitespace and the characters names may not hold, cut to `max` bytes. */
export function sanitize(text: string, max: number): string {
  let out = "";
  let size = 0;
  for (const ch of text) {
    if (/\s/u.test(ch) || isUnsafeChar(ch)) continue;
    const n = Buffer.byteLength(ch, "utf8");
    if (size + n > max) break;
    out += ch;
    size += n;
  }
  return out;
}

/** `<prefix>:v1:workers:{workers}` and its `:seen` set (lua/README.md, "Worker registry"). */
export function workersKeys(prefix: string): string[] {
  const reports = `${prefix}:v1:workers:{workers}`;
  return [reports, `${reports}:seen`];
}

/** One worker's entry: its id and report, and the calls that write or remove it. */
export class WorkerRegistry {
  readonly host = sanitize(hostname(), MAX_HOST_BYTES) || "unknown-host";
  readonly id = `${this.host}-${process.pid}-${randomBytes(2).toString("hex")}`;
  readonly startedMs = Date.now();
  private readonly script = new Script("heartbeat");
  private readonly keys: string[];
  private timer: NodeJS.Timeout | null = null;
  private chain: Promise<void> = Promise.resolve();
  private left = false;
  private failing = false;

  constructor(private readonly redis: Redis, prefix: string, readonly intervalMs: number, private readonly timeoutMs: number,
    private readonly fallback: () => Array<[string, number]>, private readonly log: { debug?(m: string): void; warn(m: string): void }) {
    this.keys = workersKeys(prefix);
  }

  /** A beat now, then every interval (the timer does not keep the process alive). */
  start(): void {
    if (this.timer !== null || this.left) return;
    void this.beat();
    this.timer = setInterval(() => void this.beat(), this.intervalMs);
    this.timer.unref();
  }

  /** The report for the dependencies in fallback now (name order, each with how long in ms),
   * the list cut where it would pass MAX_REPORT_BYTES; `fallback_more` counts those left out. */
  report(fallback: Array<[string, number]>): string {
    const head = JSON.stringify({ v: REPORT_VERSION, id: this.id, host: this.host, pid: process.pid, lang: "node", version: PACKAGE_VERSION,
      started_ms: this.startedMs, interval_ms: this.intervalMs }).slice(0, -1);
    const room = MAX_REPORT_BYTES - (Buffer.byteLength(head, "utf8") + 64);
    const entries: string[] = [];
    let size = 1;
    for (const [dependency, forMs] of fallback) {
      const entry = JSON.stringify({ dependency, for_ms: Math.max(0, Math.floor(forMs)) });
      const n = Buffer.byteLength(entry, "utf8");
      if (entries.length === MAX_FALLBACK_LISTED || size + n + 2 > room) break;
      size += n + (entries.length > 0 ? 1 : 0);
      entries.push(entry);
    }
    return `${head},"fallback":[${entries.join(",")}],"fallback_more":${fallback.length - entries.length}}`;
  }

  /** One beat, unless the worker left. Never throws. */
  beat(): Promise<void> {
    this.chain = this.chain.then(async () => {
      if (this.left) return;
      await this.call(["beat", this.id, this.report(this.fallback()), String(retentionMs(this.intervalMs))]);
    });
    return this.chain;
  }

  /** Takes the worker out of the registry; no beat is sent after it. */
  leave(): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.chain = this.chain.then(async () => {
      if (this.left) return;
      this.left = true;
      await this.call(["leave", this.id]);
    });
    return this.chain;
  }

  private async call(args: string[]): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      // Bounded like any store call, whatever the client given (its offline queue included).
      await Promise.race([this.script.run(this.redis, this.keys, args), new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
      })]);
      this.failing = false;
    } catch (e) {
      if (!this.failing) {
        this.failing = true;
        const text = redactText(e instanceof Error ? e.message : String(e));
        (this.log.debug ?? this.log.warn).call(this.log, `fleet-budget: worker registry heartbeat of ${this.id} failed (decisions are unaffected): ${text}`);
      }
    } finally {
      clearTimeout(timer);
    }
  }
}
