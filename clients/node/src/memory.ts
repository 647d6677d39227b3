// What this process remembers of each budget hash it called (lua/README.md, "Lost budgets"; the
// Rust `store/redis/memory.rs`, the Python client's memory.py): the hash's birth, the overrides in
// force and the counters as its last reply showed them, sent with every budget call so that a
// hash lost mid-window is restored. Bounded by MAX_REMEMBERED keys whatever happens.

import type { HashState } from "./scripts.js";
import type { BudgetSnapshot, WindowCounters } from "./snapshot.js";

export const MAX_REMEMBERED = 100_000;

function fields(c: WindowCounters): number[] {
  return [c.successes, c.firstAttempts, c.retries, c.denied];
}

export class Memory {
  private readonly seen = new Map<string, [HashState, BudgetSnapshot]>();

  /** The birth last seen (`""`: none) and `fu,su,sr,sm,w,i,cs,ca,cr,cd,ps,pa,pr,pd`. */
  args(key: string): [string, string] {
    const seen = this.seen.get(key);
    if (seen === undefined) return ["", ""];
    const [state, snap] = seen;
    const values = [state.freezeUntil, state.setUntil, state.setRatio, state.setMin, snap.windowMs, snap.windowIndex,
      ...fields(snap.current), ...fields(snap.previous)];
    return [String(state.birth), values.join(",")];
  }

  learn(key: string, state: HashState, snapshot: BudgetSnapshot): void {
    if (this.seen.size < MAX_REMEMBERED || this.seen.has(key)) this.seen.set(key, [{ ...state, lost: false }, snapshot]);
  }
}
