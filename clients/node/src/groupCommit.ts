// Group commit of withdrawals, as the Rust `store/redis/group_commit.rs` and the Python client's
// group_commit.py do it, on Node's one thread: while a decision for a dependency is in flight from
// this process, the decisions that arrive for the same dependency wait for it, and then go
// together as one `spend_many.lua` call (at most `maxBatch`), whose answer to each is what that
// many `spend.lua` calls in a row at that instant would give (`batchAnswer`). A lone decision
// never waits and is one `spend.lua` call.
//
// Every caller waits at most `deadlineMs` from its arrival: one still queued then gives up and is
// never sent; one whose batch is in flight gets GroupTimeout (the budget answers it from the
// fallback, as for a call that timed out), and its request, sent once, is counted at most once.

import { BadReply } from "./scripts.js";
import type { BudgetSnapshot } from "./snapshot.js";

export const DEFAULT_MAX_BATCH = 64;

export type Answer = [granted: boolean, snapshot: BudgetSnapshot, nextMs: number | null];

/** The caller's deadline passed before its batch was answered. */
export class GroupTimeout extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GroupTimeout";
  }
}

/** The answer to request `k` (0-based) of a `spend_many.lua` call of `n` that granted
 * `granted`: the first `granted` are granted; each sees the counters as the `spend.lua` call in
 * its place would have left them (lua/README.md, "Deciding several requests"). */
export function batchAnswer(snapshot: BudgetSnapshot, n: number, granted: number, k: number): [boolean, BudgetSnapshot] {
  const denied = n - granted;
  const retriesBefore = snapshot.current.retries - granted;
  const deniedBefore = snapshot.current.denied - denied;
  if (denied < 0 || retriesBefore < 0 || deniedBefore < 0) {
    throw new BadReply("spend_many", `${granted} granted of ${n} with retries ${snapshot.current.retries}, denied ${snapshot.current.denied}`);
  }
  const seen = k + 1;
  const current = {
    ...snapshot.current,
    retries: retriesBefore + Math.min(seen, granted),
    denied: deniedBefore + Math.min(Math.max(0, seen - granted), denied),
  };
  return [k < granted, { ...snapshot, current }];
}

/** Request `k`'s wait in a batch: a grant before the last left room (0). */
export function batchNext(nextMs: number | null, granted: number, k: number): number | null {
  return k + 1 < granted ? 0 : nextMs;
}

interface Ticket {
  state: "waiting" | "sent" | "done";
  timer: NodeJS.Timeout | null;
  resolve: (a: Answer) => void;
  reject: (e: unknown) => void;
}

interface Group {
  busy: boolean;
  queue: Ticket[];
}

export class GroupCommit {
  private readonly groups = new Map<string, Group>();
  readonly maxBatch: number;

  constructor(readonly deadlineMs: number, maxBatch = DEFAULT_MAX_BATCH) {
    this.maxBatch = Math.max(1, maxBatch);
  }

  withdraw(dependency: string, send: (n: number) => Promise<Answer[]>): Promise<Answer> {
    return new Promise<Answer>((resolve, reject) => {
      const ticket: Ticket = { state: "waiting", timer: null, resolve, reject };
      let group = this.groups.get(dependency);
      if (group === undefined) {
        group = { busy: false, queue: [] };
        this.groups.set(dependency, group);
      }
      ticket.timer = setTimeout(() => this.expire(dependency, group!, ticket), this.deadlineMs);
      if (group.busy) {
        group.queue.push(ticket);
      } else {
        group.busy = true;
        void this.run(dependency, group, [ticket], send);
      }
    });
  }

  private expire(dependency: string, group: Group, ticket: Ticket): void {
    if (ticket.state === "waiting") {
      group.queue.splice(group.queue.indexOf(ticket), 1);
      ticket.state = "done";
      ticket.reject(new GroupTimeout(`${dependency}: no turn within the deadline; not sent`));
    } else if (ticket.state === "sent") {
      ticket.state = "done";
      ticket.reject(new GroupTimeout(`${dependency}: the batch was not answered within the deadline`));
    }
  }

  private async run(dependency: string, group: Group, batch: Ticket[], send: (n: number) => Promise<Answer[]>): Promise<void> {
    for (const t of batch) t.state = "sent";
    let answers: Answer[] = [];
    let error: unknown = null;
    try {
      answers = await send(batch.length);
      if (answers.length !== batch.length) throw new BadReply("spend_many", `${answers.length} answers for ${batch.length} requests`);
    } catch (e) {
      error = e;
    }
    batch.forEach((t, i) => {
      if (t.timer !== null) clearTimeout(t.timer);
      if (t.state !== "sent") return; // gave up meanwhile
      t.state = "done";
      if (error !== null) t.reject(error);
      else t.resolve(answers[i]!);
    });
    const next = group.queue.splice(0, this.maxBatch);
    if (next.length === 0) {
      group.busy = false;
      this.groups.delete(dependency);
      return;
    }
    void this.run(dependency, group, next, send);
  }
}
