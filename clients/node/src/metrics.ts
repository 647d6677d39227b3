// The Prometheus metrics, with the Rust library's names and labels (crates/fleet-budget/src/
// metrics, the Python client's metrics.py), in a prom-client registry of their own unless one is
// given. Counters are per process: `sum by (dependency)` them in PromQL.

import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { BudgetSnapshot, remaining } from "./snapshot.js";

/** At most this many dependencies get their first policy conflict logged. */
export const CONFLICT_LOG_LIMIT = 1024;

/** Upper bounds of the store-call duration buckets, in seconds (the Rust `STORE_CALL_BUCKETS`). */
export const STORE_CALL_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.25];

export type Logger = Pick<Console, "warn" | "info" | "error">;

export class Metrics {
  readonly registry: Registry;
  readonly successes: Counter<"dependency">;
  readonly firstAttempts: Counter<"dependency">;
  readonly executions: Counter<"dependency">;
  readonly retriesGranted: Counter<"dependency">;
  readonly retriesDenied: Counter<"dependency">;
  readonly retriesDeniedInProcess: Counter<"dependency">;
  readonly deadLetters: Counter<"dependency" | "reason">;
  readonly allowance: Gauge<"dependency">;
  readonly headroom: Gauge<"dependency">;
  readonly fallbackActive: Gauge<"dependency">;
  readonly storeCallDuration: Histogram<"op">;
  readonly fallbackDependencies: Gauge;
  readonly storeErrors: Counter<"kind">;
  readonly fallbackDecisions: Counter<"mode">;
  readonly depositsPending: Gauge;
  readonly policyConflicts: Counter<"dependency">;
  readonly budgetLost: Counter<"dependency">;
  readonly callsInFlight: Gauge<"dependency" | "kind">;
  readonly retryFraction: Gauge<"dependency">;
  readonly leasesLost: Counter<"dependency">;
  readonly breakerTransitions: Counter<"dependency" | "to">;
  readonly breakerState: Gauge<"dependency">;
  private readonly conflictsLogged = new Set<string>();
  private readonly lostLogged = new Map<string, number>();

  constructor(registry?: Registry, private readonly log: Logger = console) {
    this.registry = registry ?? new Registry();
    const registers = [this.registry];
    const dep = ["dependency"] as const;
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
      new Counter<L>({ name, help, labelNames, registers });
    const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
      new Gauge<L>({ name, help, labelNames, registers });
    this.successes = counter("fleet_budget_successes_total", "Successful jobs.", dep);
    this.firstAttempts = counter("fleet_budget_first_attempts_total", "First executions of jobs.", dep);
    this.executions = counter("fleet_budget_executions_total", "All executions (first + retries).", dep);
    this.retriesGranted = counter("fleet_budget_retries_granted_total", "Retries the budget granted.", dep);
    this.retriesDenied = counter("fleet_budget_retries_denied_total", "Retries the budget refused.", dep);
    this.retriesDeniedInProcess = counter("fleet_budget_retries_denied_in_process_total",
      "Denials of the fleet store answered in the process while they stand, without a call (also in retries_denied_total).", dep);
    this.deadLetters = counter("fleet_budget_dead_letters_total", "Dead-letter decisions.", ["dependency", "reason"] as const);
    this.allowance = gauge("fleet_budget_allowance", "Allowance at the last decision.", dep);
    this.headroom = gauge("fleet_budget_headroom", "Retries still grantable at the last decision.", dep);
    this.fallbackActive = gauge("fleet_budget_fallback_active", "1 while the fleet store fails for the dependency and the fallback decides.", dep);
    this.storeCallDuration = new Histogram<"op">({
      name: "fleet_budget_store_call_duration_seconds", help: "Budget store calls by operation, failed ones included.",
      labelNames: ["op"], buckets: STORE_CALL_BUCKETS, registers,
    });
    this.fallbackDependencies = gauge("fleet_budget_fallback_dependencies", "Dependencies whose store calls fail now.", []);
    this.storeErrors = counter("fleet_budget_store_errors_total", "Store calls that failed.", ["kind"] as const);
    this.fallbackDecisions = counter("fleet_budget_fallback_decisions_total", "Retry decisions taken by the fallback.", ["mode"] as const);
    this.depositsPending = gauge("fleet_budget_deposits_pending", "Deposits counted locally, not yet flushed.", []);
    this.policyConflicts = counter("fleet_budget_policy_conflicts_total",
      "Store calls whose policy differed from the one in force (served by that one).", dep);
    this.budgetLost = counter("fleet_budget_budget_lost_total",
      "Store calls that found the dependency's budget hash lost (evicted, flushed, Redis restarted empty) and restored what this process remembered.", dep);
    // The concurrency budget and the circuit breaker (the Rust `metrics/calls.rs`).
    this.callsInFlight = gauge("fleet_budget_calls_in_flight",
      "Calls in flight fleet-wide (leases of the concurrency budget) at this process's last lease call.", ["dependency", "kind"] as const);
    this.retryFraction = gauge("fleet_budget_retry_fraction",
      "Retries in flight over primary calls in flight, fleet-wide, at this process's last lease call.", dep);
    this.leasesLost = counter("fleet_budget_leases_lost_total",
      "Leases given back that were gone from Redis before their expiry (evicted, flushed): their slots were free meanwhile.", dep);
    this.breakerTransitions = counter("fleet_budget_breaker_transitions_total",
      "Circuit breaker state changes this process made, by the state entered.", ["dependency", "to"] as const);
    this.breakerState = gauge("fleet_budget_breaker_state",
      "Circuit breaker state at this process's last breaker call: 0 closed, 1 open, 2 half-open.", dep);
  }

  snapshot(dependency: string, snap: BudgetSnapshot): void {
    if (snap.control.conflict) {
      this.policyConflicts.inc({ dependency });
      if (this.conflictsLogged.size < CONFLICT_LOG_LIMIT && !this.conflictsLogged.has(dependency)) {
        this.conflictsLogged.add(dependency);
        this.log.warn(`fleet-budget: this worker's budget policy for ${JSON.stringify(dependency)} differs from the one in force in Redis, `
          + "which decides instead (see `budgetctl status`); counted in fleet_budget_policy_conflicts_total");
      }
    }
    this.allowance.set({ dependency }, snap.allowance);
    this.headroom.set({ dependency }, remaining(snap));
  }

  budgetLostSeen(dependency: string, snap: BudgetSnapshot): void {
    this.budgetLost.inc({ dependency });
    const logged = this.lostLogged.get(dependency);
    if (logged !== snap.windowIndex && (logged !== undefined || this.lostLogged.size < CONFLICT_LOG_LIMIT)) {
      this.lostLogged.set(dependency, snap.windowIndex);
      this.log.warn(`fleet-budget: the budget hash of ${JSON.stringify(dependency)} was lost in Redis (evicted, FLUSHALL, or a restart `
        + `without persistence); restored what this worker remembered before deciding (frozen ${snap.control.frozen}, `
        + `retries ${snap.current.retries}); counted in fleet_budget_budget_lost_total`);
    }
  }

  /** A sample's value (0 when never set), e.g. `value("fleet_budget_successes_total", {dependency: "x"})`. */
  async value(name: string, labels: Record<string, string> = {}): Promise<number> {
    const metric = this.registry.getSingleMetric(name);
    if (metric === undefined) return 0;
    const data = await metric.get();
    const sample = data.values.find((v) => Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want)
      && Object.keys(v.labels).length === Object.keys(labels).length);
    return sample?.value ?? 0;
  }
}
