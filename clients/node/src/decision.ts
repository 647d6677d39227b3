// Failures and decisions (the Rust `decision.rs`, the Python client's decision.py).

import type { BudgetSnapshot } from "./snapshot.js";

/** Why a job was dead-lettered, as the `fb-reason` header and the metrics spell it. */
export const NON_RETRYABLE = "non_retryable";
export const ATTEMPTS_EXHAUSTED = "attempts_exhausted";
export const BUDGET_EXHAUSTED = "budget_exhausted";
/** An operator froze the dependency's retries (`budgetctl budget freeze`). */
export const BUDGET_FROZEN = "budget_frozen";
/** The job would wait longer than its task's `max_delay` (a `Retry-After` past it). */
export const DELAY_EXCEEDED = "delay_exceeded";

export type FailureKind = "retryable" | "non_retryable" | "retry_after" | "poison";

/** How a job failed. `cls` is the error class of the dead letter (`fb-error-class`). */
export class Failure {
  constructor(readonly kind: FailureKind, readonly message: string, readonly cls = "error", readonly retryAfterMs: number | null = null) {}

  static retryable(error: unknown): Failure {
    return new Failure("retryable", errorMessage(error));
  }

  static nonRetryable(error: unknown): Failure {
    return new Failure("non_retryable", errorMessage(error));
  }

  /** Retryable, not before `ms` (a `Retry-After`). */
  static after(ms: number, error: unknown): Failure {
    return new Failure("retry_after", errorMessage(error), "error", Math.max(0, Number.isFinite(ms) ? ms : 0));
  }

  static poison(error: unknown): Failure {
    return new Failure("poison", errorMessage(error), "poison");
  }

  withClass(name: string): Failure {
    return new Failure(this.kind, this.message, name, this.retryAfterMs);
  }

  get isRetryable(): boolean {
    return this.kind === "retryable" || this.kind === "retry_after";
  }
}

export function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** Where a budget answer came from: Redis, a denial of Redis that still stands, the local
 * fallback, or the blind fallback (`redis.fallback = "allow" | "deny"`). */
export type Source = "fleet" | "fleet_cache" | "local_fallback" | "blind" | "not_consulted";

export interface Retry {
  readonly kind: "retry";
  readonly dependency: string;
  readonly delayMs: number;
  readonly nextAttempt: number;
  readonly snapshot: BudgetSnapshot;
  readonly source: Source;
}

export interface DeadLetter {
  readonly kind: "dead_letter";
  readonly dependency: string;
  readonly reason: string;
  readonly snapshot: BudgetSnapshot | null;
  readonly source: Source;
}

export type Decision = Retry | DeadLetter;
