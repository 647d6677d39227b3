// The `fb-*` headers of the Rust worker (crates/fleet-budget-amqp/src/headers; the Python
// client's headers.py), so that `budgetctl dlq` and `budgetctl replay` read a dead letter written
// by Node as one written by Rust or Python, and the row of the dead-letter index it is counted
// under (lua/README.md, "Dead-letter index"; the Python client's dead_letters.py).

import { redactText, truncate } from "./redact.js";
import { BudgetSnapshot, retriesEstimate } from "./snapshot.js";

export const ATTEMPT = "fb-attempt";
export const REPLAYS = "fb-replays";
export const TASK = "fb-task";
export const DEPENDENCY = "fb-dependency";
export const REASON = "fb-reason";
export const ORIGINAL_EXCHANGE = "fb-original-exchange";
export const ORIGINAL_ROUTING_KEY = "fb-original-routing-key";
export const ORIGINAL_QUEUE = "fb-original-queue";
export const ATTEMPTS = "fb-attempts";
export const FIRST_FAILURE_MS = "fb-first-failure-ms";
export const DEAD_LETTERED_MS = "fb-dead-lettered-ms";
export const ERROR_CLASS = "fb-error-class";
export const ERROR = "fb-error";
export const BUDGET_ALLOWANCE = "fb-budget-allowance";
export const BUDGET_RETRIES = "fb-budget-retries";
export const BUDGET_WINDOW_MS = "fb-budget-window-ms";
export const BUDGET_WINDOW_INDEX = "fb-budget-window-index";
export const BUDGET_SOURCE = "fb-budget-source";
/** Why a message was parked, and when (ms): written by whatever parks it. */
export const PARK_REASON = "fb-park-reason";
export const PARKED_MS = "fb-parked-ms";

/** Longest `fb-error` text, in bytes of UTF-8. */
export const ERROR_TEXT_MAX_BYTES = 512;
/** Longest text of an index row's field, in bytes (the Rust `FIELD_MAX`). */
export const FIELD_MAX = 256;
const I64_MAX = 2n ** 63n - 1n;

/** `text` cut to at most `max` bytes of UTF-8 at a character boundary. */
export function truncateUtf8(text: string, max: number): string {
  if (Buffer.byteLength(text, "utf8") <= max) return text;
  let out = "";
  let size = 0;
  for (const ch of text) {
    const n = Buffer.byteLength(ch, "utf8");
    if (size + n > max) break;
    out += ch;
    size += n;
  }
  return out;
}

/** Error text as it may leave the process: redacted, at most 512 bytes, a cut marked `…`. */
export function errorText(message: string): string {
  return truncate(redactText(message), ERROR_TEXT_MAX_BYTES);
}

/** As the Rust `set_u64` writes it: a 64-bit integer, saturated (amqplib sends a number that
 * does not fit 32 bits as a signed 64-bit one). */
function u64(value: number): number {
  if (!Number.isFinite(value) || value < 0) return 0;
  return BigInt(Math.floor(value)) > I64_MAX ? Number.MAX_SAFE_INTEGER : Math.floor(value);
}

export interface DeadLetterRecord {
  task: string;
  dependency: string;
  reason: string;
  originalExchange: string;
  originalRoutingKey: string;
  originalQueue: string;
  attempts: number;
  firstFailureMs: number;
  deadLetteredMs: number;
  errorClass: string;
  error: string;
  snapshot: BudgetSnapshot | null;
  source: string | null;
  replays: number;
}

/** The `fb-*` headers of a dead letter, the error text redacted and truncated. */
export function deadLetterHeaders(r: DeadLetterRecord): Record<string, string | number> {
  const out: Record<string, string | number> = {
    [TASK]: r.task,
    [DEPENDENCY]: r.dependency,
    [REASON]: r.reason,
    [ORIGINAL_EXCHANGE]: r.originalExchange,
    [ORIGINAL_ROUTING_KEY]: r.originalRoutingKey,
    [ORIGINAL_QUEUE]: r.originalQueue,
    [ATTEMPTS]: u64(r.attempts),
    [FIRST_FAILURE_MS]: u64(r.firstFailureMs),
    [DEAD_LETTERED_MS]: u64(r.deadLetteredMs),
    [ERROR_CLASS]: r.errorClass,
    [ERROR]: errorText(r.error),
    [REPLAYS]: u64(r.replays),
  };
  if (r.snapshot !== null) {
    out[BUDGET_ALLOWANCE] = u64(r.snapshot.allowance);
    out[BUDGET_RETRIES] = u64(retriesEstimate(r.snapshot));
    out[BUDGET_WINDOW_MS] = u64(r.snapshot.windowMs);
    out[BUDGET_WINDOW_INDEX] = u64(r.snapshot.windowIndex);
  }
  if (r.source !== null) out[BUDGET_SOURCE] = r.source;
  return out;
}

/** Every dead-letter reason the Rust `DeadLetterReason::parse` knows. */
export const REASONS = new Set(["non_retryable", "attempts_exhausted", "budget_exhausted", "budget_frozen", "concurrency_cap",
  "concurrency_retry_share", "circuit_open", "fanout_exhausted", "delay_exceeded"]);

/** The row the dead-letter index counts a record under: the Rust `Row::encode`, the JSON array
 * `[dependency, reason, error_class, task, original_exchange, replays, minute]` in serde_json's
 * compact text (JSON.stringify escapes what serde_json escapes), each text cut to 256 bytes;
 * null when the Rust tools would count it nowhere (an unknown reason, no dependency). */
export function indexRow(r: DeadLetterRecord): string | null {
  if (!REASONS.has(r.reason) || r.dependency.length === 0) return null;
  const cut = (t: string) => truncateUtf8(t, FIELD_MAX);
  return JSON.stringify([cut(r.dependency), r.reason, cut(r.errorClass), cut(r.task), cut(r.originalExchange), r.replays,
    Math.floor(r.deadLetteredMs / 60_000)]);
}

/** The index of a queue: `<prefix>:v1:dead-letters:{<queue>}` (the Rust `dead_letters_key`). */
export function indexKey(keyPrefix: string, queue: string): string {
  return `${keyPrefix}:v1:dead-letters:{${queue}}`;
}
