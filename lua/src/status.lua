#!lua flags=no-writes
-- fleet-budget status: read a dependency's budget without changing it (safe on replicas).
-- Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, ratio, min_allowance, basis, mode,
--           ttl_ms, conflicts, conflicting_policy, conflict_age_ms,
--           allowance_ratio, allowance_min}
--          (the state as the next spend would see it, under the policy in force; ttl_ms is -2
--          when the key does not exist; conflicts counts the calls that sent another policy,
--          the last of which sent conflicting_policy ("" if none) conflict_age_ms ago (-1);
--          allowance_ratio (text) and allowance_min are the ratio and floor the allowance uses:
--          the policy in force's, or an operator's set override's in their place)
local key_names = {'budget hash'}
-- @include keys_arg.lua
-- @include window_arg.lua
local at = 2
local propose = false
-- @include clock.lua
-- @include budget.lua
-- @include estimate.lua
-- @include reply.lua
-- status sends the policy in force always (fields 18 to 21), then its own fields.
reply[18] = ratio_text; reply[19] = min_allowance; reply[20] = basis; reply[21] = mode
local x = redis.call('HMGET', key, 'xn', 'xp', 'xt')
reply[22] = redis.call('PTTL', key)
reply[23] = tonumber(x[1]) or 0
reply[24] = x[2] or ''
reply[25] = -1
if tonumber(x[3]) then reply[25] = now - tonumber(x[3]) end
-- The ratio and floor the allowance uses (what a dashboard compares spend with): the policy in
-- force's, or those a set override puts in their place. A ratio goes as text (a number reply
-- would be truncated to an integer).
reply[26] = ratio_text
if eratio ~= ratio then reply[26] = tostring(eratio) end
reply[27] = emin
return reply
