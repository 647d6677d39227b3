// The Lua scripts of lua/ as this package calls them: the texts (copies shipped in the package,
// written by scripts/gen-lua), EVALSHA with SCRIPT LOAD on NOSCRIPT (never EVAL), the arguments
// and the reply (lua/README.md, "Arguments" and "Reply"). This is the one module that knows the
// scripts' argument lists.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { Redis } from "ioredis";
import { BudgetPolicy, basisCode } from "./policy.js";
import { BudgetSnapshot, counters } from "./snapshot.js";

export const NAMES = ["spend", "spend_many", "spend_batch", "deposit", "status", "dead_letters", "override"] as const;
export type ScriptName = (typeof NAMES)[number];

/** A script replied with something that is not its documented reply. */
export class BadReply extends Error {
  constructor(readonly script: string, detail: string) {
    super(`${script}.lua gave a bad reply: ${detail}`);
    this.name = "BadReply";
  }
}

const LUA_DIR = fileURLToPath(new URL("../lua/", import.meta.url));

/** The shipped text of `lua/<name>.lua`. */
export function scriptText(name: string): string {
  return readFileSync(`${LUA_DIR}${name}.lua`, "utf8");
}

export function sha1(text: string): string {
  return createHash("sha1").update(text, "utf8").digest("hex");
}

/** One loaded script: EVALSHA, and SCRIPT LOAD then EVALSHA again when the server answers
 * NOSCRIPT (a restart, SCRIPT FLUSH). The text is sent as it is, so Redis caches it under the
 * same SHA1 as every other language's. */
export class Script {
  readonly text: string;
  readonly sha: string;

  constructor(readonly name: string) {
    this.text = scriptText(name);
    this.sha = sha1(this.text);
  }

  async run(redis: Redis, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await redis.call("EVALSHA", this.sha, keys.length, ...keys, ...args);
    } catch (e) {
      if (!(e instanceof Error) || !e.message.startsWith("NOSCRIPT")) throw e;
    }
    const loaded = await redis.call("SCRIPT", "LOAD", this.text);
    if (loaded !== this.sha) throw new BadReply(this.name, `SCRIPT LOAD gave ${String(loaded).slice(0, 64)}, not ${this.sha}`);
    return await redis.call("EVALSHA", this.sha, keys.length, ...keys, ...args);
  }
}

/** The ratio as the Rust library sends it (f64's Display: the shortest round-trip digits, no
 * exponent, no `.0`): `0.2`, `1`, `0.0000001`. */
export function ratioText(ratio: number): string {
  const text = String(ratio);
  const m = /^(\d)(?:\.(\d+))?e([+-]\d+)$/.exec(text);
  if (!m) return text;
  const digits = m[1]! + (m[2] ?? "");
  const exp = Number(m[3]);
  if (exp < 0) return `0.${"0".repeat(-exp - 1)}${digits}`;
  return digits.padEnd(exp + 1, "0");
}

export function budgetKey(prefix: string, dependency: string): string {
  return `${prefix}:v1:{${dependency}}`;
}

export function policyArgs(p: BudgetPolicy): string[] {
  return [ratioText(p.ratio), String(p.minAllowance), basisCode(p), p.mode];
}

export function spendArgs(p: BudgetPolicy, memory: readonly string[] = []): string[] {
  return [String(p.windowMs), ...policyArgs(p), ...memory];
}

export function spendManyArgs(p: BudgetPolicy, n: number, memory: readonly string[] = []): string[] {
  return [String(p.windowMs), String(n), ...policyArgs(p), ...memory];
}

export function depositArgs(p: BudgetPolicy, successes: number, firstAttempts: number, denied = 0, memory: readonly string[] = []): string[] {
  const args = [String(p.windowMs), String(successes), String(firstAttempts), ...policyArgs(p)];
  if (denied > 0 || memory.length > 0) args.push(String(Math.min(denied, 999_999_999_999_999)));
  return [...args, ...memory];
}

function text(script: string, value: unknown, field: number): string {
  if (Buffer.isBuffer(value)) value = value.subarray(0, 1024).toString("utf8");
  if (typeof value !== "string") throw new BadReply(script, `field ${field} is not text: ${String(value).slice(0, 100)}`);
  return value;
}

function integer(script: string, value: unknown, field: number): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new BadReply(script, `field ${field} is not an integer: ${String(value).slice(0, 100)}`);
  }
  return value;
}

export interface Parsed {
  /** 1 or 0 (spend), `g` (spend_many), -1 (deposit, status). */
  readonly granted: number;
  readonly snapshot: BudgetSnapshot;
  readonly inForce: BudgetPolicy;
}

/** granted, the snapshot and the policy in force, from the reply every script starts with: 17
 * fields, then the policy in force (fields 18 to 21) when it is not `caller`'s. */
export function parseReply(script: string, reply: unknown, caller: BudgetPolicy): Parsed {
  if (!Array.isArray(reply)) throw new BadReply(script, `expected an array, got ${typeof reply}`);
  if (reply.length < 17) throw new BadReply(script, `expected at least 17 fields, got ${reply.length}`);
  const v: number[] = [];
  for (let i = 0; i < 17; i++) {
    const value = integer(script, reply[i], i + 1);
    if (i > 0 && value < 0) throw new BadReply(script, `field ${i + 1} is negative: ${value}`);
    v.push(value);
  }
  const windowMs = v[3]!;
  if (windowMs === 0) throw new BadReply(script, "window_ms is 0");
  let inForce: BudgetPolicy;
  if (reply.length >= 21) {
    const floor = integer(script, reply[18], 19);
    if (floor < 0) throw new BadReply(script, `field 19 is negative: ${floor}`);
    const ratioT = text(script, reply[17], 18);
    const basis = text(script, reply[19], 20);
    const mode = text(script, reply[20], 21);
    const ratio = /^[0-9.eE+-]+$/.test(ratioT.trim()) ? Number(ratioT) : NaN;
    if (!(ratio >= 0) || !Number.isFinite(ratio)) throw new BadReply(script, `ratio is not a number >= 0: ${ratioT.slice(0, 100)}`);
    if (basis !== "s" && basis !== "a") throw new BadReply(script, `basis is ${basis.slice(0, 100)}`);
    if (mode !== "sliding" && mode !== "fixed") throw new BadReply(script, `mode is ${mode.slice(0, 100)}`);
    inForce = { windowMs, ratio, minAllowance: floor, deposit: basis === "a" ? "request" : "success", mode };
  } else if (v[14] === 1) {
    throw new BadReply(script, `a conflict without the policy in force (${reply.length} fields)`);
  } else if (windowMs !== caller.windowMs) {
    throw new BadReply(script, `window_ms is ${windowMs}, not the caller's ${caller.windowMs}, without a conflict`);
  } else {
    inForce = caller;
  }
  return {
    granted: v[0]!,
    inForce,
    snapshot: {
      windowMs, windowIndex: v[2]!, elapsedMs: v[4]!, previousWeightMs: v[5]!,
      current: counters(v.slice(6, 10)), previous: counters(v.slice(10, 14)), allowance: v[1]!,
      control: { conflict: v[14] === 1, frozen: v[15] === 1, overridden: v[16] === 1, lost: false },
    },
  };
}

/** A spend reply's last field: ms until one more spend could be granted if nothing changed
 * (null: never without a change); a reply without it says 0 (ask again). */
export function nextGrantMs(script: string, reply: readonly unknown[]): number | null {
  const at = reply.length >= 21 ? 21 : 17;
  if (reply.length <= at) return 0;
  const value = integer(script, reply[at], at + 1);
  if (value === -1) return null;
  if (value < 0) throw new BadReply(script, `field ${at + 1} (next_grant_ms) is ${value}`);
  return value;
}

/** What a reply said of the hash beyond the budget: the six fields a caller with memory gets. */
export interface HashState {
  readonly birth: number;
  readonly freezeUntil: number;
  readonly setUntil: number;
  readonly setRatio: string;
  readonly setMin: string;
  readonly lost: boolean;
}

export const MEMORY_FIELDS = 6;

/** A reply to a caller that sent its memory: the reply as it was, and the six fields after it. */
export function splitMemory(script: string, reply: unknown): [unknown[], HashState] {
  if (!Array.isArray(reply) || reply.length < 17 + MEMORY_FIELDS) {
    throw new BadReply(script, `${Array.isArray(reply) ? reply.length : typeof reply} fields, without the memory fields`);
  }
  const at = reply.length - MEMORY_FIELDS;
  const count = (i: number): number => {
    const value = integer(script, reply[i], i + 1);
    if (value < 0) throw new BadReply(script, `field ${i + 1} is not an integer >= 0: ${value}`);
    return value;
  };
  const number = (i: number): string => {
    const value = text(script, reply[i], i + 1);
    if (value.length > 32 || !/^[!-+\--~]*$/.test(value)) throw new BadReply(script, `field ${i + 1} is not a number: ${value.slice(0, 100)}`);
    return value;
  };
  const state: HashState = {
    birth: count(at), freezeUntil: count(at + 1), setUntil: count(at + 2),
    setRatio: number(at + 3), setMin: number(at + 4), lost: count(at + 5) === 1,
  };
  return [reply.slice(0, at), state];
}
