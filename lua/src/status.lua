#!lua flags=no-writes
-- fleet-budget status: read a dependency's budget without changing it (safe on replicas).
-- Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied, ttl_ms}
--          (the state as the next spend would see it; ttl_ms is -2 when the key does not exist)
-- @include window_arg.lua
local at = 2
-- @include budget.lua
-- @include estimate.lua
-- @include reply.lua
reply[15] = redis.call('PTTL', KEYS[1])
return reply
