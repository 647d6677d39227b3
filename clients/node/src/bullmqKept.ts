// The BullMQ jobs the budget refused that stay in BullMQ's failed set (no `[amqp]`), recorded
// where `budgetctl replay --bullmq-queue <queue>` finds them, in lists of the fleet's own (never
// BullMQ's keys: its Lua scripts own those):
//
// - `<key_prefix>:v1:bullmq-kept:{<queue>}`: one small JSON object per kept job (`KeptEntry`),
//   pushed on the left, at most `KEPT_MAX`; when full, the entry just pushed is dropped and
//   counted in `<key_prefix>:v1:bullmq-kept-dropped:{<queue>}` (its job stays in the failed set,
//   where `fleet-budget-bullmq replay-failed` still finds it);
// - `<key_prefix>:v1:bullmq-replay:{<queue>}`: the entries `budgetctl replay` moved (one `LMOVE`
//   each, at its turn, paced like every replay), for the queue's `ReplayReceiver` to put back;
// - `<key_prefix>:v1:bullmq-replaying:{<queue>}:<receiver id>`: the entry a receiver has in hand
//   (`BLMOVE` from the replay list), removed once BullMQ holds the job again; a receiver started
//   again under its id finishes it first;
// - `<key_prefix>:v1:bullmq-receivers:{<queue>}`: the queue's receivers by id, each scored with
//   when it was last heard (ms); the request in hand of one not heard from for `staleAfterMs` is
//   moved back to the replay list by another (one `LMOVE`), and the id removed once its list is
//   empty;
// - `<key_prefix>:v1:bullmq-parked:{<queue>}`: entries that cannot be replayed (unreadable, or a
//   job replayed `max_replays` times already), as they were, at most `KEPT_MAX`.
//
// The braces make every list of a queue one Redis Cluster slot, as `LMOVE` asks.

import type { Redis } from "ioredis";

/** The bound on the kept and the parked lists. */
export const KEPT_MAX = 100_000;
/** A BullMQ queue name's bound, in bytes (as `budgetctl replay --bullmq-queue`'s). */
export const QUEUE_MAX = 200;
/** An entry longer than this is not one this package wrote. */
export const ENTRY_MAX = 16 * 1024;
/** A job id's bound, in bytes. */
export const ID_MAX = 512;
/** An entry's error text, at most (bytes of UTF-16 units, near enough: it is already redacted
 * and bounded by `errorText`). */
const ERROR_MAX = 256;

/** Why `queue` cannot name a BullMQ queue's kept lists, or null. */
export function bullmqQueueProblem(queue: string): string | null {
  if (queue.length === 0) return "is empty";
  if (Buffer.byteLength(queue, "utf8") > QUEUE_MAX) return `is longer than ${QUEUE_MAX} bytes`;
  // eslint-disable-next-line no-control-regex
  const bad = /[:{}\u0000-\u001f\u007f-\u009f]/.exec(queue);
  return bad === null ? null : `holds ${JSON.stringify(bad[0])} (no ':', braces or control characters)`;
}

/** The fleet's keys of a BullMQ queue's kept jobs. */
export function keptKeys(keyPrefix: string, queue: string) {
  const key = (what: string) => `${keyPrefix}:v1:bullmq-${what}:{${queue}}`;
  return {
    kept: key("kept"),
    dropped: key("kept-dropped"),
    replay: key("replay"),
    parked: key("parked"),
    replaying: (receiverId: string) => `${key("replaying")}:${receiverId}`,
    receivers: key("receivers"),
  };
}

/** One kept job (snake_case: `budgetctl` reads it too). */
export interface KeptEntry {
  v: 1;
  id: string;
  task: string;
  dependency: string;
  reason: string;
  error_class: string;
  error: string;
  at_ms: number;
}

/** `raw` as a kept job, or why it cannot be one. */
export function readKeptEntry(raw: string): KeptEntry | string {
  if (raw.length > ENTRY_MAX) return `the entry is longer than ${ENTRY_MAX} bytes`;
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    return "the entry is not a JSON object";
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) return "the entry is not a JSON object";
  const o = v as Record<string, unknown>;
  let id: string;
  if (typeof o.id === "string" && o.id.length > 0 && Buffer.byteLength(o.id, "utf8") <= ID_MAX) id = o.id;
  else if (typeof o.id === "number" && Number.isSafeInteger(o.id) && o.id >= 0) id = String(o.id);
  else return `the entry names no job id ("id": a string of 1 to ${ID_MAX} bytes)`;
  if (typeof o.dependency !== "string" || o.dependency.length === 0) return "the entry names no dependency (\"dependency\")";
  const text = (x: unknown) => (typeof x === "string" ? x : "");
  return {
    v: 1, id, dependency: o.dependency, task: text(o.task), reason: text(o.reason), error_class: text(o.error_class),
    error: text(o.error), at_ms: typeof o.at_ms === "number" && Number.isFinite(o.at_ms) ? o.at_ms : 0,
  };
}

/** The entry of a job kept now. */
export function keptEntry(id: string, task: string, dependency: string, reason: string, errorClass: string, error: string, atMs: number): KeptEntry {
  return { v: 1, id, task, dependency, reason, error_class: errorClass.slice(0, ERROR_MAX), error: error.slice(0, ERROR_MAX), at_ms: atMs };
}

/** Records `entry` in `queue`'s kept list (one MULTI: the push and the bound); "dropped" when the
 * list was full (then counted). Throws when Redis does not answer. */
export async function keepJob(redis: Redis, keyPrefix: string, queue: string, entry: KeptEntry, max = KEPT_MAX): Promise<"kept" | "dropped"> {
  const keys = keptKeys(keyPrefix, queue);
  // LTRIM -max -1 keeps the `max` oldest: when full, what goes is the entry just pushed (on the
  // left), never one `budgetctl replay` is reading (on the right).
  const replies = await redis.multi().lpush(keys.kept, JSON.stringify(entry)).ltrim(keys.kept, -max, -1).exec();
  if (replies === null) throw new Error("the kept list's transaction was discarded");
  const [pushErr, length] = replies[0]!;
  if (pushErr) throw pushErr;
  if (typeof length === "number" && length > max) {
    await redis.incr(keys.dropped);
    return "dropped";
  }
  return "kept";
}
