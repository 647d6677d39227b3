// Exhausted budgets answered in the process, as the Rust `budget/deny_cache.rs` and the Python
// client's deny_cache.py do it. A denial from Redis stands until the first of: its
// `next_grant_ms` counted from when the call was sent; `redis.deny_cache_ms` after the call was
// sent; this process's deposits for the dependency reaching Redis; a reply showing headroom or
// another override state. Only denials are answered here (source `fleet_cache`), so nothing is
// granted that the fleet budget would refuse. A reply to a call sent before the entry was
// forgotten is not kept: each dependency has an epoch, bumped when its entry is forgotten. One
// entry per dependency asked: bounded by the configuration (and `max_own_budgets`).

import type { BudgetSnapshot, Control } from "./snapshot.js";

export const FLEET_CACHE = "fleet_cache";

interface Slot {
  epoch: number;
  until: number | null;
  snapshot: BudgetSnapshot | null;
}

function sameControl(a: Control, b: Control): boolean {
  return a.conflict === b.conflict && a.frozen === b.frozen && a.overridden === b.overridden && a.lost === b.lost;
}

export class DenyCache {
  private readonly slots = new Map<string, Slot>();

  constructor(private readonly stalenessMs: number, private readonly clock: () => number = () => performance.now()) {}

  get on(): boolean {
    return this.stalenessMs > 0;
  }

  now(): number {
    return this.clock();
  }

  /** The snapshot of a denial that still stands (null when none), and the epoch under which to
   * remember the store's answer. */
  lookup(dependency: string): [BudgetSnapshot | null, number] {
    if (!this.on) return [null, 0];
    const slot = this.slots.get(dependency);
    if (slot === undefined) return [null, 0];
    if (slot.until !== null && this.clock() < slot.until) return [slot.snapshot, slot.epoch];
    return [null, slot.epoch];
  }

  /** What the store answered to a call sent at `sent` under `epoch`. */
  remember(dependency: string, epoch: number, sent: number, granted: boolean, snapshot: BudgetSnapshot, nextMs: number | null): void {
    if (!this.on) return;
    if (nextMs === 0) {
      this.drop(dependency, (s) => s.snapshot !== null);
      return;
    }
    if (granted) return;
    let until = sent + this.stalenessMs;
    if (nextMs !== null) until = Math.min(until, sent + nextMs);
    if (until <= this.clock()) return;
    let slot = this.slots.get(dependency);
    if (slot === undefined) {
      slot = { epoch: 0, until: null, snapshot: null };
      this.slots.set(dependency, slot);
    }
    if (slot.epoch === epoch) {
      slot.until = until;
      slot.snapshot = snapshot;
    }
  }

  /** This process's deposits reached the store: any denial kept is forgotten. */
  forget(dependency: string): void {
    if (this.on) this.drop(dependency, () => true);
  }

  /** A fresh reply's override state: another than the kept denial's forgets it. */
  seen(dependency: string, control: Control): void {
    if (this.on) this.drop(dependency, (s) => s.snapshot !== null && !sameControl(s.snapshot.control, control));
  }

  private drop(dependency: string, when: (s: Slot) => boolean): void {
    const slot = this.slots.get(dependency);
    if (slot !== undefined && when(slot)) {
      slot.epoch += 1;
      slot.until = null;
      slot.snapshot = null;
    }
  }
}
