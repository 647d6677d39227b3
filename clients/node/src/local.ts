// The budget arithmetic in the process: the fallback when Redis does not answer. The same
// operations, in the same order, as lua/src/shared and the Rust `allowance.rs`.

import { BudgetPolicy, basisCode } from "./policy.js";
import { BudgetSnapshot, NO_CONTROL, counters } from "./snapshot.js";

class State {
  index: number;
  cur = [0, 0, 0, 0];
  prev = [0, 0, 0, 0];

  constructor(now: number, public window: number) {
    this.index = Math.floor(now / window);
  }

  roll(now: number, window: number): void {
    const idx = Math.floor(now / window);
    if (window !== this.window) {
      this.window = window;
      this.index = idx;
      this.cur = [0, 0, 0, 0];
      this.prev = [0, 0, 0, 0];
    } else if (idx === this.index + 1) {
      this.prev = this.cur;
      this.cur = [0, 0, 0, 0];
      this.index = idx;
    } else if (idx > this.index) {
      this.index = idx;
      this.cur = [0, 0, 0, 0];
      this.prev = [0, 0, 0, 0];
    }
  }

  snapshot(now: number, policy: BudgetPolicy): BudgetSnapshot {
    const w = this.window;
    const elapsed = Math.min(Math.max(now - this.index * w, 0), w - 1);
    const pw = policy.mode === "sliding" ? w - elapsed : 0;
    const d = basisCode(policy) === "a" ? 1 : 0;
    const depositsSc = this.cur[d]! * w + this.prev[d]! * pw;
    const allowance = Math.max(policy.minAllowance, Math.floor((policy.ratio * depositsSc) / w));
    return {
      windowMs: w, windowIndex: this.index, elapsedMs: elapsed, previousWeightMs: pw,
      current: counters(this.cur), previous: counters(this.prev), allowance, control: NO_CONTROL,
    };
  }
}

/** Budgets kept in this process, by dependency; idle ones are dropped after two windows. */
export class LocalStore {
  private states = new Map<string, State>();
  private nextSweep = 0;

  constructor(private readonly clock: () => number = Date.now) {}

  private state(dependency: string, window: number, now: number): State {
    if (now >= this.nextSweep) {
      this.nextSweep = now + 1000;
      for (const [k, s] of this.states) if (Math.floor(now / s.window) > s.index + 1) this.states.delete(k);
    }
    let state = this.states.get(dependency);
    if (state === undefined) {
      state = new State(now, window);
      this.states.set(dependency, state);
    }
    state.roll(now, window);
    return state;
  }

  deposit(dependency: string, policy: BudgetPolicy, successes: number, firstAttempts: number): BudgetSnapshot {
    const now = this.clock();
    const state = this.state(dependency, policy.windowMs, now);
    state.cur[0]! += successes;
    state.cur[1]! += firstAttempts;
    return state.snapshot(now, policy);
  }

  withdraw(dependency: string, policy: BudgetPolicy): [boolean, BudgetSnapshot] {
    const now = this.clock();
    const state = this.state(dependency, policy.windowMs, now);
    const snap = state.snapshot(now, policy);
    const w = state.window;
    const granted = state.cur[2]! * w + state.prev[2]! * snap.previousWeightMs + w <= snap.allowance * w;
    state.cur[granted ? 2 : 3]! += 1;
    return [granted, state.snapshot(now, policy)];
  }

  status(dependency: string, policy: BudgetPolicy): BudgetSnapshot {
    const now = this.clock();
    return this.state(dependency, policy.windowMs, now).snapshot(now, policy);
  }
}
