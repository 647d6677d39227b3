// What a script replies: the two windows' counters and the allowance (the Rust `allowance.rs`).

export interface WindowCounters {
  readonly successes: number;
  readonly firstAttempts: number;
  readonly retries: number;
  readonly denied: number;
}

/** What Redis said about the policy and the operators' overrides (all false locally). */
export interface Control {
  /** The caller's policy differs from the one in force, which decided. */
  readonly conflict: boolean;
  /** A freeze is in force: no retry is granted, the floor included. */
  readonly frozen: boolean;
  /** A set override replaces the ratio and/or the floor. */
  readonly overridden: boolean;
  /** The call found the budget hash this process remembered gone, and restored it. */
  readonly lost: boolean;
}

export const NO_CONTROL: Control = { conflict: false, frozen: false, overridden: false, lost: false };

export interface BudgetSnapshot {
  readonly windowMs: number;
  readonly windowIndex: number;
  readonly elapsedMs: number;
  readonly previousWeightMs: number;
  readonly current: WindowCounters;
  readonly previous: WindowCounters;
  readonly allowance: number;
  readonly control: Control;
}

export function counters(values: readonly number[]): WindowCounters {
  return { successes: values[0] ?? 0, firstAttempts: values[1] ?? 0, retries: values[2] ?? 0, denied: values[3] ?? 0 };
}

function estimate(s: BudgetSnapshot, current: number, previous: number): number {
  return Math.floor((current * s.windowMs + previous * s.previousWeightMs) / Math.max(1, s.windowMs));
}

/** The retries estimate of the sliding window (what the `fb-budget-retries` header says). */
export function retriesEstimate(s: BudgetSnapshot): number {
  return estimate(s, s.current.retries, s.previous.retries);
}

/** Retries that would still be granted now (the headroom). */
export function remaining(s: BudgetSnapshot): number {
  const window = Math.max(1, s.windowMs);
  const retries = s.current.retries * s.windowMs + s.previous.retries * s.previousWeightMs;
  return Math.floor(Math.max(0, s.allowance * window - retries) / window);
}
