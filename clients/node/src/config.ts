// The configuration: the same TOML file as the Rust library and the Python client
// (crates/fleet-budget/src/config, clients/python/src/fleet_budget/config), checked alike, every
// problem of a section reported at once. Sections this client does not act on ([metrics],
// [audit]) are checked for their shape only, so that one file is accepted by every language's
// worker; a dependency's `concurrency` and `breaker` are read with the Rust library's ranges.

import { readFileSync } from "node:fs";
import { parse } from "smol-toml";
import { codePoint, dependencyNameProblem, isUnsafeChar, keyPrefixProblem, quoted, redactUrl, utf8Length } from "./names.js";
import type { BreakerPolicy, ConcurrencyPolicy } from "./admission.js";
import { Backoff, BudgetPolicy, CLASS_MAX_ATTEMPTS, DEFAULT_MAX_DELAY_MS, DEFAULT_POLICY, TaskCeiling } from "./policy.js";

export const ENV_REDIS_URL = "FLEET_BUDGET_REDIS_URL";
export const ENV_AMQP_URL = "FLEET_BUDGET_AMQP_URL";
export const ENV_AMQP_URLS = "FLEET_BUDGET_AMQP_URLS";
export const MAX_WINDOW_SECS = 86_400;
export const MAX_RATIO = 10;
export const MAX_DELAY_SECS = 7 * 86_400;
/** Most unmapped names that may get a budget of their own (the Rust `MAX_OWN_BUDGETS`). */
export const MAX_OWN_BUDGETS = 100_000;
export const DEFAULT_MAX_OWN_BUDGETS = 100;
/** The budget shared by unmapped names past `max_own_budgets`. */
export const OVERFLOW_DEPENDENCY = "unmapped";

export interface Problem {
  readonly key: string;
  readonly value: string;
  readonly allowed: string;
}

/** A configuration refused: `where` is the file (or key), `problems` every problem found. */
export class ConfigError extends Error {
  constructor(readonly where: string, detail: string, readonly problems: readonly Problem[] = []) {
    super(`${where}: ${detail}`);
    this.name = "ConfigError";
  }
}

export interface RedisSettings {
  url: string;
  timeoutMs: number;
  keyPrefix: string;
  fallback: "local" | "deny" | "allow";
  depositFlushMs: number;
  depositFlushCount: number;
  denyCacheMs: number;
  heartbeatMs: number;
}

export interface UnmappedTasks {
  readonly policy: "own_budget" | "share" | "reject";
  readonly maxOwnBudgets: number;
  readonly dependency: string | null;
}

export class Config {
  redis: RedisSettings = {
    url: "redis://127.0.0.1:6379", timeoutMs: 50, keyPrefix: "fb", fallback: "local",
    depositFlushMs: 100, depositFlushCount: 1000, denyCacheMs: 100, heartbeatMs: 5000,
  };
  defaults: BudgetPolicy = DEFAULT_POLICY;
  policies = new Map<string, BudgetPolicy>();
  /** task -> dependency */
  tasks = new Map<string, string>();
  /** `[dependencies.X.concurrency]`, by dependency. */
  concurrency = new Map<string, ConcurrencyPolicy>();
  /** `[dependencies.X.breaker]`, by dependency. */
  breakers = new Map<string, BreakerPolicy>();
  defaultCeiling = new TaskCeiling();
  ceilings = new Map<string, TaskCeiling>();
  unmapped: UnmappedTasks = { policy: "own_budget", maxOwnBudgets: DEFAULT_MAX_OWN_BUDGETS, dependency: null };
  defaultMaxDelayMs = DEFAULT_MAX_DELAY_MS;
  /** `[amqp] prefix`: `<prefix>.dead` is the dead-letter exchange. */
  amqpPrefix = "fleet";
  /** `[amqp] url` or `urls` (`FLEET_BUDGET_AMQP_URL`/`_URLS` over them); empty: no broker. */
  amqpUrls: string[] = [];

  get deadLetterExchange(): string {
    return `${this.amqpPrefix}.dead`;
  }

  static fromPath(path: string, env: NodeJS.ProcessEnv = process.env): Config {
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      throw new ConfigError(path, `cannot read configuration file: ${(e as NodeJS.ErrnoException).code ?? e}`);
    }
    const config = Config.fromToml(text, path);
    config.applyEnv(env);
    return config;
  }

  static fromToml(text: string, origin = "<toml>"): Config {
    if (text.startsWith("\ufeff")) text = text.slice(1);
    let root: Record<string, unknown>;
    try {
      root = parse(text, { integersAsBigInt: true }) as Record<string, unknown>;
    } catch (e) {
      throw new ConfigError(origin, (e as Error).message);
    }
    try {
      return resolve(root, origin);
    } catch (e) {
      if (e instanceof Refused) throw new ConfigError(origin, e.message);
      throw e;
    }
  }

  /** `FLEET_BUDGET_REDIS_URL` replaces `redis.url`; `FLEET_BUDGET_AMQP_URL(S)` the broker's nodes. */
  applyEnv(env: NodeJS.ProcessEnv): void {
    const c = new Checker();
    const url = env[ENV_REDIS_URL] ?? "";
    if (url && redisUrlOk(c, ENV_REDIS_URL, url)) this.redis.url = url;
    const one = env[ENV_AMQP_URL] ?? "";
    const many = env[ENV_AMQP_URLS] ?? "";
    if (one && many) {
      c.problem(ENV_AMQP_URLS, `${ENV_AMQP_URL} and ${ENV_AMQP_URLS}`, `set one of ${ENV_AMQP_URL} or ${ENV_AMQP_URLS}, not both`);
    } else if (one) {
      if (amqpUrlOk(c, ENV_AMQP_URL, one)) this.amqpUrls = [one];
    } else if (many) {
      const urls = many.split(",").map((u) => u.trim());
      if (urls.every((u, i) => amqpUrlOk(c, `${ENV_AMQP_URLS}[${i}]`, u))) this.amqpUrls = urls;
    }
    if (c.problems.length > 0) {
      const first = c.problems[0]!;
      throw new ConfigError(first.key, `${first.value}: ${first.allowed}`, c.problems);
    }
  }

  policy(dependency: string): BudgetPolicy {
    return this.policies.get(dependency) ?? this.defaults;
  }

  /** The ceiling of `task`, its `max_delay` filled in: as configured, else the longer of the
   * default and twice the task's backoff cap (the Rust `Ceilings::for_task`). */
  ceiling(task: string): TaskCeiling {
    const ceiling = this.ceilings.get(task) ?? this.defaultCeiling;
    if (ceiling.maxDelayMs !== null) return ceiling;
    return ceiling.withMaxDelay(Math.max(this.defaultMaxDelayMs, 2 * ceiling.backoff.capMs));
  }
}

/** An unknown key or a value of the wrong type: the whole text is refused (as serde does). */
class Refused extends Error {}

type Table = Record<string, unknown>;

function show(value: unknown): string {
  if (typeof value === "string") return quoted(value.length > 60 ? `${value.slice(0, 60)}...` : value);
  if (typeof value === "bigint") return value.toString();
  if (Array.isArray(value)) return "an array";
  if (value !== null && typeof value === "object") return "a table";
  return String(value);
}

function wrongType(key: string, value: unknown, expected: string): Refused {
  return new Refused(`invalid type for \`${key}\`: ${show(value)}, expected ${expected}`);
}

function tomlKey(name: string): string {
  return /^[A-Za-z0-9_-]+$/.test(name) ? name : quoted(name);
}

class Checker {
  problems: Problem[] = [];

  problem(key: string, value: string, allowed: string): void {
    this.problems.push({ key, value, allowed });
  }

  intIn(key: string, value: unknown, lo: number, hi: number, fallback: number): number {
    if (value === undefined) return fallback;
    if (typeof value !== "bigint") throw wrongType(key, value, "an integer");
    if (value < BigInt(lo) || value > BigInt(hi)) {
      this.problem(key, value.toString(), `must be an integer from ${lo} to ${hi}`);
      return fallback;
    }
    return Number(value);
  }

  ratio(key: string, value: unknown, fallback: number): number {
    if (value === undefined) return fallback;
    if (typeof value !== "bigint" && typeof value !== "number") throw wrongType(key, value, "a number");
    const v = Number(value);
    if (!Number.isFinite(v) || v < 0 || v > MAX_RATIO) {
      this.problem(key, String(v), `must be a finite number from 0 to ${MAX_RATIO} (retries per deposit)`);
      return fallback;
    }
    return v;
  }

  choice<T extends string>(key: string, value: unknown, allowed: readonly T[], fallback: T): T {
    if (value === undefined) return fallback;
    if (typeof value !== "string") throw wrongType(key, value, "a string");
    if (!(allowed as readonly string[]).includes(value)) {
      throw new Refused(`unknown variant ${show(value)} for \`${key}\`, expected one of ${allowed.map((a) => `\`${a}\``).join(", ")}`);
    }
    return value as T;
  }
}

function table(key: string, value: unknown): Table {
  if (value === undefined) return {};
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw wrongType(key, value, "a table");
  return value as Table;
}

function unknownKeys(at: string, t: Table, known: readonly string[]): void {
  for (const k of Object.keys(t)) {
    if (!known.includes(k)) {
      const where = at ? ` in \`${at}\`` : "";
      throw new Refused(`unknown field \`${k}\`${where}, expected one of ${known.map((n) => `\`${n}\``).join(", ")}`);
    }
  }
}

const POLICY_KEYS = ["window_secs", "ratio", "min_allowance", "deposit", "mode"] as const;

function readPolicy(c: Checker, at: string, t: Table, base: BudgetPolicy): BudgetPolicy {
  return {
    windowMs: 1000 * c.intIn(`${at}.window_secs`, t.window_secs, 1, MAX_WINDOW_SECS, Math.max(1, Math.floor(base.windowMs / 1000))),
    ratio: c.ratio(`${at}.ratio`, t.ratio, base.ratio),
    minAllowance: c.intIn(`${at}.min_allowance`, t.min_allowance, 0, 1_000_000_000, base.minAllowance),
    deposit: c.choice(`${at}.deposit`, t.deposit, ["success", "request"] as const, base.deposit),
    mode: c.choice(`${at}.mode`, t.mode, ["sliding", "fixed"] as const, base.mode),
  };
}

function readBackoff(c: Checker, at: string, t: Table, base: Backoff): Backoff {
  const day = 86_400_000;
  const baseMs = c.intIn(`${at}.backoff_base_ms`, t.backoff_base_ms, 1, day, Math.round(base.baseMs));
  const capMs = c.intIn(`${at}.backoff_cap_ms`, t.backoff_cap_ms, 1, day, Math.round(base.capMs));
  if (capMs < baseMs) c.problem(`${at}.backoff_cap_ms`, String(capMs), `must be at least backoff_base_ms (${baseMs})`);
  return new Backoff(baseMs, base.factor, capMs);
}

function readMaxDelay(c: Checker, at: string, t: Table): number | null {
  const secs = c.intIn(`${at}.max_delay_secs`, t.max_delay_secs, 1, MAX_DELAY_SECS, 0);
  return secs > 0 ? secs * 1000 : null;
}

const REDIS_SCHEMES = ["redis", "rediss"];

function redisUrlOk(c: Checker, key: string, url: string): boolean {
  const match = /^([a-z+]+):\/\/(.+)$/.exec(url);
  if (!match || !REDIS_SCHEMES.includes(match[1]!)) {
    c.problem(key, redactUrl(url), "must be a URL of the form redis://... or rediss://...");
    return false;
  }
  if (url.includes("#")) {
    c.problem(key, redactUrl(url), "must not have a #fragment (certificate and host name checks cannot be turned off)");
    return false;
  }
  try {
    const parsed = new URL(url);
    if (!parsed.hostname) throw new Error("Missing hostname");
    if (parsed.hostname === "0.0.0.0" || parsed.hostname === "[::]") throw new Error("Cannot connect to a wildcard address");
    const db = parsed.pathname.replace(/^\/+|\/+$/g, "");
    if (db && !/^[+-]?[0-9]+$/.test(db)) throw new Error("Invalid database number");
  } catch (e) {
    c.problem(key, redactUrl(url), `the Redis client cannot use this URL (${(e as Error).message})`);
    return false;
  }
  return true;
}

function amqpUrlOk(c: Checker, key: string, url: unknown): boolean {
  if (typeof url !== "string") throw wrongType(key, "...", "a string");
  if (!/^amqps?:\/\/.+/.test(url)) {
    c.problem(key, redactUrl(url), "must be a URL of the form amqp://... or amqps://...");
    return false;
  }
  return true;
}

function readRedis(c: Checker, value: unknown, config: Config): void {
  const r = table("redis", value);
  unknownKeys("redis", r, ["url", "cluster_urls", "timeout_ms", "key_prefix", "fallback", "deposit_flush_ms",
    "deposit_flush_count", "deny_cache_ms", "batch_across_dependencies", "heartbeat_ms", "tls_ca_file", "tls_cert_file", "tls_key_file"]);
  const s = config.redis;
  if (r.url !== undefined) {
    if (typeof r.url !== "string") throw wrongType("redis.url", "...", "a string");
    if (redisUrlOk(c, "redis.url", r.url)) s.url = r.url;
  }
  if (r.cluster_urls !== undefined) {
    // Redis Cluster is the Rust library's and the Python client's; this client talks to one server.
    c.problem("redis.cluster_urls", "(set)", "Redis Cluster is not supported by the Node.js client; use redis.url");
  }
  for (const key of ["tls_ca_file", "tls_cert_file", "tls_key_file"]) {
    if (r[key] !== undefined) c.problem(`redis.${key}`, "(set)", "TLS certificate files are not supported by the Node.js client yet");
  }
  s.timeoutMs = c.intIn("redis.timeout_ms", r.timeout_ms, 1, 60_000, 50);
  if (r.key_prefix !== undefined) {
    if (typeof r.key_prefix !== "string") throw wrongType("redis.key_prefix", r.key_prefix, "a string");
    const wrong = keyPrefixProblem(r.key_prefix);
    if (wrong) c.problem("redis.key_prefix", quoted(r.key_prefix), wrong);
    else s.keyPrefix = r.key_prefix;
  }
  s.fallback = c.choice("redis.fallback", r.fallback, ["local", "deny", "allow"] as const, "local");
  s.depositFlushMs = c.intIn("redis.deposit_flush_ms", r.deposit_flush_ms, 0, 10_000, 100);
  s.depositFlushCount = c.intIn("redis.deposit_flush_count", r.deposit_flush_count, 1, 1_000_000_000, 1000);
  s.denyCacheMs = c.intIn("redis.deny_cache_ms", r.deny_cache_ms, 0, 10_000, 100);
  if (r.heartbeat_ms !== undefined) {
    if (typeof r.heartbeat_ms !== "bigint") throw wrongType("redis.heartbeat_ms", r.heartbeat_ms, "an integer");
    const v = r.heartbeat_ms;
    if (v === 0n || (v >= 100n && v <= 300_000n)) s.heartbeatMs = Number(v);
    else c.problem("redis.heartbeat_ms", v.toString(), "must be 0 (off) or from 100 to 300000");
  }
  if (r.batch_across_dependencies !== undefined && typeof r.batch_across_dependencies !== "boolean") {
    c.problem("redis.batch_across_dependencies", show(r.batch_across_dependencies), "must be true or false");
  }
}

function readDefaults(c: Checker, value: unknown, config: Config): void {
  const d = table("defaults", value);
  unknownKeys("defaults", d, [...POLICY_KEYS, "max_attempts", "backoff_base_ms", "backoff_cap_ms", "max_delay_secs"]);
  config.defaults = readPolicy(c, "defaults", d, DEFAULT_POLICY);
  config.defaultCeiling = new TaskCeiling(
    c.intIn("defaults.max_attempts", d.max_attempts, 1, 1000, 5),
    readBackoff(c, "defaults", d, new Backoff()),
    null,
    readMaxDelay(c, "defaults", d),
  );
}

function readDependencies(c: Checker, value: unknown, config: Config): void {
  for (const [name, raw] of Object.entries(table("dependencies", value))) {
    const at = `dependencies.${tomlKey(name)}`;
    const dep = table(at, raw);
    unknownKeys(at, dep, ["tasks", ...POLICY_KEYS, "concurrency", "breaker"]);
    const wrong = dependencyNameProblem(name);
    if (wrong) c.problem(at, quoted(name), wrong);
    const policy = readPolicy(c, at, dep, config.defaults);
    const concurrency = dep.concurrency === undefined ? null : readConcurrency(c, `${at}.concurrency`, table(`${at}.concurrency`, dep.concurrency));
    // Half-open probes are spent from the rate budget's floor.
    const breaker = dep.breaker === undefined ? null : readBreaker(c, `${at}.breaker`, table(`${at}.breaker`, dep.breaker), policy.minAllowance);
    if (wrong) continue;
    config.policies.set(name, policy);
    if (concurrency !== null) config.concurrency.set(name, concurrency);
    if (breaker !== null) config.breakers.set(name, breaker);
    const tasks = dep.tasks ?? [];
    if (!Array.isArray(tasks) || !tasks.every((t) => typeof t === "string")) throw wrongType(`${at}.tasks`, tasks, "a list of task names");
    (tasks as string[]).forEach((task, i) => {
      const key = `${at}.tasks[${i}]`;
      const unsafe = [...task].find(isUnsafeChar);
      if (task.length === 0) c.problem(key, '""', "a task name must not be empty");
      else if (unsafe !== undefined) {
        c.problem(key, quoted(task), `contains ${codePoint(unsafe)}; a task name holds no control, bidirectional control or invisible characters`);
      } else if (config.tasks.has(task)) {
        const first = config.tasks.get(task);
        c.problem(key, quoted(task), first === name ? "is listed twice in this dependency"
          : `is already mapped to dependency ${quoted(first!)}; a task spends exactly one dependency's budget`);
      } else config.tasks.set(task, name);
    });
  }
}

const MAX_CAP = 1_000_000_000;
const DAY_SECS = 86_400;

function number(key: string, value: unknown): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "bigint" && typeof value !== "number") throw wrongType(key, value, "a number");
  return Number(value);
}

/** `[dependencies.X.concurrency]` as the Rust `RawConcurrency::resolve` reads it (the Python
 * client's config/concurrency.py): every problem named, the share derived from
 * `planned_primary` unless `max_retry_fraction` is given. */
function readConcurrency(c: Checker, at: string, t: Table): ConcurrencyPolicy | null {
  const ints = ["cap", "planned_primary", "min_retry_slots", "lease_secs", "max_wait_secs"];
  unknownKeys(at, t, [...ints, "max_retry_fraction", "primary_waits"]);
  for (const k of ints) if (t[k] !== undefined && typeof t[k] !== "bigint") throw wrongType(`${at}.${k}`, t[k], "an integer");
  const fraction = number(`${at}.max_retry_fraction`, t.max_retry_fraction);
  const waits = t.primary_waits ?? false;
  if (typeof waits !== "boolean") throw wrongType(`${at}.primary_waits`, waits, "a boolean");
  const before = c.problems.length;
  if (t.cap === undefined) {
    c.problem(`${at}.cap`, "missing", "a concurrency section needs cap (calls in flight the dependency accepts)");
    return null;
  }
  const cap = c.intIn(`${at}.cap`, t.cap, 1, MAX_CAP, 1);
  const planned = t.planned_primary === undefined ? undefined : Number(t.planned_primary as bigint);
  if (planned !== undefined && !(planned >= 1 && planned <= cap)) {
    c.problem(`${at}.planned_primary`, String(planned), `must be an integer from 1 to the cap (${cap})`);
  } else if (planned === undefined && fraction === undefined) {
    c.problem(`${at}.planned_primary`, "missing", "needed to derive max_retry_fraction = (cap - planned_primary) / planned_primary; give it or max_retry_fraction");
  }
  const minRetrySlots = c.intIn(`${at}.min_retry_slots`, t.min_retry_slots, 0, MAX_CAP, 3);
  const lease = c.intIn(`${at}.lease_secs`, t.lease_secs, 1, DAY_SECS, 30);
  const maxWait = c.intIn(`${at}.max_wait_secs`, t.max_wait_secs, 0, DAY_SECS, 600);
  if (fraction !== undefined && !(Number.isFinite(fraction) && fraction >= 0 && fraction <= 1000)) {
    c.problem(`${at}.max_retry_fraction`, String(fraction), "must be a number from 0 to 1000");
  }
  if (c.problems.length > before) return null;
  const share = fraction ?? (cap - planned!) / planned!;
  if (share > 1000) {
    // A share derived past what the scripts take (cap 5000, planned_primary 1): named here.
    c.problem(at, "the section", `max_retry_fraction must be a number from 0 to 1000, not ${share}`);
    return null;
  }
  return { cap, maxRetryFraction: share, minRetrySlots, leaseMs: lease * 1000, primaryWaits: waits, maxWaitMs: maxWait * 1000 };
}

/** `[dependencies.X.breaker]` as the Rust `RawBreaker::resolve` reads it: every key optional, at
 * most `floor` (the rate budget's `min_allowance`) half-open probes. */
function readBreaker(c: Checker, at: string, t: Table, floor: number): BreakerPolicy | null {
  const ints = ["min_volume", "window_secs", "open_secs", "half_open_probes", "close_after", "probe_timeout_secs", "max_wait_secs"];
  unknownKeys(at, t, ["failure_ratio", ...ints]);
  for (const k of ints) if (t[k] !== undefined && typeof t[k] !== "bigint") throw wrongType(`${at}.${k}`, t[k], "an integer");
  const ratio = number(`${at}.failure_ratio`, t.failure_ratio) ?? 0.5;
  const before = c.problems.length;
  const window = c.intIn(`${at}.window_secs`, t.window_secs, 1, DAY_SECS, 60);
  const open = c.intIn(`${at}.open_secs`, t.open_secs, 1, DAY_SECS, 30);
  const probeTimeout = c.intIn(`${at}.probe_timeout_secs`, t.probe_timeout_secs, 1, DAY_SECS, 60);
  const maxWait = c.intIn(`${at}.max_wait_secs`, t.max_wait_secs, 0, DAY_SECS, 900);
  if (!(Number.isFinite(ratio) && ratio > 0 && ratio <= 1)) c.problem(`${at}.failure_ratio`, String(ratio), "must be a number above 0 and at most 1");
  const minVolume = c.intIn(`${at}.min_volume`, t.min_volume, 1, MAX_CAP, 20);
  const probes = c.intIn(`${at}.half_open_probes`, t.half_open_probes, 1, 1_000_000, 3);
  if (probes > floor) c.problem(`${at}.half_open_probes`, String(probes), `probes are spent from the rate budget's floor: at most min_allowance (${floor})`);
  const closeAfter = t.close_after === undefined ? probes : Number(t.close_after as bigint);
  if (!(closeAfter >= 1 && closeAfter <= probes)) c.problem(`${at}.close_after`, String(closeAfter), `must be an integer from 1 to half_open_probes (${probes})`);
  if (c.problems.length > before) return null;
  return { windowMs: window * 1000, failureRatio: ratio, minVolume, openMs: open * 1000, halfOpenProbes: probes, closeAfter,
    probeTimeoutMs: probeTimeout * 1000, maxWaitMs: maxWait * 1000 };
}

function readUnmapped(c: Checker, value: unknown, config: Config): void {
  const t = table("unmapped_tasks", value);
  unknownKeys("unmapped_tasks", t, ["policy", "dependency", "max_own_budgets"]);
  const policy = c.choice("unmapped_tasks.policy", t.policy, ["own_budget", "share", "reject"] as const, "own_budget");
  const dependency = t.dependency;
  if (dependency !== undefined && typeof dependency !== "string") throw wrongType("unmapped_tasks.dependency", dependency, "a string");
  const own = t.max_own_budgets;
  if (own !== undefined && typeof own !== "bigint") throw wrongType("unmapped_tasks.max_own_budgets", own, "an integer");
  if (policy !== "share" && dependency !== undefined) c.problem("unmapped_tasks.dependency", quoted(dependency), 'goes only with policy = "share"');
  if (policy !== "own_budget" && own !== undefined) c.problem("unmapped_tasks.max_own_budgets", String(own), 'goes only with policy = "own_budget"');
  if (policy === "reject") {
    config.unmapped = { policy, maxOwnBudgets: 0, dependency: null };
  } else if (policy === "own_budget") {
    const n = c.intIn("unmapped_tasks.max_own_budgets", own, 0, MAX_OWN_BUDGETS, DEFAULT_MAX_OWN_BUDGETS);
    config.unmapped = { policy, maxOwnBudgets: n, dependency: null };
  } else if (dependency !== undefined && config.policies.has(dependency)) {
    config.unmapped = { policy, maxOwnBudgets: 0, dependency };
  } else {
    const named = [...config.policies.keys()].sort().join(", ") || "there is none";
    c.problem("unmapped_tasks.dependency", dependency === undefined ? "none" : quoted(dependency),
      `policy = "share" needs the name of a [dependencies.*] section (${named})`);
  }
}

function readTasks(c: Checker, value: unknown, config: Config): void {
  for (const [task, raw] of Object.entries(table("tasks", value))) {
    const at = `tasks.${tomlKey(task)}`;
    const t = table(at, raw);
    unknownKeys(at, t, ["class", "max_attempts", "recovery_window_secs", "backoff_base_ms", "backoff_cap_ms", "max_delay_secs"]);
    if (!config.tasks.has(task) && config.unmapped.policy === "own_budget") {
      const wrong = dependencyNameProblem(task);
      if (wrong) c.problem(at, quoted(task), wrong);
    }
    if (["class", "max_attempts", "recovery_window_secs"].filter((k) => k in t).length > 1) {
      c.problem(at, "class, max_attempts and recovery_window_secs", "set at most one of them");
    }
    const def = config.defaultCeiling;
    const backoff = readBackoff(c, at, t, def.backoff);
    const maxDelay = readMaxDelay(c, at, t) ?? def.maxDelayMs;
    let maxAttempts = def.maxAttempts;
    let window: number | null = null;
    if ("class" in t) {
      const cls = c.choice(`${at}.class`, t.class, Object.keys(CLASS_MAX_ATTEMPTS), "");
      maxAttempts = CLASS_MAX_ATTEMPTS[cls] ?? def.maxAttempts;
    } else if ("max_attempts" in t) {
      maxAttempts = c.intIn(`${at}.max_attempts`, t.max_attempts, 1, 1000, 5);
    } else if ("recovery_window_secs" in t) {
      const secs = c.intIn(`${at}.recovery_window_secs`, t.recovery_window_secs, 1, 7 * 86_400, 60);
      maxAttempts = backoff.attemptsForRecoveryWindow(secs * 1000);
      window = secs * 1000;
    }
    config.ceilings.set(task, new TaskCeiling(maxAttempts, backoff, window, maxDelay));
  }
}

function readAmqp(c: Checker, value: unknown, config: Config): void {
  // The other [amqp] keys belong to the Rust worker and are not read here.
  if (value === undefined) return;
  const a = table("amqp", value);
  if (a.prefix !== undefined) {
    if (typeof a.prefix !== "string") throw wrongType("amqp.prefix", a.prefix, "a string");
    const rule = "must be 1 to 100 bytes without spaces, control, bidirectional control or invisible characters, not starting with `amq.`";
    const bad = [...a.prefix].find((ch) => /\s/u.test(ch) || isUnsafeChar(ch));
    if (bad !== undefined) c.problem("amqp.prefix", quoted(a.prefix), `contains ${codePoint(bad)}; ${rule}`);
    else if (utf8Length(a.prefix) < 1 || utf8Length(a.prefix) > 100 || a.prefix.startsWith("amq.")) c.problem("amqp.prefix", quoted(a.prefix), rule);
    else config.amqpPrefix = a.prefix;
  }
  if (a.url !== undefined && a.urls !== undefined) {
    c.problem("amqp.urls", "amqp.url and amqp.urls", "set one of amqp.url (one broker) or amqp.urls (a cluster's nodes), not both");
  } else if (a.url !== undefined) {
    if (amqpUrlOk(c, "amqp.url", a.url)) config.amqpUrls = [a.url as string];
  } else if (a.urls !== undefined) {
    if (!Array.isArray(a.urls) || a.urls.length === 0) throw wrongType("amqp.urls", a.urls, "a non-empty list of URLs");
    if (a.urls.every((u, i) => amqpUrlOk(c, `amqp.urls[${i}]`, u))) config.amqpUrls = [...(a.urls as string[])];
  }
}

function resolve(root: Table, origin: string): Config {
  const c = new Checker();
  const { amqp, ...rest } = root;
  unknownKeys("", rest, ["redis", "defaults", "dependencies", "tasks", "metrics", "audit", "unmapped_tasks"]);
  const config = new Config();
  const metrics = table("metrics", rest.metrics);
  unknownKeys("metrics", metrics, ["listen"]);
  if (metrics.listen !== undefined && typeof metrics.listen !== "string") throw wrongType("metrics.listen", metrics.listen, "a string");
  const audit = table("audit", rest.audit);
  unknownKeys("audit", audit, ["max_entries", "max_age_days"]);
  c.intIn("audit.max_entries", audit.max_entries, 1, 10_000_000, 10_000);
  c.intIn("audit.max_age_days", audit.max_age_days, 1, 3650, 90);
  readAmqp(c, amqp, config);
  readRedis(c, rest.redis, config);
  readDefaults(c, rest.defaults, config);
  readDependencies(c, rest.dependencies, config);
  readUnmapped(c, rest.unmapped_tasks, config);
  readTasks(c, rest.tasks, config);
  if (c.problems.length > 0) {
    throw new ConfigError(origin, `invalid configuration:\n${c.problems.map((p) => `  - ${p.key} = ${p.value}: ${p.allowed}`).join("\n")}`, c.problems);
  }
  return config;
}
