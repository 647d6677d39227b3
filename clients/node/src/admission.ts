// Admission of one call to a dependency: the fleet-wide concurrency budget and circuit breaker
// (the Rust `budget/admission.rs`, `concurrency/`, `breaker/`; the Python client's admission.py,
// concurrency.py and breaker.py), on the shared scripts `lease_acquire.lua`, `lease_release.lua`
// and `breaker.lua` (lua/README.md, "Concurrency leases" and "Circuit breaker").
//
// Why: the rate budget decides whether a failed job *may* retry; the retry runs later. The
// concurrency budget and the breaker are about the moment of the call, so every execution asks
// `admit` just before its body runs and gives the `Call` back to `finish` when it returns.
// `admit` answers:
//
// - a `Call`: run it (holding a lease when the dependency has a concurrency budget);
// - a `Hold`: do not run it and do not count an attempt; wait `pauseMs` and ask again, with
//   `heldForMs` the time held so far (a primary at the cap under `primary_waits`, or a breaker
//   open or half-open with every probe out);
// - a `DeadLetter`: do not run it (a retry refused a slot, a primary held past the policy's
//   `max_wait`, a job held by the breaker past its `max_wait`).
//
// The breaker is asked first: closed, go on; half-open with a probe left, the call is a probe,
// one retry of the rate budget's floor (a probe the rate budget refuses is given back). When
// Redis does not answer, the call runs without a lease and without a breaker: the rate budget and
// its fallback still bound retries, and a dead store must not stop primary traffic.

import { randomBytes } from "node:crypto";
import type { Redis } from "ioredis";
import type { DeadLetter } from "./decision.js";
import type { Logger, Metrics } from "./metrics.js";
import { BadReply, Script, budgetKey, ratioText } from "./scripts.js";

/** The dead-letter reasons of admission (the Rust `Refusal::reason`, `CIRCUIT_OPEN`). */
export const CONCURRENCY_CAP = "concurrency_cap";
export const CONCURRENCY_RETRY_SHARE = "concurrency_retry_share";
export const CIRCUIT_OPEN = "circuit_open";
/** Why a job is held. */
export const PRIMARY_AT_CAP = "primary_at_cap";

/** How an admitted call ended, for the breaker (the Rust `CallOutcome`). */
export type CallOutcome = "succeeded" | "failed" | "inconclusive";

/** `[dependencies.X.concurrency]`, resolved (durations in ms). */
export interface ConcurrencyPolicy {
  readonly cap: number;
  readonly maxRetryFraction: number;
  readonly minRetrySlots: number;
  readonly leaseMs: number;
  readonly primaryWaits: boolean;
  readonly maxWaitMs: number;
}

/** `[dependencies.X.breaker]`, resolved (durations in ms). */
export interface BreakerPolicy {
  readonly windowMs: number;
  readonly failureRatio: number;
  readonly minVolume: number;
  readonly openMs: number;
  readonly halfOpenProbes: number;
  readonly closeAfter: number;
  readonly probeTimeoutMs: number;
  readonly maxWaitMs: number;
}

/** The breaker's states by the script's code, as the metrics and `budgetctl status` spell them. */
export const BREAKER_STATES = ["closed", "open", "half_open"] as const;
const RUN = 0;
const PROBE = 1;

/** An admitted execution: give it to `finish`. */
export interface Call {
  readonly kind: "call";
  readonly dependency: string;
  lease: { id: string; expiresAtMs: number } | null;
  /** The breaker admitted it: its result is reported to the breaker. */
  judged: boolean;
  /** The generation of the half-open probe it is, if it is one. */
  probe: number | null;
}

/** Do not run it yet: wait `pauseMs` without spending an attempt, then ask again. */
export interface Hold {
  readonly kind: "hold";
  readonly reason: string;
  readonly pauseMs: number;
}

export type Admission = Call | Hold | DeadLetter;

/** The first `n` fields of a reply, each a non-negative integer (the Rust `count_at`). */
export function counts(script: string, reply: unknown, n: number): number[] {
  if (!Array.isArray(reply)) throw new BadReply(script, `expected an array, got ${typeof reply}`);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    if (i >= reply.length) throw new BadReply(script, `field ${i + 1} is missing`);
    const v = reply[i];
    if (typeof v !== "number" || !Number.isInteger(v)) throw new BadReply(script, `field ${i + 1} is not an integer`);
    if (v < 0) throw new BadReply(script, `field ${i + 1} is negative: ${v}`);
    out.push(v);
  }
  return out;
}

export function leaseKeys(prefix: string, dependency: string): string[] {
  const base = budgetKey(prefix, dependency);
  return [`${base}:lp`, `${base}:lr`];
}

export function breakerKey(prefix: string, dependency: string): string[] {
  return [`${budgetKey(prefix, dependency)}:cb`];
}

export function breakerArgs(p: BreakerPolicy, op: string, ...extra: string[]): string[] {
  return [op, String(p.windowMs), ratioText(p.failureRatio), String(p.minVolume), String(p.openMs), String(p.halfOpenProbes),
    String(p.closeAfter), String(p.probeTimeoutMs), ...extra];
}

export function acquireArgs(p: ConcurrencyPolicy, retry: boolean, leaseId: string): string[] {
  return [retry ? "r" : "p", leaseId, String(p.leaseMs), String(p.cap), ratioText(p.maxRetryFraction), String(p.minRetrySlots),
    p.primaryWaits ? "1" : "0"];
}

/** A breaker's answer to `admit` or `record`: the verdict (RUN for record), the state after the
 * call, whether this call changed it, when an open breaker half-opens, the server's time. */
interface Decided {
  verdict: number;
  state: number;
  generation: number;
  changed: boolean;
  openUntilMs: number;
  nowMs: number;
}

function state(code: number): number {
  if (code > 2) throw new BadReply("breaker", `state ${code} is not 0, 1 or 2`);
  return code;
}

/** What `admit` needs of the budget, handed in so that this file owns only admission's state. */
export interface AdmissionParts {
  redis: Redis;
  keyPrefix: string;
  concurrency: ReadonlyMap<string, ConcurrencyPolicy>;
  breakers: ReadonlyMap<string, BreakerPolicy>;
  metrics: Metrics;
  log: Logger;
  /** One retry of the rate budget (a half-open probe spends one). */
  withdraw: (dependency: string) => Promise<{ granted: boolean }>;
  /** The store's health: whether to call it for `dependency`, and what a call showed. */
  shouldTry: (dependency: string) => boolean;
  ok: (dependency: string) => void;
  failed: (dependency: string, error: unknown) => void;
  deadLetter: (dependency: string, reason: string) => DeadLetter;
  random: () => number;
}

/** The breaker and the lease around each execution. */
export class AdmissionControl {
  private readonly acquire = new Script("lease_acquire");
  private readonly release = new Script("lease_release");
  private readonly breaker = new Script("breaker");
  private readonly stem = `node${process.pid.toString(16)}-${randomBytes(8).toString("hex")}`;
  private n = 0;
  /** Breakers this process saw open, until when: one found closed before then was lost. */
  private readonly seenOpen = new Map<string, number>();

  constructor(private readonly p: AdmissionParts) {}

  /** Whether `dependency` has a concurrency budget or a breaker (else `admit` always runs). */
  governs(dependency: string): boolean {
    return this.p.concurrency.has(dependency) || this.p.breakers.has(dependency);
  }

  /** Whether execution `attempt` (1 = first) may run now; `heldForMs`: how long the job was held
   * by earlier holds (null: never). */
  async admit(dependency: string, attempt: number, heldForMs: number | null): Promise<Admission> {
    const call: Call = { kind: "call", dependency, lease: null, judged: false, probe: null };
    const held = await this.judge(call, heldForMs);
    if (held !== null) return held;
    const policy = this.p.concurrency.get(dependency);
    if (policy === undefined || !this.p.shouldTry(dependency)) return call;
    const retry = Math.floor(attempt) > 1;
    const leaseId = `${this.stem}-${(++this.n).toString(16)}`;
    let reply: unknown;
    try {
      reply = await this.acquire.run(this.p.redis, leaseKeys(this.p.keyPrefix, dependency), acquireArgs(policy, retry, leaseId));
    } catch (e) {
      this.p.failed(dependency, e);
      return call; // the call runs uncounted
    }
    let fields: number[];
    try {
      fields = counts("lease_acquire", reply, 6);
    } catch (e) {
      this.p.failed(dependency, e);
      return call;
    }
    this.p.ok(dependency);
    const [granted, refusal, primaries, retries, , now] = fields as [number, number, number, number, number, number];
    this.inFlight(dependency, primaries, retries);
    if (granted === 1 && refusal === 0) {
      call.lease = { id: leaseId, expiresAtMs: now + policy.leaseMs };
      return call;
    }
    if (granted !== 0 || (refusal !== 1 && refusal !== 2)) {
      this.p.failed(dependency, new BadReply("lease_acquire", `granted and refusal are (${granted}, ${refusal})`));
      return call;
    }
    // Not run: a probe it was is given back for another call to make.
    await this.finish(call, "inconclusive");
    if (!retry && (heldForMs ?? 0) < policy.maxWaitMs) return { kind: "hold", reason: PRIMARY_AT_CAP, pauseMs: 1000 };
    return this.p.deadLetter(dependency, refusal === 1 ? CONCURRENCY_CAP : CONCURRENCY_RETRY_SHARE);
  }

  /** Gives back what `call` holds and reports how it ended to the breaker. A store call that
   * fails is logged: the slot comes back when its lease expires, a lost probe after the probe
   * timeout. */
  async finish(call: Call, outcome: CallOutcome): Promise<void> {
    const { dependency } = call;
    const lease = call.lease;
    if (lease !== null) {
      call.lease = null;
      try {
        const reply = await this.release.run(this.p.redis, leaseKeys(this.p.keyPrefix, dependency), [lease.id]);
        const [removed, primaries, retries] = counts("lease_release", reply, 3) as [number, number, number];
        this.p.ok(dependency);
        this.inFlight(dependency, primaries, retries);
        const serverMs = Array.isArray(reply) ? reply[3] : undefined;
        if (removed === 0 && typeof serverMs === "number" && serverMs < lease.expiresAtMs) {
          this.p.metrics.leasesLost.inc({ dependency });
          this.p.log.warn(`fleet-budget: a concurrency lease of ${JSON.stringify(dependency)} was gone from Redis before its expiry `
            + "(evicted by a maxmemory-policy, FLUSHALL, or a restart without persistence): its slot was free for others meanwhile; "
            + "counted in fleet_budget_leases_lost_total");
        }
      } catch (e) {
        this.p.failed(dependency, e);
      }
    }
    const policy = this.p.breakers.get(dependency);
    if (!call.judged || policy === undefined || (outcome === "inconclusive" && call.probe === null)) return;
    call.judged = false;
    const keys = breakerKey(this.p.keyPrefix, dependency);
    try {
      if (outcome === "inconclusive") {
        counts("breaker", await this.breaker.run(this.p.redis, keys, breakerArgs(policy, "cancel", String(call.probe))), 1);
        this.p.ok(dependency);
        return;
      }
      const reply = await this.breaker.run(this.p.redis, keys, breakerArgs(policy, "record", outcome === "succeeded" ? "s" : "f", String(call.probe ?? 0)));
      const [st, generation, openUntilMs, changed, nowMs] = counts("breaker", reply, 5) as [number, number, number, number, number];
      this.p.ok(dependency);
      this.seen(dependency, { verdict: RUN, state: state(st), generation, changed: changed === 1, openUntilMs, nowMs });
    } catch (e) {
      this.p.failed(dependency, e);
    }
  }

  /** Asks the breaker, if the dependency has one: null to go on (`call` marked judged, and a
   * probe when it is one), else the admission of a held job. */
  private async judge(call: Call, heldForMs: number | null): Promise<Admission | null> {
    const { dependency } = call;
    const policy = this.p.breakers.get(dependency);
    if (policy === undefined || !this.p.shouldTry(dependency)) return null;
    const keys = breakerKey(this.p.keyPrefix, dependency);
    let decided: Decided;
    try {
      const reply = await this.breaker.run(this.p.redis, keys, breakerArgs(policy, "admit"));
      const [verdict, st, generation, openUntilMs, changed, nowMs] = counts("breaker", reply, 6) as [number, number, number, number, number, number];
      if (verdict > 2) throw new BadReply("breaker", `verdict ${verdict} is not 0, 1 or 2`);
      decided = { verdict, state: state(st), generation, changed: changed === 1, openUntilMs, nowMs };
    } catch (e) {
      this.p.failed(dependency, e);
      return null; // the breaker not consulted: the call runs
    }
    this.p.ok(dependency);
    this.seen(dependency, decided);
    if (decided.verdict === RUN) {
      call.judged = true;
      return null;
    }
    if (decided.verdict === PROBE) {
      // A probe is one retry of the rate budget, which the floor grants however it fails.
      const { granted } = await this.p.withdraw(dependency);
      if (granted) {
        call.judged = true;
        call.probe = decided.generation;
        return null;
      }
      try {
        counts("breaker", await this.breaker.run(this.p.redis, keys, breakerArgs(policy, "cancel", String(decided.generation))), 1);
      } catch {
        // Reissued after the probe timeout.
      }
    }
    const held = heldForMs ?? 0;
    if (held >= policy.maxWaitMs) return this.p.deadLetter(dependency, CIRCUIT_OPEN);
    // Back when the open period ends, or when the job's limit does if that comes first; at least
    // 1 s, and up to a quarter more so that the held jobs do not all come back at once.
    const rest = Math.max(1000, Math.min(Math.max(0, decided.openUntilMs - decided.nowMs), policy.maxWaitMs - held));
    return { kind: "hold", reason: CIRCUIT_OPEN, pauseMs: Math.round(rest * (1 + 0.25 * this.p.random())) };
  }

  /** Shows the state seen; logs and counts a change this call made (once fleet-wide), and a
   * breaker lost in Redis (one seen open, found closed before its open period ended). */
  private seen(dependency: string, d: Decided): void {
    this.p.metrics.breakerState.set({ dependency }, d.state);
    const openUntil = this.seenOpen.get(dependency);
    if (d.state === 1) this.seenOpen.set(dependency, d.openUntilMs);
    else if (d.state === 2) this.seenOpen.delete(dependency);
    else if (openUntil !== undefined) {
      this.seenOpen.delete(dependency);
      if (!d.changed && d.nowMs < openUntil) {
        this.p.metrics.breakerTransitions.inc({ dependency, to: "lost" });
        this.p.log.warn(`fleet-budget: circuit breaker of ${JSON.stringify(dependency)} found closed before its open period ended: its key `
          + "was lost in Redis (evicted by a maxmemory-policy, FLUSHALL, or a restart without persistence); it opens again after "
          + "min_volume calls; counted in fleet_budget_breaker_transitions_total{to=\"lost\"}");
      }
    }
    if (d.changed) {
      const to = BREAKER_STATES[d.state]!;
      this.p.metrics.breakerTransitions.inc({ dependency, to });
      this.p.log.warn(`fleet-budget: circuit breaker of ${JSON.stringify(dependency)} changed state to ${to} (open until ${d.openUntilMs} ms)`);
    }
  }

  private inFlight(dependency: string, primaries: number, retries: number): void {
    this.p.metrics.callsInFlight.set({ dependency, kind: "primary" }, primaries);
    this.p.metrics.callsInFlight.set({ dependency, kind: "retry" }, retries);
    this.p.metrics.retryFraction.set({ dependency }, primaries > 0 ? retries / primaries : 0);
    this.p.metrics.leasesLost.inc({ dependency }, 0);
  }

  /** `dependency`'s breaker as Redis holds it (null: it has no breaker); writes nothing. */
  async breakerStatus(dependency: string): Promise<{ state: string; openUntilMs: number; timesOpened: number } | null> {
    const policy = this.p.breakers.get(dependency);
    if (policy === undefined) return null;
    const f = counts("breaker", await this.breaker.run(this.p.redis, breakerKey(this.p.keyPrefix, dependency), breakerArgs(policy, "status")), 11);
    return { state: BREAKER_STATES[state(f[0]!)]!, openUntilMs: f[2]!, timesOpened: f[6]! };
  }
}
