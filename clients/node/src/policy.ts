// A dependency's budget policy, and a task's ceiling and backoff (the Rust `policy.rs` and
// `ceiling.rs`, the Python client's policy.py). Durations are in ms here.

/** Attempts per job class (the contract, docs/semantics.md). */
export const CLASS_MAX_ATTEMPTS: Readonly<Record<string, number>> = {
  idempotent: 8, metered: 4, paid: 2, side_effect: 1, batch: 2,
};

export type Basis = "success" | "request";
export type Mode = "sliding" | "fixed";

/** window, ratio, floor, what counts as a deposit, mode. */
export interface BudgetPolicy {
  readonly windowMs: number;
  readonly ratio: number;
  readonly minAllowance: number;
  readonly deposit: Basis;
  readonly mode: Mode;
}

export const DEFAULT_POLICY: BudgetPolicy = { windowMs: 60_000, ratio: 0.2, minAllowance: 10, deposit: "success", mode: "sliding" };

export function basisCode(p: BudgetPolicy): "s" | "a" {
  return p.deposit === "request" ? "a" : "s";
}

export const JITTER_LOW = 0.75;
export const JITTER_HIGH = 1.25;
/** No task runs more executions than this, whatever its ceiling (the Rust `MAX_ATTEMPTS`). */
export const MAX_ATTEMPTS = 1000;
/** The `max_delay` of tasks that set none: the longest default retry tier, 1,024 s. */
export const DEFAULT_MAX_DELAY_MS = 1_024_000;

/** Exponential backoff with centred jitter and a cap, in ms (the Rust `backoff.rs`). */
export class Backoff {
  constructor(readonly baseMs = 2000, readonly factor = 2, readonly capMs = 600_000) {}

  nominal(failedAttempt: number): number {
    const exponent = Math.max(0, failedAttempt - 1);
    const ms = this.baseMs * this.factor ** exponent;
    if (!Number.isFinite(ms) || ms >= this.capMs) return this.capMs;
    return Math.max(0, ms);
  }

  /** Uniform in `[3n/4, 5n/4]`: spread over half the nominal, mean the nominal. */
  static jitter(nominal: number, random: () => number): number {
    return nominal * (JITTER_LOW + (JITTER_HIGH - JITTER_LOW) * random());
  }

  /** Executions of the nominal schedule whose last attempt runs when the window ends. */
  attemptsForRecoveryWindow(windowMs: number): number {
    let attempts = 1;
    let at = 0;
    for (let failed = 1; failed < MAX_ATTEMPTS; failed++) {
      const delay = delayWithinWindow(this, failed, at, windowMs, this.nominal(failed));
      if (delay === null) break;
      at += delay;
      attempts += 1;
    }
    return attempts;
  }
}

/** The delay after `failedAttempt` failed `elapsed` ms after the job's first failure, when its
 * retries end `window` ms after that failure; null when the window has passed. */
export function delayWithinWindow(backoff: Backoff, failedAttempt: number, elapsed: number, window: number, drawn: number): number | null {
  const left = window - elapsed;
  if (left <= 0) return null;
  if (drawn >= left) return left;
  if (left - drawn < backoff.nominal(failedAttempt + 1) / 2) return left;
  return drawn;
}

/** A task's attempt ceiling: a count, or a recovery window (ms) since the first failure; and
 * `maxDelayMs`, the longest the job may wait before its next execution (null: unbounded). */
export class TaskCeiling {
  constructor(
    readonly maxAttempts = 5,
    readonly backoff = new Backoff(),
    readonly recoveryWindowMs: number | null = null,
    readonly maxDelayMs: number | null = null,
  ) {}

  allowsWait(waitMs: number): boolean {
    return this.maxDelayMs === null || waitMs <= this.maxDelayMs;
  }

  exhausted(failedAttempt: number, sinceFirstFailureMs: number | null): boolean {
    if (this.recoveryWindowMs !== null && sinceFirstFailureMs !== null) {
      return sinceFirstFailureMs >= this.recoveryWindowMs || failedAttempt >= MAX_ATTEMPTS;
    }
    return failedAttempt >= this.maxAttempts;
  }

  /** The jittered delay, fitted to the recovery window, at most `maxDelayMs`; a `Retry-After`
   * is a lower bound. */
  delay(failedAttempt: number, sinceFirstFailureMs: number | null, retryAfterMs: number | null, random: () => number): number {
    const drawn = Backoff.jitter(this.backoff.nominal(failedAttempt), random);
    let fitted = drawn;
    if (this.recoveryWindowMs !== null && sinceFirstFailureMs !== null) {
      const within = delayWithinWindow(this.backoff, failedAttempt, sinceFirstFailureMs, this.recoveryWindowMs, drawn);
      fitted = within === null ? drawn : within;
    }
    if (this.maxDelayMs !== null) fitted = Math.min(fitted, this.maxDelayMs);
    if (retryAfterMs !== null && retryAfterMs > fitted) return retryAfterMs;
    return fitted;
  }

  withMaxDelay(maxDelayMs: number): TaskCeiling {
    return new TaskCeiling(this.maxAttempts, this.backoff, this.recoveryWindowMs, maxDelayMs);
  }
}
