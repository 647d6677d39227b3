// `FleetBudget`: the Rust library's decision order, deposits, deny cache, group commit, fallback
// and metrics, on the same Redis scripts (crates/fleet-budget/src/budget; the Python client's
// budget.py is the second implementation this one follows).

import { Redis } from "ioredis";
import { Config, ConfigError, OVERFLOW_DEPENDENCY } from "./config.js";
import { ATTEMPTS_EXHAUSTED, BUDGET_EXHAUSTED, BUDGET_FROZEN, DELAY_EXCEEDED, DeadLetter, Decision, Failure, NON_RETRYABLE, Source } from "./decision.js";
import { DenyCache, FLEET_CACHE } from "./denyCache.js";
import { AdmissionControl } from "./admission.js";
import type { Admission, Call, CallOutcome } from "./admission.js";
import { WorkerRegistry } from "./registry.js";
import { Answer, GroupCommit, GroupTimeout, batchAnswer, batchNext } from "./groupCommit.js";
import { LocalStore } from "./local.js";
import { Memory } from "./memory.js";
import { Logger, Metrics } from "./metrics.js";
import { dependencyNameProblem, quoted, redactText, redactUrl } from "./names.js";
import { BudgetPolicy } from "./policy.js";
import { BadReply, Script, budgetKey, depositArgs, nextGrantMs, parseReply, spendArgs, spendManyArgs, splitMemory } from "./scripts.js";
import { BudgetSnapshot } from "./snapshot.js";

/** How often a dependency whose store calls failed is tried again (the Rust `PROBE_INTERVAL`). */
export const PROBE_INTERVAL_MS = 200;

/** A task with no mapping whose name cannot be a dependency name. */
export class InvalidTask extends Error {
  override name = "InvalidTask";
}

/** A task with no mapping, refused by `[unmapped_tasks] policy = "reject"`. */
export class UnmappedTask extends InvalidTask {
  override name = "UnmappedTask";
}

export interface Withdrawal {
  readonly granted: boolean;
  readonly snapshot: BudgetSnapshot;
  readonly source: Source;
}

export interface FleetBudgetOptions {
  /** An ioredis client of the caller's (closed by the caller); else one is made from `redis.url`. */
  redis?: Redis;
  metrics?: Metrics;
  /** Wall clock in ms (the fallback's windows, the pending deposits' age). */
  clock?: () => number;
  /** Uniform in [0, 1): the backoff's jitter. */
  random?: () => number;
  /** Group commit of withdrawals (on by default, as in Rust and Python). */
  groupCommit?: boolean;
  log?: Logger;
}

/** The `kind` label of a failed store call: timeout, connection, oom, server, bad_reply, bad_key. */
export function errorKind(error: unknown): string {
  if (error instanceof GroupTimeout) return "timeout";
  if (error instanceof BadReply) return "bad_reply";
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof Error && error.name === "ReplyError") {
    if (message.startsWith("OOM ")) return "oom";
    const rest = message.startsWith("fleet-budget: ") ? message.slice("fleet-budget: ".length) : null;
    if (rest !== null && rest.startsWith("key ") && [" is not a budget hash", " is not a breaker hash", " is not a lease set", " field "].some((m) => rest.includes(m))) {
      return "bad_key";
    }
    return "server";
  }
  if (/timed out|timeout/i.test(message)) return "timeout";
  return "connection";
}

interface Pending {
  successes: number;
  firstAttempts: number;
  since: number;
  denied: number;
}

export class FleetBudget {
  readonly config: Config;
  readonly metrics: Metrics;
  readonly redis: Redis;
  readonly local: LocalStore;
  private readonly ownClient: boolean;
  private readonly clock: () => number;
  private readonly random: () => number;
  private readonly log: Logger;
  private readonly ownBudgets = new Set<string>();
  private readonly memory = new Memory();
  private readonly freezes = new Map<string, number>();
  private readonly degraded = new Map<string, number>();
  /** When each dependency in fallback entered it (the worker registry's `for_ms`). */
  private readonly fallbackSince = new Map<string, number>();
  /** The concurrency budgets and breakers around each execution. */
  readonly admission: AdmissionControl;
  /** This worker's entry in the worker registry (null: `redis.heartbeat_ms = 0`). */
  readonly registry: WorkerRegistry | null;
  private readonly group: GroupCommit | null;
  private readonly denials: DenyCache;
  private pending = new Map<string, Pending>();
  private flushTimer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private closed = false;
  private oomLogged = false;
  private readonly spend = new Script("spend");
  private readonly spendMany = new Script("spend_many");
  private readonly depositScript = new Script("deposit");
  private readonly statusScript = new Script("status");

  constructor(config: Config = new Config(), options: FleetBudgetOptions = {}) {
    this.config = config;
    this.log = options.log ?? console;
    this.metrics = options.metrics ?? new Metrics(undefined, this.log);
    this.clock = options.clock ?? Date.now;
    this.random = options.random ?? Math.random;
    this.local = new LocalStore(this.clock);
    const settings = config.redis;
    this.ownClient = options.redis === undefined;
    if (options.redis !== undefined) {
      this.redis = options.redis;
    } else {
      let client: Redis;
      try {
        client = new Redis(settings.url, {
          // Every call is bounded by the deadline; a call on a dead connection fails at once
          // (and a deposit it carried is kept for a later flush), never queued to run later.
          commandTimeout: settings.timeoutMs,
          connectTimeout: Math.max(1000, settings.timeoutMs),
          enableOfflineQueue: false,
          autoResendUnfulfilledCommands: false,
          maxRetriesPerRequest: 0,
          retryStrategy: (times: number) => Math.min(100 * times, 1000),
        });
      } catch (e) {
        throw new ConfigError("redis.url", `${redactUrl(settings.url)}: ${(e as Error).message}`);
      }
      // Connection errors are counted on the calls that meet them; the client reconnects.
      client.on("error", () => {});
      this.redis = client;
    }
    this.group = options.groupCommit === false ? null : new GroupCommit(settings.timeoutMs);
    this.denials = new DenyCache(settings.denyCacheMs);
    for (const dependency of config.policies.keys()) {
      this.metrics.fallbackActive.set({ dependency }, 0);
      this.metrics.budgetLost.inc({ dependency }, 0);
    }
    if (settings.depositFlushMs > 0) {
      this.flushTimer = setInterval(() => void this.flush(), settings.depositFlushMs);
      this.flushTimer.unref();
    }
    this.admission = new AdmissionControl({
      redis: this.redis, keyPrefix: settings.keyPrefix, concurrency: config.concurrency, breakers: config.breakers,
      metrics: this.metrics, log: this.log, withdraw: (d) => this.withdraw(d), shouldTry: (d) => this.shouldTry(d),
      ok: (d) => this.ok(d), failed: (d, e) => this.failed(d, e), deadLetter: (d, reason) => this.deadLetter(d, reason, null, "fleet"),
      random: this.random,
    });
    if (settings.heartbeatMs > 0) {
      const registry = new WorkerRegistry(this.redis, settings.keyPrefix, settings.heartbeatMs, Math.max(1000, settings.timeoutMs), () => this.fallbackDependencies(),
        { warn: (m) => this.log.info(m) });
      this.registry = registry;
      // The first beat once the connection is up (a beat before it would only fail).
      if (this.redis.status === "ready") registry.start();
      else this.redis.once("ready", () => registry.start());
    } else {
      this.registry = null;
    }
  }

  /** Whether execution `attempt` (1 = first) of `task` may run now: the breaker, then a slot of
   * the concurrency budget (admission.ts). `heldForMs`: how long earlier holds held the job
   * (null: never). A `call` answer goes back to `finish` when the execution ends. */
  async admit(task: string, attempt: number, heldForMs: number | null = null): Promise<Admission> {
    return await this.admission.admit(this.dependency(task), attempt, heldForMs);
  }

  /** Gives back what `call` holds and reports how the execution ended to the breaker. */
  async finish(call: Call, outcome: CallOutcome): Promise<void> {
    await this.admission.finish(call, outcome);
  }

  /** The dependencies decided by the fallback now, each with how long (ms), in name order: what
   * the worker registry reports. */
  fallbackDependencies(): Array<[string, number]> {
    const now = this.clock();
    return [...this.fallbackSince.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([d, since]) => [d, Math.max(0, now - since)]);
  }

  /** A budget from a TOML file (`FLEET_BUDGET_REDIS_URL` over `redis.url`), its connection up
   * (or the fallback deciding until it is). */
  static async fromConfig(path: string, options: FleetBudgetOptions = {}): Promise<FleetBudget> {
    const budget = new FleetBudget(Config.fromPath(path), options);
    await budget.ready();
    return budget;
  }

  /** Waits until the connection is up, at most `ms`; false when it is not (the fallback decides
   * until it is). */
  async ready(ms = 2000): Promise<boolean> {
    if (this.redis.status === "ready") return true;
    return await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => done(false), ms);
      const done = (ok: boolean) => {
        clearTimeout(timer);
        this.redis.off("ready", onReady);
        resolve(ok);
      };
      const onReady = () => done(true);
      this.redis.on("ready", onReady);
    });
  }

  // The contract's three calls.

  /** The dependency whose budget `task` spends: its mapping, else what `[unmapped_tasks]` says. */
  dependency(task: string): string {
    const mapped = this.config.tasks.get(task);
    if (mapped !== undefined) return mapped;
    const unmapped = this.config.unmapped;
    if (unmapped.policy === "reject") {
      throw new UnmappedTask(`task ${quoted(task)} has no dependency mapping and unmapped tasks are rejected ([unmapped_tasks] policy = "reject")`);
    }
    if (unmapped.policy === "share" && unmapped.dependency !== null) return unmapped.dependency;
    const wrong = dependencyNameProblem(task);
    if (wrong) throw new InvalidTask(`task ${quoted(task)} has no dependency mapping and ${wrong}`);
    if (this.ownBudgets.has(task)) return task;
    if (this.ownBudgets.size >= unmapped.maxOwnBudgets) return OVERFLOW_DEPENDENCY;
    this.ownBudgets.add(task);
    return task;
  }

  /** An execution starts; `attempt` 1 is the first (a deposit under basis `request`). */
  async onAttempt(task: string, attempt: number): Promise<void> {
    const dependency = this.dependency(task);
    this.metrics.executions.inc({ dependency });
    if (attempt > 1) return;
    this.metrics.firstAttempts.inc({ dependency });
    await this.count(dependency, 0, 1);
  }

  async onSuccess(task: string): Promise<void> {
    const dependency = this.dependency(task);
    this.metrics.successes.inc({ dependency });
    await this.count(dependency, 1, 0);
  }

  /** Retry or dead-letter, in the contract's order: retryable, ceiling, then the budget.
   * `sinceFirstFailureMs`: how long ago the job first failed (0 for this failure), for a task
   * with a recovery window. */
  async onFailure(task: string, attempt: number, failure: Failure, sinceFirstFailureMs: number | null = null): Promise<Decision> {
    const dependency = this.dependency(task);
    attempt = Math.max(1, Math.floor(attempt) || 1);
    if (!failure.isRetryable) return this.deadLetter(dependency, NON_RETRYABLE, null, "not_consulted");
    const ceiling = this.config.ceiling(task);
    if (ceiling.exhausted(attempt, sinceFirstFailureMs)) return this.deadLetter(dependency, ATTEMPTS_EXHAUSTED, null, "not_consulted");
    // A wait past `max_delay` is refused before any budget is spent.
    if (failure.retryAfterMs !== null && !ceiling.allowsWait(failure.retryAfterMs)) {
      return this.deadLetter(dependency, DELAY_EXCEEDED, null, "not_consulted");
    }
    const { granted, snapshot, source } = await this.withdraw(dependency);
    (granted ? this.metrics.retriesGranted : this.metrics.retriesDenied).inc({ dependency });
    if (source === FLEET_CACHE) this.metrics.retriesDeniedInProcess.inc({ dependency });
    else this.metrics.snapshot(dependency, snapshot);
    if (!granted) return this.deadLetter(dependency, snapshot.control.frozen ? BUDGET_FROZEN : BUDGET_EXHAUSTED, snapshot, source);
    const delayMs = ceiling.delay(attempt, sinceFirstFailureMs, failure.retryAfterMs, this.random);
    return { kind: "retry", dependency, delayMs, nextAttempt: attempt + 1, snapshot, source };
  }

  private deadLetter(dependency: string, reason: string, snapshot: BudgetSnapshot | null, source: Source): DeadLetter {
    this.metrics.deadLetters.inc({ dependency, reason });
    return { kind: "dead_letter", dependency, reason, snapshot, source };
  }

  /** Spend one retry. A denial of the fleet store that still stands is answered without a call
   * (source `fleet_cache`). */
  async withdraw(dependency: string): Promise<Withdrawal> {
    const policy = this.config.policy(dependency);
    const [cached, epoch] = this.denials.lookup(dependency);
    if (cached !== null) {
      this.countDenied(dependency); // Redis never sees it: sent with the deposits
      return { granted: false, snapshot: cached, source: FLEET_CACHE };
    }
    if (this.shouldTry(dependency)) {
      const sent = this.denials.now();
      const asked = this.clock();
      try {
        const [granted, snapshot, wait] = this.group === null
          ? (await this.spendAnswers(dependency, policy, 1))[0]!
          : await this.group.withdraw(dependency, (n) => this.spendAnswers(dependency, policy, n));
        this.ok(dependency);
        if (snapshot.control.frozen) this.freezes.set(dependency, asked + (wait ?? 3_600_000));
        else this.freezes.delete(dependency);
        this.denials.remember(dependency, epoch, sent, granted, snapshot, wait);
        return { granted, snapshot, source: "fleet" };
      } catch (e) {
        this.failed(dependency, e);
      }
    }
    return this.fallback(dependency, policy);
  }

  private async timed<T>(op: string, call: () => Promise<T>): Promise<T> {
    const end = this.metrics.storeCallDuration.startTimer({ op });
    try {
      return await call();
    } finally {
      end();
    }
  }

  private async spendAnswers(dependency: string, policy: BudgetPolicy, n: number): Promise<Answer[]> {
    const key = budgetKey(this.config.redis.keyPrefix, dependency);
    const memory = this.memory.args(key);
    if (n === 1) {
      const reply = await this.timed("spend", () => this.spend.run(this.redis, [key], spendArgs(policy, memory)));
      const [granted, snapshot, base] = this.remembered("spend", dependency, key, reply, policy);
      return [[granted === 1, snapshot, nextGrantMs("spend", base)]];
    }
    const reply = await this.timed("spend", () => this.spendMany.run(this.redis, [key], spendManyArgs(policy, n, memory)));
    const [granted, snapshot, base] = this.remembered("spend_many", dependency, key, reply, policy);
    const wait = nextGrantMs("spend_many", base);
    return Array.from({ length: n }, (_, k) => [...batchAnswer(snapshot, n, granted, k), batchNext(wait, granted, k)] as Answer);
  }

  /** Decodes a reply to a call that sent this process's memory of the hash, learns from it, and
   * marks the snapshot `lost` (counted, logged once per window) when the hash was restored. */
  private remembered(script: string, dependency: string, key: string, reply: unknown, policy: BudgetPolicy): [number, BudgetSnapshot, unknown[]] {
    const [base, state] = splitMemory(script, reply);
    let { granted, snapshot } = parseReply(script, base, policy);
    this.memory.learn(key, state, snapshot);
    if (state.lost) {
      snapshot = { ...snapshot, control: { ...snapshot.control, lost: true } };
      this.metrics.budgetLostSeen(dependency, snapshot);
    }
    return [granted, snapshot, base];
  }

  private fallback(dependency: string, policy: BudgetPolicy): Withdrawal {
    const mode = this.config.redis.fallback;
    this.metrics.fallbackDecisions.inc({ mode });
    const source: Source = mode === "local" ? "local_fallback" : "blind";
    if ((this.freezes.get(dependency) ?? 0) > this.clock()) {
      // An operator's freeze Redis showed, not ended: nothing is granted, whatever the mode.
      const snap = this.local.status(dependency, policy);
      return { granted: false, snapshot: { ...snap, allowance: 0, control: { ...snap.control, frozen: true } }, source };
    }
    if (mode === "local") {
      const [granted, snapshot] = this.local.withdraw(dependency, policy);
      return { granted, snapshot, source };
    }
    return { granted: mode === "allow", snapshot: this.local.status(dependency, policy), source };
  }

  /** The budget as the next spend would see it (`status.lua`, which writes nothing). */
  async status(dependency: string): Promise<[BudgetSnapshot, Source]> {
    const policy = this.config.policy(dependency);
    try {
      const reply = await this.timed("status", () => this.statusScript.run(this.redis, [budgetKey(this.config.redis.keyPrefix, dependency)], spendArgs(policy)));
      const { snapshot } = parseReply("status", reply, policy);
      this.ok(dependency);
      this.denials.seen(dependency, snapshot.control);
      return [snapshot, "fleet"];
    } catch (e) {
      this.failed(dependency, e);
      return [this.local.status(dependency, policy), "local_fallback"];
    }
  }

  // Deposits: counted in the process and coalesced per dependency, sent every
  // `redis.deposit_flush_ms` (one `deposit.lua` call per dependency) or when
  // `redis.deposit_flush_count` are pending, with the denials answered in the process.

  pendingDeposits(): number {
    let total = 0;
    for (const p of this.pending.values()) total += p.successes + p.firstAttempts;
    return total;
  }

  private entry(dependency: string): Pending {
    let p = this.pending.get(dependency);
    if (p === undefined) {
      p = { successes: 0, firstAttempts: 0, since: this.clock(), denied: 0 };
      this.pending.set(dependency, p);
    }
    return p;
  }

  private async count(dependency: string, successes: number, firstAttempts: number): Promise<void> {
    const policy = this.config.policy(dependency);
    this.local.deposit(dependency, policy, successes, firstAttempts);
    if (this.config.redis.depositFlushMs === 0 && this.shouldTry(dependency)) {
      const kept = this.pending.get(dependency);
      this.pending.delete(dependency);
      if (kept === undefined || this.clock() - kept.since > policy.windowMs) {
        await this.sendDeposit(dependency, successes, firstAttempts, 0);
      } else {
        await this.sendDeposit(dependency, successes + kept.successes, firstAttempts + kept.firstAttempts, kept.denied);
      }
      return;
    }
    const p = this.entry(dependency);
    p.successes += successes;
    p.firstAttempts += firstAttempts;
    const total = this.pendingDeposits();
    this.metrics.depositsPending.set(total);
    if (total >= this.config.redis.depositFlushCount) void this.flush();
  }

  private countDenied(dependency: string): void {
    this.entry(dependency).denied += 1;
  }

  /** Sends the coalesced deposits now (one `deposit.lua` call per dependency); deposits pending
   * for longer than their window are dropped, never credited all at once to the current one. */
  async flush(): Promise<void> {
    if (this.flushing !== null) await this.flushing;
    const batch = this.pending;
    this.pending = new Map();
    const now = this.clock();
    const sends: Promise<boolean>[] = [];
    for (const [dependency, p] of batch) {
      if (now - p.since <= this.config.policy(dependency).windowMs) {
        sends.push(this.sendDeposit(dependency, p.successes, p.firstAttempts, p.denied));
      }
    }
    this.flushing = Promise.all(sends).then(() => undefined);
    try {
      await this.flushing;
    } finally {
      this.flushing = null;
      this.metrics.depositsPending.set(this.pendingDeposits());
    }
  }

  private async sendDeposit(dependency: string, successes: number, firstAttempts: number, denied: number): Promise<boolean> {
    const policy = this.config.policy(dependency);
    const key = budgetKey(this.config.redis.keyPrefix, dependency);
    try {
      const memory = this.memory.args(key);
      const reply = await this.timed("deposit", () => this.depositScript.run(this.redis, [key], depositArgs(policy, successes, firstAttempts, denied, memory)));
      this.remembered("deposit", dependency, key, reply, policy);
    } catch (e) {
      this.failed(dependency, e);
      if (errorKind(e) === "connection") {
        // Refused by a dead connection: kept for a later flush. A call past its deadline
        // usually reached Redis: not sent again (lua/README.md, "Coalesced deposits").
        const p = this.entry(dependency);
        p.successes += successes;
        p.firstAttempts += firstAttempts;
        p.denied += denied;
      } else if (successes || firstAttempts) {
        this.denials.forget(dependency);
      }
      return false;
    }
    this.ok(dependency);
    // Deposits reached Redis: a denial kept may not stand. Denials alone make no room.
    if (successes || firstAttempts) this.denials.forget(dependency);
    return true;
  }

  // Health: a dependency whose store call failed is decided by the fallback, and probed again
  // once per PROBE_INTERVAL_MS.

  get inFallback(): boolean {
    return this.degraded.size > 0;
  }

  private shouldTry(dependency: string): boolean {
    const nextProbe = this.degraded.get(dependency);
    if (nextProbe === undefined) return true;
    const now = this.clock();
    if (now >= nextProbe || nextProbe > now + PROBE_INTERVAL_MS) {
      this.degraded.set(dependency, now + PROBE_INTERVAL_MS);
      return true;
    }
    return false;
  }

  private ok(dependency: string): void {
    if (!this.degraded.delete(dependency)) return;
    this.fallbackSince.delete(dependency);
    this.metrics.fallbackDependencies.set(this.degraded.size);
    this.metrics.fallbackActive.set({ dependency }, 0);
    if (this.degraded.size === 0) {
      this.oomLogged = false;
      this.log.info("fleet-budget: the store answers again; leaving fallback");
    }
  }

  private failed(dependency: string, error: unknown): void {
    const kind = errorKind(error);
    this.metrics.storeErrors.inc({ kind });
    if (kind === "oom" && !this.oomLogged) {
      this.oomLogged = true;
      this.log.error(`fleet-budget: Redis refuses the budget's writes for ${JSON.stringify(dependency)}: its memory is full (reason oom); `
        + `retry decisions come from the fallback ${this.config.redis.fallback} until it frees memory`);
    } else if (kind === "bad_reply" || kind === "bad_key" || kind === "server") {
      this.log.error(`fleet-budget: store call for ${JSON.stringify(dependency)} failed (${kind}): ${redactText(String((error as Error)?.message ?? error))}`);
    }
    const isNew = !this.degraded.has(dependency);
    this.degraded.set(dependency, this.clock() + PROBE_INTERVAL_MS);
    if (isNew) {
      this.fallbackSince.set(dependency, this.clock());
      this.metrics.fallbackDependencies.set(this.degraded.size);
      this.metrics.fallbackActive.set({ dependency }, 1);
      if (this.degraded.size === 1) {
        this.log.warn(`fleet-budget: the store failed for ${JSON.stringify(dependency)} (${redactText(String((error as Error)?.message ?? error))}); entering fallback ${this.config.redis.fallback}`);
      }
    }
  }

  /** Sends what is pending and closes the connection (a client given by the caller stays open).
   * Returns the deposits that could not be sent (0 when all were): they are lost, the safe
   * direction. */
  async close(): Promise<number> {
    if (this.closed) return this.pendingDeposits();
    this.closed = true;
    if (this.flushTimer !== null) clearInterval(this.flushTimer);
    await this.flush();
    const unsent = this.pendingDeposits();
    if (unsent > 0) {
      this.log.warn(`fleet-budget: closed with ${unsent} deposits not sent (Redis did not take them); they are lost, which can only make the fleet's allowance smaller`);
    }
    await this.registry?.leave();
    if (this.ownClient) this.redis.disconnect();
    return unsent;
  }
}

