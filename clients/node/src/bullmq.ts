// BullMQ jobs that draw on the fleet budget, and dead-letter as the Rust worker does.
//
//     const worker = new Worker("search", budgeted(budget, async (job) => index(job.data)), { connection });
//
// Each execution is reported to the budget (attempt = BullMQ's `attemptsStarted`, 1 for the
// first). A failure goes through the contract's decision order (docs/semantics.md):
//
// - granted: the job is moved to BullMQ's delayed set for the budget's delay (`moveToDelayed`,
//   then `DelayedError`), whatever the job's own `attempts`: the budget's ceilings decide;
// - denied, exhausted or not retryable, with `[amqp]` configured: the job is published to the
//   `<amqp.prefix>.dead` exchange with the Rust worker's `fb-*` headers, `mandatory` and with a
//   publisher confirm, and counted in the dead-letter index, so that `budgetctl dlq` and the
//   console see it; its original routing key is the BullMQ queue's replay queue,
//   `<amqp.prefix>.bullmq.<queue>` (declared first), so that `budgetctl replay` puts it back on
//   its BullMQ queue through a `ReplayReceiver` (bullmqReplay.ts); the job then ends in BullMQ's
//   failed set (UnrecoverableError) with a reason saying where it went. A copy the broker did not confirm leaves the job to run again (moved
//   to the delayed set for UNCONFIRMED_PAUSE_MS): a duplicate is possible, a loss is not;
// - the same without `[amqp]`: the job ends in BullMQ's failed set with the reason
//   (`fleet-budget: budget_exhausted: <error>`), where BullMQ keeps it, and is recorded in the
//   fleet's kept list of its queue (bullmqKept.ts), so that `budgetctl replay --bullmq-queue`
//   moves it, paced like every replay, to the queue's `ReplayReceiver`, which puts it back;
//   `replayFailed` (or `fleet-budget-bullmq replay-failed`) is the Node-only way, paced alike.

import { DelayedError, RateLimitError, UnrecoverableError, WaitingChildrenError } from "bullmq";
import type { Job, Processor } from "bullmq";
import { ConfirmedPublisher, NotConfirmed, PermanentlyRefused, fanoutKey } from "./amqp.js";
import type { FleetBudget } from "./budget.js";
import { InvalidTask } from "./budget.js";
import { DeadLetter, Failure, NON_RETRYABLE, errorMessage } from "./decision.js";
import type { Call } from "./admission.js";
import { DeadLetterRecord, deadLetterHeaders, errorText, indexKey, indexRow } from "./headers.js";
import { Script } from "./scripts.js";
import { replayQueueName, replaysOf } from "./bullmqReplay.js";
import { KEPT_MAX, bullmqQueueProblem, keepJob, keptEntry } from "./bullmqKept.js";

export { KEPT_MAX, bullmqQueueProblem, keepJob, keptEntry, keptKeys, readKeptEntry } from "./bullmqKept.js";
export type { KeptEntry } from "./bullmqKept.js";

export { ReplayReceiver, keptReason, putBackKept, putBack, readDeadJob, replayFailed, replayJobId, replayOptions, replayQueueName, replaysOf } from "./bullmqReplay.js";
export type { DeadJob, ReceiverCounts, ReceiverOptions, ReplayFailedOptions, ReplayFailedReport } from "./bullmqReplay.js";

/** How long a job whose dead letter was not confirmed waits before it runs again. */
export const UNCONFIRMED_PAUSE_MS = 1000;
/** The dead-letter index's bound on rows (`DeadLetterIndex::DEFAULT_MAX_ROWS`). */
export const MAX_INDEX_ROWS = 10_000;

/** An error that says the dependency asks to wait (`Retry-After`), in ms. */
export interface RetryAfter {
  retryAfterMs: number;
}

export interface BudgetedOptions {
  /** The task name of a job (default: `job.name`): what `[dependencies.X] tasks` list. */
  task?: (job: Job) => string;
  /** How a thrown error fails the job (default: BullMQ's UnrecoverableError is not retryable,
   * an error with a numeric `retryAfterMs` asks to wait, anything else is retryable). */
  classify?: (error: unknown, job: Job) => Failure;
  /** The dead-letter publisher; default: one on `[amqp]`'s brokers when configured, else none. */
  publisher?: ConfirmedPublisher | null;
  /** Bounds connecting and each confirm (ms). */
  amqpTimeoutMs?: number;
  /** Without `[amqp]`: the bound on the kept list `budgetctl replay --bullmq-queue` reads
   * (default `KEPT_MAX`, 100,000). */
  keptMax?: number;
}

function defaultClassify(error: unknown): Failure {
  if (error instanceof UnrecoverableError) return Failure.nonRetryable(error);
  const after = (error as Partial<RetryAfter> | null)?.retryAfterMs;
  if (typeof after === "number" && Number.isFinite(after)) return Failure.after(after, error);
  return Failure.retryable(error);
}

/** How long a job's holds are remembered after its last one. */
const HELD_TTL_MS = 2 * 86_400_000;

/** The holds of BullMQ jobs that admission held (a concurrency budget at its cap, a breaker
 * open): how many, since when, in `<prefix>:v1:bullmq-held:{<queue>}` (a hash, job id → JSON),
 * because BullMQ counts a start for a held job that ran no attempt. Cleared when the job is let
 * run or dead-lettered. */
class HeldJobs {
  constructor(private readonly budget: FleetBudget) {}

  private key(job: Job): string {
    return `${this.budget.config.redis.keyPrefix}:v1:bullmq-held:{${job.queueName}}`;
  }

  /** The job's holds so far (null: never held, or Redis did not answer). */
  async get(job: Job): Promise<{ n: number; since: number } | null> {
    try {
      const text = await this.budget.redis.hget(this.key(job), String(job.id));
      if (text === null) return null;
      const v = JSON.parse(text) as { n?: unknown; since?: unknown };
      return typeof v.n === "number" && typeof v.since === "number" ? { n: v.n, since: v.since } : null;
    } catch {
      return null;
    }
  }

  async hold(job: Job, held: { n: number; since: number } | null): Promise<void> {
    const key = this.key(job);
    const value = JSON.stringify({ n: (held?.n ?? 0) + 1, since: held?.since ?? Date.now() });
    try {
      await this.budget.redis.multi().hset(key, String(job.id), value).pexpire(key, HELD_TTL_MS).exec();
    } catch {
      // Not remembered: the job's next attempt number is one higher (the safe direction).
    }
  }

  async clear(job: Job): Promise<void> {
    try {
      await this.budget.redis.hdel(this.key(job), String(job.id));
    } catch {
      // Expires with the key.
    }
  }
}

/** The headers as the Rust `set_u64` writes integers: signed 64-bit (`long`), whatever their size
 * (amqplib would pick the narrowest width). */
function amqpHeaders(headers: Record<string, string | number>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(headers).map(([k, v]) => [k, typeof v === "number" ? { "!": "long", value: v } : v]));
}

/** What `budgeted` returns: a BullMQ processor, with `close()` for its dead-letter publisher. */
export type BudgetedProcessor<T, R, N extends string> = Processor<T, R, N> & { close(): Promise<void> };

/** `processor`, its jobs' failures decided by `budget`. */
export function budgeted<T = unknown, R = unknown, N extends string = string>(
  budget: FleetBudget, processor: Processor<T, R, N>, options: BudgetedOptions = {},
): BudgetedProcessor<T, R, N> {
  const taskOf = options.task ?? ((job: Job) => job.name);
  const classify = options.classify ?? defaultClassify;
  const urls = budget.config.amqpUrls;
  const publisher = options.publisher !== undefined ? options.publisher
    : urls.length > 0 ? new ConfirmedPublisher(urls, options.amqpTimeoutMs ?? 10_000) : null;
  const indexScript = new Script("dead_letters");
  const heldJobs = new HeldJobs(budget);

  // Without [amqp]: the job stays in BullMQ's failed set; its entry in the kept list is what
  // `budgetctl replay --bullmq-queue` moves to the queue's receiver (bullmqKept.ts).
  const keptMax = options.keptMax ?? KEPT_MAX;
  let droppedLogged = false;
  const keep = async (job: Job<T, R, N>, task: string, decision: DeadLetter, failure: Failure, now: number): Promise<void> => {
    const problem = bullmqQueueProblem(job.queueName);
    if (job.id === undefined || problem !== null) {
      console.warn(`fleet-budget: ${task}[${job.id}]: kept in the failed set, not recorded for budgetctl replay (queue name ${problem ?? "?"})`);
      return;
    }
    const entry = keptEntry(String(job.id), task, decision.dependency, decision.reason, failure.cls, errorText(failure.message), now);
    try {
      const r = await keepJob(budget.redis, budget.config.redis.keyPrefix, job.queueName, entry, keptMax);
      if (r === "dropped" && !droppedLogged) {
        droppedLogged = true;
        console.warn(`fleet-budget: the kept list of ${job.queueName} is full (${keptMax}): jobs kept from now on are left out of budgetctl replay (they stay in the failed set; fleet-budget-bullmq replay-failed finds them)`);
      }
    } catch (e) {
      console.warn(`fleet-budget: ${task}[${job.id}]: kept in the failed set, not recorded for budgetctl replay (${errorMessage(e)}); fleet-budget-bullmq replay-failed finds it`);
    }
  };

  const deadLetter = async (job: Job<T, R, N>, token: string | undefined, task: string, attempt: number, decision: DeadLetter,
    failure: Failure, cause: unknown): Promise<never> => {
    const now = Date.now();
    const why = `fleet-budget: ${decision.reason}: ${errorText(failure.message)}`;
    if (publisher === null) {
      await keep(job, task, decision, failure, now);
      throw new UnrecoverableError(why);
    }
    const record: DeadLetterRecord = {
      task, dependency: decision.dependency, reason: decision.reason,
      // A BullMQ job was consumed from no exchange: the replay moves it to the default exchange
      // with the routing key of its BullMQ queue's replay queue, which a ReplayReceiver drains
      // into that BullMQ queue (bullmqReplay.ts).
      originalExchange: "", originalRoutingKey: replayQueueName(budget.config.amqpPrefix, job.queueName), originalQueue: job.queueName,
      // BullMQ keeps no time of a job's first failure: this one's for a first attempt, else the
      // job's creation (a bound from below).
      attempts: attempt, firstFailureMs: attempt === 1 ? now : job.timestamp, deadLetteredMs: now,
      errorClass: failure.cls, error: failure.message, snapshot: decision.snapshot,
      source: decision.source === "not_consulted" ? null : decision.source, replays: replaysOf(job.id),
    };
    const body = Buffer.from(JSON.stringify({ queue: job.queueName, id: job.id, name: job.name, data: job.data, opts: job.opts }), "utf8");
    const exchange = budget.config.deadLetterExchange;
    try {
      // The replay queue exists before its first dead letter: a replay to it is never returned.
      if (fanoutKey(record.originalRoutingKey) !== "") await publisher.declareQueue(record.originalRoutingKey);
      await publisher.publish(exchange, fanoutKey(record.originalRoutingKey), body, amqpHeaders(deadLetterHeaders(record)), {
        contentType: "application/json", messageId: job.id === undefined ? undefined : String(job.id), timestamp: Math.floor(now / 1000),
      });
    } catch (e) {
      if (e instanceof PermanentlyRefused) throw new UnrecoverableError(`${why} (dead letter can never be published: ${e.message})`);
      if (e instanceof NotConfirmed) {
        console.warn(`fleet-budget: ${task}[${job.id}]: dead letter not confirmed (${e.message}); the job runs again`);
        await job.moveToDelayed(Date.now() + UNCONFIRMED_PAUSE_MS, token);
        throw new DelayedError(e.message);
      }
      throw e;
    }
    // Confirmed: counted in the dead-letter index (never sent again: a retry after a timeout
    // could count twice; the index is then short, and every look says so).
    const row = indexRow(record);
    if (row !== null) {
      try {
        await indexScript.run(budget.redis, [indexKey(budget.config.redis.keyPrefix, exchange)], [MAX_INDEX_ROWS, row, 1]);
      } catch (e) {
        console.warn(`fleet-budget: counting a dead letter in the index failed (${errorMessage(e)}); the index is short of the queue`);
      }
    }
    throw Object.assign(new UnrecoverableError(`${why} (dead-lettered to ${exchange})`), { cause });
  };

  const run = async (job: Job<T, R, N>, token?: string, signal?: AbortSignal): Promise<R> => {
    const task = taskOf(job as Job);
    let dependency: string;
    try {
      dependency = budget.dependency(task);
    } catch (e) {
      if (e instanceof InvalidTask) throw new UnrecoverableError(`fleet-budget: ${NON_RETRYABLE}: ${e.message}`);
      throw e;
    }
    // Admission (a concurrency budget, a breaker): a held job runs no attempt, but BullMQ counts
    // a start all the same; the holds are counted apart (heldJobs) and taken off.
    let attempt = Math.max(1, job.attemptsStarted || 1);
    let call: Call | null = null;
    if (budget.admission.governs(dependency)) {
      const held = await heldJobs.get(job);
      attempt = Math.max(1, attempt - (held?.n ?? 0));
      const admission = await budget.admit(task, attempt, held === null ? null : Date.now() - held.since);
      if (admission.kind === "hold") {
        await heldJobs.hold(job, held);
        await job.moveToDelayed(Date.now() + admission.pauseMs, token);
        throw new DelayedError(`fleet-budget: held (${admission.reason}) for ${admission.pauseMs} ms`);
      }
      if (held !== null) await heldJobs.clear(job);
      if (admission.kind === "dead_letter") {
        const failure = Failure.retryable(`not run: ${admission.reason}`);
        return await deadLetter(job, token, task, attempt, admission, failure, failure.message);
      }
      call = admission;
    }
    await budget.onAttempt(task, attempt);
    let result: R;
    try {
      result = await processor(job, token, signal);
    } catch (error) {
      // BullMQ's own flow control is not a failure.
      if (error instanceof DelayedError || error instanceof WaitingChildrenError || error instanceof RateLimitError) {
        if (call !== null) await budget.finish(call, "inconclusive");
        throw error;
      }
      const failure = classify(error, job as Job);
      if (call !== null) await budget.finish(call, failure.isRetryable ? "failed" : "inconclusive");
      const decision = await budget.onFailure(task, attempt, failure);
      if (decision.kind === "retry") {
        await job.moveToDelayed(Date.now() + Math.ceil(decision.delayMs), token);
        throw new DelayedError(`fleet-budget: retry ${decision.nextAttempt} in ${Math.ceil(decision.delayMs)} ms: ${errorMessage(error)}`);
      }
      return await deadLetter(job, token, task, attempt, decision, failure, error);
    }
    if (call !== null) await budget.finish(call, "succeeded");
    await budget.onSuccess(task);
    return result;
  };
  return Object.assign(run as Processor<T, R, N>, { close: async () => { await publisher?.close(); } });
}
