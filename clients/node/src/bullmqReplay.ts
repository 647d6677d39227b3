// Putting a BullMQ job that the budget dead-lettered back on its BullMQ queue, without anything
// but BullMQ's own API touching BullMQ's keys.
//
// Why a receiver: `budgetctl replay` (and the console) move a dead letter back to its original
// exchange and routing key, with confirms, paced by the dependency's health. A BullMQ job came
// from no exchange, so its dead letter names a queue of this package's instead: the default
// exchange "" and the routing key `<amqp.prefix>.bullmq.<queue>` (`replayQueueName`), a durable
// AMQP queue per BullMQ queue, declared before the first dead letter of that queue is published.
// The replay needs nothing of BullMQ; the receiver (`ReplayReceiver`) drains that queue into
// `Queue.add` with the job's name, data and options, and acks each message only once BullMQ has
// taken the job.
//
// Nothing lost, nothing doubled when either side is killed half-way:
//
// - the replay acks a dead letter only after the broker confirmed its copy in the receiver's
//   queue (and claims each move in Redis: an interrupted run never copies a dead letter twice);
// - the receiver adds the job under an id derived from the original's and the replay count
//   (`replayJobId`: `<original id>~r<n>`), then removes the original from the failed set, then
//   acks. Killed before the ack, the message comes back: BullMQ ignores an add whose job id it
//   holds, and the original is gone already or removed now. (That holds while BullMQ keeps the
//   replayed job: one removed on completion, `removeOnComplete: true`, within the instant
//   between the add and the ack, would be added again.)
//
// The replay count rides in the job id (`~r<n>`), so that a replayed job dead-lettered again
// carries `fb-replays = n` and the replay's `max_replays` parks a job that keeps failing.
//
// Without `[amqp]`, a job the budget refused stays in BullMQ's failed set with the reason
// (`fleet-budget: <reason>: <error>`), and its entry goes to the fleet's kept list of the queue
// (bullmqKept.ts). `budgetctl replay --bullmq-queue <queue>` moves the entries, paced like every
// replay, to the queue's replay list; the receiver drains that list too: it takes one entry at a
// time into a list of its own (`BLMOVE`), puts the job back (`putBackKept`: add under `~r<n>`,
// then remove the original, as above), then removes the entry. Killed in between, the entry is
// still in its list, and a receiver started again under the same id (`receiverId`, the host's
// name by default) finishes it first; the add is again ignored, so the job is put back once. A
// receiver that never starts again under its id (a pod replaced under a new name) is noticed by
// the others: each says every few seconds that it is alive, and one not heard from for
// `staleAfterMs` has its request in hand moved back to the replay list (one `LMOVE`: the entry is
// still in exactly one list), where any receiver takes it; a receiver that was only slow puts the
// same job back at most once more, which BullMQ ignores as above.
// `replayFailed` is the Node-only way: it reads the failed set itself, paced the simple way (a
// rate that starts at an eighth of the one asked and doubles each second, held while the
// dependency's budget is frozen).

import { hostname } from "node:os";
import { Job, Queue } from "bullmq";
import type { JobsOptions } from "bullmq";
import { Redis } from "ioredis";
import { connect } from "amqplib";
import type { Channel, ChannelModel, ConsumeMessage } from "amqplib";
import { ConfirmedPublisher, SHORT_STRING_MAX } from "./amqp.js";
import type { FleetBudget } from "./budget.js";
import { errorMessage } from "./decision.js";
import { PARKED_MS, PARK_REASON, REPLAYS, errorText } from "./headers.js";
import { redactText, redactUrl } from "./names.js";
import { KEPT_MAX, bullmqQueueProblem, keptKeys, readKeptEntry } from "./bullmqKept.js";

/** The AMQP queue a BullMQ queue's dead letters are replayed to. */
export function replayQueueName(amqpPrefix: string, bullmqQueue: string): string {
  return `${amqpPrefix}.bullmq.${bullmqQueue}`;
}

const REPLAY_SUFFIX = /~r(\d{1,9})$/;

/** How many times the job of `id` was replayed already (its `~r<n>` suffix, else 0). */
export function replaysOf(id: string | undefined): number {
  const m = id === undefined ? null : REPLAY_SUFFIX.exec(id);
  return m === null ? 0 : Number(m[1]);
}

/** The id of a job's `n`th replay: the original id, without an earlier replay's suffix, then
 * `~r<n>` (never an integer, never a `:`, as BullMQ asks of custom ids). */
export function replayJobId(id: string, n: number): string {
  return `${id.replace(REPLAY_SUFFIX, "")}~r${n}`;
}

/** The options a replayed job is added with: the original's, less those that belong to the
 * first add only (its id, its delay, a repeat, a parent, a deduplication). */
export function replayOptions(opts: unknown): JobsOptions {
  const o = (opts !== null && typeof opts === "object" && !Array.isArray(opts) ? { ...(opts as Record<string, unknown>) } : {}) as Record<string, unknown>;
  for (const k of ["jobId", "delay", "repeat", "repeatJobKey", "parent", "deduplication", "debounce", "timestamp", "prevMillis"]) delete o[k];
  return o as JobsOptions;
}

/** A dead letter's body as the BullMQ integration writes it. */
export interface DeadJob {
  queue: string;
  id: string;
  name: string;
  data: unknown;
  opts: unknown;
}

/** The body of a BullMQ dead letter, or why it cannot be one. */
export function readDeadJob(body: Buffer): DeadJob | string {
  let v: unknown;
  try {
    v = JSON.parse(body.toString("utf8"));
  } catch (e) {
    return `the body is not JSON (${errorMessage(e)})`;
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) return "the body is not a JSON object";
  const o = v as Record<string, unknown>;
  if (typeof o.queue !== "string" || o.queue.length === 0) return "the body names no BullMQ queue (\"queue\")";
  if (typeof o.name !== "string") return "the body names no job name (\"name\")";
  if (typeof o.id !== "string" && typeof o.id !== "number") return "the body holds no job id (\"id\")";
  return { queue: o.queue, id: String(o.id), name: o.name, data: o.data ?? null, opts: o.opts ?? {} };
}

/** Whether a failed job's reason says the budget refused it and it is kept here (not
 * dead-lettered to RabbitMQ, whose replay is `budgetctl replay`'s); its reason if so. */
export function keptReason(failedReason: string | undefined): string | null {
  if (failedReason === undefined || failedReason.includes("(dead-lettered to ")) return null;
  const m = /^fleet-budget: ([a-z_]+): /.exec(failedReason);
  return m === null ? null : m[1]!;
}

/** Puts `job` back on `queue` as its `n`th replay, then removes the original from the failed set
 * (see the module's notes on why that order). True when BullMQ took a new job; false when it
 * held that id already (an earlier, interrupted pass). */
export async function putBack(queue: Queue, job: DeadJob, n: number): Promise<boolean> {
  const id = replayJobId(job.id, n);
  // BullMQ answers an add whose id it holds with the job it holds, and adds nothing.
  const before = await Job.fromId(queue, id);
  await queue.add(job.name, job.data, { ...replayOptions(job.opts), jobId: id });
  const original = await Job.fromId(queue, job.id);
  if (original !== undefined && keptReasonOrSent(original.failedReason) && (await original.isFailed())) {
    await original.remove();
  }
  return before === undefined;
}

/** What became of a kept job's replay request: put back now (`added`), put back by an earlier,
 * interrupted pass (`already`), no longer the budget's to put back (`gone`: removed from BullMQ,
 * or not failed: retried by hand, say), or not failed yet (`running`: its request came before
 * BullMQ moved it to the failed set; try again in a moment). */
export type KeptOutcome = "added" | "already" | "gone" | "running";

/** Puts back the job of `id` the budget kept in `queue`'s failed set, as its `n`th replay: only
 * BullMQ's API touches BullMQ's keys, and a request handled twice puts the job back once. */
export async function putBackKept(queue: Queue, id: string, n: number): Promise<KeptOutcome> {
  const replayed = await Job.fromId(queue, replayJobId(id, n));
  const original = await Job.fromId(queue, id);
  if (replayed !== undefined) {
    // An earlier pass added it and was cut off before removing the original.
    if (original !== undefined && keptReasonOrSent(original.failedReason) && (await original.isFailed())) await original.remove();
    return "already";
  }
  if (original === undefined) return "gone";
  const state = await original.getState();
  if (state === "active") return "running";
  if (state !== "failed" || keptReason(original.failedReason) === null) return "gone";
  const added = await putBack(queue, { queue: queue.name, id, name: original.name, data: original.data, opts: original.opts }, n);
  return added ? "added" : "already";
}

function keptReasonOrSent(reason: string | undefined): boolean {
  return reason !== undefined && reason.startsWith("fleet-budget: ");
}

export interface ReceiverOptions {
  /** The broker's nodes; default `[amqp]`'s. None: only the kept jobs' requests are drained. */
  urls?: readonly string[];
  /** Drain the requests of `budgetctl replay --bullmq-queue` (default true). */
  requests?: boolean;
  /** The budget's Redis, where the kept lists are (a connection of the receiver's own is made
   * from it, `duplicate()`); default the budget's client, else one on `[redis] url`. */
  redis?: Redis;
  /** `[redis] key_prefix`; default the budget's configuration's. */
  keyPrefix?: string;
  /** Names the list of the request in hand; a receiver started again under the same id finishes
   * it first. One per receiver of a queue on a host (default the host's name). */
  receiverId?: string;
  /** A receiver of the queue not heard from for this long (ms, default 60,000) is taken for
   * gone: the request it had in hand goes back to the replay list, for any receiver. */
  staleAfterMs?: number;
  /** `[amqp] prefix`; default the budget's configuration's. */
  amqpPrefix?: string;
  /** Messages taken at a time (unacked). */
  prefetch?: number;
  /** Bounds connecting, each add and each confirm (ms). */
  timeoutMs?: number;
  log?: { warn(m: string): void; info(m: string): void };
}

/** What a receiver did so far. */
export interface ReceiverCounts {
  /** Jobs added to BullMQ. */
  added: number;
  /** Messages whose job BullMQ held already (a message redelivered after a kill). */
  already: number;
  /** Messages that could not be a job, sent to `<prefix>.parked` with the reason (and kept
   * jobs' requests that cannot be read, moved to the parked list). */
  parked: number;
  /** Kept jobs' requests whose job was no longer the budget's to put back (removed from BullMQ,
   * or retried by hand meanwhile). */
  gone: number;
  /** Requests another receiver had in hand when it went (not heard from for `staleAfterMs`),
   * moved back to the replay list by this one. */
  takenBack: number;
}

/** Where a receiver reads the kept jobs' requests, and as whom. */
interface ReceiverRequests {
  make: () => Redis;
  keys: ReturnType<typeof keptKeys>;
  id: string;
  replaying: string;
  staleAfterMs: number;
}

/** How long one BLMOVE waits for a request (seconds). */
const BLOCK_SECS = 1;
/** How many times (200 ms apart) a request whose job BullMQ has not yet moved to the failed
 * set is tried before it counts as gone. */
const RUNNING_TRIES = 150;
/** How many times in a row a request may fail (a second apart) before it is parked. */
const MAX_FAILURES = 30;
/** How often a receiver says it is alive and looks for gone ones (ms; a third of `staleAfterMs`
 * when that is shorter). */
const HEARTBEAT_MS = 5_000;
/** Gone receivers whose requests are taken back per look, at most. */
const RECLAIM_BATCH = 16;
/** Requests taken back from one gone receiver per look, at most (it holds one). */
const RECLAIM_PER_RECEIVER = 8;

function within<T>(what: string, ms: number, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** Drains `<amqp.prefix>.bullmq.<queue>` into `queue` (see the module's notes). `start()` connects
 * and consumes (and keeps reconnecting, a second apart, until `close()`). */
export class ReplayReceiver {
  readonly name: string;
  readonly counts: ReceiverCounts = { added: 0, already: 0, parked: 0, gone: 0, takenBack: 0 };
  private connection: ChannelModel | null = null;
  private channel: Channel | null = null;
  private closed = false;
  private work: Promise<void> = Promise.resolve();
  private reconnect: NodeJS.Timeout | null = null;
  private readonly urls: readonly string[];
  private readonly prefix: string;
  private readonly timeoutMs: number;
  private readonly parker: ConfirmedPublisher | null;
  private readonly log: { warn(m: string): void; info(m: string): void };
  /** Where the kept jobs' requests are read (null: not drained). */
  private readonly requests: ReceiverRequests | null;
  private blocking: Redis | null = null;
  private draining: Promise<void> = Promise.resolve();

  constructor(private readonly queue: Queue, budgetOrConfig: Pick<FleetBudget, "config"> | null, private readonly options: ReceiverOptions = {}) {
    this.urls = options.urls ?? budgetOrConfig?.config.amqpUrls ?? [];
    this.prefix = options.amqpPrefix ?? budgetOrConfig?.config.amqpPrefix ?? "fleet";
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.name = replayQueueName(this.prefix, queue.name);
    if (this.urls.length > 0 && Buffer.byteLength(this.name, "utf8") > SHORT_STRING_MAX) throw new Error(`the replay queue ${JSON.stringify(this.name.slice(0, 64))}... is longer than ${SHORT_STRING_MAX} bytes`);
    this.parker = this.urls.length > 0 ? new ConfirmedPublisher(this.urls, this.timeoutMs) : null;
    this.log = options.log ?? console;
    this.requests = null;
    if (options.requests !== false) {
      const problem = bullmqQueueProblem(queue.name);
      const config = budgetOrConfig?.config;
      const base = options.redis ?? ((budgetOrConfig as Partial<FleetBudget> | null)?.redis ?? null);
      const keyPrefix = options.keyPrefix ?? config?.redis.keyPrefix;
      const receiverId = options.receiverId ?? hostname();
      if (receiverId.length === 0 || receiverId.length > 200) throw new Error("a receiver id is 1 to 200 characters");
      const staleAfterMs = options.staleAfterMs ?? 60_000;
      if (!Number.isSafeInteger(staleAfterMs) || staleAfterMs < 1_000) throw new Error("staleAfterMs is a whole number of ms, 1,000 or more");
      if (problem !== null) {
        if (this.urls.length === 0) throw new Error(`the BullMQ queue name ${JSON.stringify(queue.name.slice(0, 64))} ${problem}`);
      } else if (keyPrefix !== undefined && (base !== null || config !== undefined)) {
        // A connection of its own: BLMOVE blocks it.
        const settings = { commandTimeout: this.timeoutMs + BLOCK_SECS * 1000, maxRetriesPerRequest: 1, enableOfflineQueue: true,
          retryStrategy: (times: number) => Math.min(100 * times, 1000) };
        const make = base !== null ? () => base.duplicate(settings) : () => new Redis(config!.redis.url, settings);
        const keys = keptKeys(keyPrefix, queue.name);
        this.requests = { make, keys, id: receiverId, replaying: keys.replaying(receiverId), staleAfterMs };
      }
    }
    if (this.urls.length === 0 && this.requests === null) {
      throw new Error("a replay receiver needs a broker ([amqp] url, or urls in its options) or the budget's Redis (a budget, or redis and keyPrefix in its options)");
    }
  }

  /** Connects and starts consuming; throws when no broker answers (later losses reconnect). */
  async start(): Promise<void> {
    if (this.urls.length > 0) await this.open();
    if (this.requests !== null) {
      const redis = this.requests.make();
      redis.on("error", () => {});
      this.blocking = redis;
      this.draining = this.drain(redis, this.requests);
    }
  }

  /** Takes the kept jobs' requests one at a time: the one in hand first (a receiver killed
   * before it finished), then the next (`BLMOVE`, a second at most); each call bounded. */
  private async drain(redis: Redis, r: ReceiverRequests): Promise<void> {
    // The request in hand, and how many times in a row it was not taken (`running`: its job not
    // yet failed; `failures`: an error), each bounded: then it is given up, never tried forever.
    let running = 0;
    let failures = 0;
    let inHand: string | null = null;
    const park = async (raw: string, why: string) => {
      this.log.warn(`fleet-budget: a replay request of ${this.queue.name} is not replayed (${why}); moved to ${r.keys.parked}`);
      // The request in hand is the only entry of this receiver's list.
      await within(`park in ${r.keys.parked}`, this.timeoutMs, redis.lmove(r.replaying, r.keys.parked, "RIGHT", "LEFT"));
      await within(`bound ${r.keys.parked}`, this.timeoutMs, redis.ltrim(r.keys.parked, 0, KEPT_MAX - 1));
      this.counts.parked += 1;
    };
    const beatEvery = Math.min(HEARTBEAT_MS, Math.floor(r.staleAfterMs / 3));
    let lastBeat = -Infinity;
    while (!this.closed) {
      if (Date.now() - lastBeat >= beatEvery) {
        lastBeat = Date.now();
        await this.heartbeat(redis, r).catch((e) => {
          if (!this.closed) this.log.warn(`fleet-budget: the replay receiver of ${this.queue.name} could not say it is alive (${redactText(errorMessage(e))}); trying again`);
        });
      }
      let raw: string | null = null;
      try {
        raw = await within(`read ${r.replaying}`, this.timeoutMs, redis.lindex(r.replaying, -1));
        if (raw === null) {
          raw = await within(`take from ${r.keys.replay}`, this.timeoutMs + BLOCK_SECS * 1000,
            redis.blmove(r.keys.replay, r.replaying, "RIGHT", "LEFT", BLOCK_SECS));
        }
        if (raw === null || this.closed) continue;
        if (raw !== inHand) {
          inHand = raw;
          running = 0;
          failures = 0;
        }
        const entry = readKeptEntry(raw);
        if (typeof entry === "string") {
          await park(raw, entry);
          continue;
        }
        const outcome = await within(`put back ${entry.id} on ${this.queue.name}`, this.timeoutMs,
          putBackKept(this.queue, entry.id, replaysOf(entry.id) + 1));
        if (outcome === "running" && running < RUNNING_TRIES) {
          // Its request came before BullMQ moved it to the failed set: a moment later it is.
          running += 1;
          await new Promise((res) => setTimeout(res, 200));
          continue;
        }
        await within(`remove the request from ${r.replaying}`, this.timeoutMs, redis.lrem(r.replaying, 1, raw));
        this.counts[outcome === "running" ? "gone" : outcome] += 1;
      } catch (e) {
        if (this.closed) break;
        const why = redactText(errorMessage(e));
        failures += 1;
        if (raw !== null && raw === inHand && failures >= MAX_FAILURES) {
          await park(raw, `not taken ${failures} times: ${why}`).catch(() => undefined);
          continue;
        }
        this.log.warn(`fleet-budget: a replay request of ${this.queue.name} was not taken (${why}); trying again`);
        await new Promise((res) => setTimeout(res, 1000));
      }
    }
  }

  /** Says this receiver is alive, and moves the requests in hand of receivers of the queue not
   * heard from for `staleAfterMs` back to the replay list (the right end: taken next). */
  private async heartbeat(redis: Redis, r: ReceiverRequests): Promise<void> {
    // Redis's clock, not this host's: receivers on hosts whose clocks differ agree on who is gone.
    const [secs, micros] = await within("read Redis's time", this.timeoutMs, redis.time());
    const now = Number(secs) * 1000 + Math.floor(Number(micros) / 1000);
    await within(`say alive in ${r.keys.receivers}`, this.timeoutMs, redis.zadd(r.keys.receivers, now, r.id));
    const gone = await within(`read ${r.keys.receivers}`, this.timeoutMs,
      redis.zrangebyscore(r.keys.receivers, "-inf", `(${now - r.staleAfterMs}`, "LIMIT", 0, RECLAIM_BATCH));
    for (const id of gone) {
      if (id === r.id) continue;
      const list = r.keys.replaying(id);
      let moved = 0;
      let emptied = false;
      const shown = JSON.stringify(redactText(id.slice(0, 64)));
      while (moved < RECLAIM_PER_RECEIVER) {
        let entry: string | null;
        try {
          entry = await within(`take back from ${list}`, this.timeoutMs, redis.lmove(list, r.keys.replay, "LEFT", "RIGHT"));
        } catch (e) {
          if (!/WRONGTYPE/.test(errorMessage(e))) throw e;
          // Not a list of this package's: written by someone else; the id is forgotten, once.
          this.log.warn(`fleet-budget: the list in hand of replay receiver ${shown} of ${this.queue.name} holds something else; the receiver is forgotten`);
          entry = null;
        }
        if (entry === null) {
          emptied = true;
          break;
        }
        moved += 1;
      }
      if (moved > 0) {
        this.log.warn(`fleet-budget: replay receiver ${shown} of ${this.queue.name} was not heard from for ${Math.round(r.staleAfterMs / 1000)} s; the ${moved === 1 ? "request" : `${moved} requests`} it had in hand went back to ${r.keys.replay}`);
        this.counts.takenBack += moved;
      }
      // Heard from again meanwhile: it says so at its next beat.
      if (emptied) await within(`forget ${id.slice(0, 64)}`, this.timeoutMs, redis.zrem(r.keys.receivers, id));
    }
  }

  private async open(): Promise<void> {
    const problems: string[] = [];
    for (const url of this.urls) {
      let connection: ChannelModel | null = null;
      try {
        connection = await within(`connect to ${redactUrl(url)}`, this.timeoutMs, connect(url, { timeout: this.timeoutMs }));
        const channel = await within("open a channel", this.timeoutMs, connection.createChannel());
        connection.on("error", () => {});
        channel.on("error", () => {});
        const lost = () => {
          if (this.connection !== connection) return;
          this.connection = null;
          this.channel = null;
          connection?.close().catch(() => undefined);
          this.scheduleReconnect();
        };
        connection.on("close", lost);
        channel.on("close", lost);
        await within(`declare ${this.name}`, this.timeoutMs, channel.assertQueue(this.name, { durable: true }));
        await channel.prefetch(this.options.prefetch ?? 32);
        this.connection = connection;
        this.channel = channel;
        await within(`consume ${this.name}`, this.timeoutMs, channel.consume(this.name, (m) => {
          if (m === null) return;
          // One message at a time: each is acked only after its job is in BullMQ.
          this.work = this.work.then(() => this.receive(channel, m));
        }, { noAck: false }));
        return;
      } catch (e) {
        problems.push(`${redactUrl(url)}: ${redactText(errorMessage(e))}`);
        if (connection !== null) connection.close().catch(() => undefined);
      }
    }
    throw new Error(`cannot reach the broker: ${problems.join("; ")}`);
  }

  private scheduleReconnect(): void {
    if (this.closed || this.reconnect !== null) return;
    this.reconnect = setTimeout(() => {
      this.reconnect = null;
      if (this.closed) return;
      this.open().catch((e) => {
        this.log.warn(`fleet-budget: the replay receiver of ${this.queue.name} cannot reach the broker (${errorMessage(e)}); trying again`);
        this.scheduleReconnect();
      });
    }, 1000);
  }

  private async receive(channel: Channel, m: ConsumeMessage): Promise<void> {
    if (this.channel !== channel) return; // its channel is gone: the broker gives it again
    const job = readDeadJob(m.content);
    const headers = (m.properties.headers ?? {}) as Record<string, unknown>;
    const replays = Number(headers[REPLAYS] ?? NaN);
    let why: string | null = typeof job === "string" ? job : null;
    if (why === null && typeof job !== "string" && job.queue !== this.queue.name) {
      why = `its job belongs to BullMQ queue ${JSON.stringify(job.queue)}, not ${JSON.stringify(this.queue.name)}`;
    }
    if (why === null && !(Number.isSafeInteger(replays) && replays >= 1)) {
      why = `its ${REPLAYS} header is ${JSON.stringify(headers[REPLAYS] ?? null)}, not a replay count of 1 or more`;
    }
    try {
      if (why !== null) {
        await this.park(m, why);
        this.counts.parked += 1;
      } else {
        const added = await within(`add the replayed job to ${this.queue.name}`, this.timeoutMs, putBack(this.queue, job as DeadJob, replays));
        if (added) this.counts.added += 1;
        else this.counts.already += 1;
      }
      channel.ack(m);
    } catch (e) {
      // Not taken: the message goes back to the queue, and is tried again after a pause.
      this.log.warn(`fleet-budget: a replayed job for ${this.queue.name} was not taken (${redactText(errorMessage(e))}); it stays in ${this.name}`);
      await new Promise((r) => setTimeout(r, 1000));
      try {
        channel.nack(m, false, true);
      } catch {
        // The channel is gone: the broker gives the message again.
      }
    }
  }

  /** A message that can never be a job goes to `<prefix>.parked` with the reason, as the replay
   * parks what it cannot replay. */
  private async park(m: ConsumeMessage, why: string): Promise<void> {
    const headers = { ...((m.properties.headers ?? {}) as Record<string, unknown>), [PARK_REASON]: errorText(`not a BullMQ job: ${why}`),
      [PARKED_MS]: { "!": "long", value: Date.now() } };
    this.log.warn(`fleet-budget: a message in ${this.name} is not a BullMQ job (${why}); parked`);
    if (this.parker === null) throw new Error("no broker to park on");
    await this.parker.publish(`${this.prefix}.parked`, m.fields.routingKey, m.content, headers, {
      contentType: m.properties.contentType, messageId: m.properties.messageId,
    });
  }

  /** Stops consuming, finishes the message in hand, and closes the connections. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.reconnect !== null) clearTimeout(this.reconnect);
    const connection = this.connection;
    this.connection = null;
    this.channel = null;
    await this.work.catch(() => undefined);
    if (connection !== null) await connection.close().catch(() => undefined);
    await this.parker?.close();
    // A request taken by a BLMOVE cut off here is in this receiver's list: finished at its
    // next start.
    this.blocking?.disconnect();
    await this.draining.catch(() => undefined);
  }
}

export interface ReplayFailedOptions {
  /** Jobs put back per second at most (default 10); the pace starts at an eighth of it and
   * doubles each second. */
  rate?: number;
  /** At most this many jobs (default: all). */
  limit?: number;
  /** Only jobs refused for these reasons (default: any of the budget's). */
  reasons?: readonly string[];
  /** Only jobs of these names (tasks). */
  tasks?: readonly string[];
  /** A job replayed this many times already stays (default 3, as `[amqp] max_replays`). */
  maxReplays?: number;
  /** Count, change nothing. */
  dryRun?: boolean;
  /** Holds the pace while a dependency's budget is frozen (needs its tasks mapped). */
  budget?: FleetBudget | null;
  /** Told of each job put back. */
  onProgress?: (r: ReplayFailedReport) => void;
}

export interface ReplayFailedReport {
  /** Failed jobs the budget kept here that the filter matched. */
  matched: number;
  /** Put back on the queue (new jobs). */
  moved: number;
  /** Already put back by an interrupted pass (the original only removed now). */
  alreadyMoved: number;
  /** Replayed `maxReplays` times already: left in the failed set. */
  looping: number;
  /** Failed for another reason, or dead-lettered to RabbitMQ (`budgetctl replay`'s). */
  skipped: number;
  /** Seconds the pace held the run on a frozen budget. */
  heldSecs: number;
}

/** Puts the jobs the budget refused and BullMQ kept in `queue`'s failed set back on the queue,
 * paced (see the module's notes). Bounded to the failed set as it is when the run starts. */
export async function replayFailed(queue: Queue, options: ReplayFailedOptions = {}): Promise<ReplayFailedReport> {
  const rate = Math.max(0.1, options.rate ?? 10);
  const maxReplays = options.maxReplays ?? 3;
  const limit = options.limit ?? Number.POSITIVE_INFINITY;
  const report: ReplayFailedReport = { matched: 0, moved: 0, alreadyMoved: 0, looping: 0, skipped: 0, heldSecs: 0 };
  const total = await queue.getFailedCount();
  const ids: string[] = [];
  for (let start = 0; start < total; start += 500) {
    for (const j of await queue.getFailed(start, Math.min(total, start + 500) - 1)) if (j?.id !== undefined) ids.push(j.id);
  }
  const started = Date.now();
  let sent = 0;
  const frozenUntil = new Map<string, number>();
  for (const id of ids) {
    if (report.moved + report.alreadyMoved >= limit) break;
    const job = await Job.fromId(queue, id);
    if (job === undefined || !(await job.isFailed())) continue; // gone, or replayed meanwhile
    const reason = keptReason(job.failedReason);
    if (reason === null || (options.reasons && !options.reasons.includes(reason)) || (options.tasks && !options.tasks.includes(job.name))) {
      report.skipped += 1;
      continue;
    }
    report.matched += 1;
    const n = replaysOf(job.id);
    if (n >= maxReplays) {
      report.looping += 1;
      continue;
    }
    if (options.dryRun) continue;
    await hold(options.budget ?? null, job.name, frozenUntil, report);
    // The pace: rate/8 in the first second, doubling each second, up to rate.
    for (;;) {
      const secs = (Date.now() - started) / 1000 - report.heldSecs;
      const pace = Math.min(rate, (rate / 8) * 2 ** Math.floor(secs));
      const allowed = Math.max(1, Math.floor(pace * secs) + 1);
      if (sent < allowed) break;
      await new Promise((r) => setTimeout(r, Math.max(5, 1000 / pace)));
    }
    sent += 1;
    const added = await putBack(queue, { queue: queue.name, id: job.id!, name: job.name, data: job.data, opts: job.opts }, n + 1);
    if (added) report.moved += 1;
    else report.alreadyMoved += 1;
    options.onProgress?.(report);
  }
  return report;
}

/** Waits while the budget of `task`'s dependency is frozen (asked at most once a second). */
async function hold(budget: FleetBudget | null, task: string, until: Map<string, number>, report: ReplayFailedReport): Promise<void> {
  if (budget === null) return;
  let dependency: string;
  try {
    dependency = budget.dependency(task);
  } catch {
    return;
  }
  for (;;) {
    if ((until.get(dependency) ?? 0) > Date.now()) return;
    const [snapshot] = await budget.status(dependency);
    if (!snapshot.control.frozen) {
      until.set(dependency, Date.now() + 1000);
      return;
    }
    await new Promise((r) => setTimeout(r, 1000));
    report.heldSecs += 1;
  }
}
