// @fleet-budget/client: fleet-wide retry budgets in Redis for Node.js workers, on the scripts of
// lua/ (the contract: lua/README.md), sharing each dependency's budget with the Rust library and
// the Python client. The BullMQ integration is `@fleet-budget/client/bullmq`.

export { FleetBudget, InvalidTask, UnmappedTask, PROBE_INTERVAL_MS, errorKind } from "./budget.js";
export type { FleetBudgetOptions, Withdrawal } from "./budget.js";
export { Config, ConfigError } from "./config.js";
export type { Problem, RedisSettings, UnmappedTasks } from "./config.js";
export * from "./decision.js";
export { Metrics, STORE_CALL_BUCKETS } from "./metrics.js";
export { DEFAULT_POLICY, Backoff, TaskCeiling, CLASS_MAX_ATTEMPTS } from "./policy.js";
export type { BudgetPolicy } from "./policy.js";
export { BadReply, Script, budgetKey, ratioText, parseReply, sha1, scriptText } from "./scripts.js";
export type { BudgetSnapshot, Control, WindowCounters } from "./snapshot.js";
export { remaining } from "./snapshot.js";
export { dependencyNameProblem, keyPrefixProblem } from "./names.js";
export { ConfirmedPublisher, NotConfirmed } from "./amqp.js";
export * as headers from "./headers.js";
