-- fleet-budget spend_many: n requests for one retry each from a dependency's budget, decided
-- together in one atomic call (group commit). The answer is what n calls of spend.lua at the
-- same instant would give: the first g are granted (counted as retries), the rest denied
-- (counted as denials). Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, n (1 to 10000), ratio, min_allowance, basis ("s" | "a"),
--          mode ("sliding" | "fixed")
-- Reply    {g (granted, 0..n), allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, ratio, min_allowance, basis, mode}
--          (as spend.lua's) with the counters as they are after all n: request k (1-based) saw cur_retries -
--          g + min(k, g) and cur_denied - (n - g) + max(0, k - g).
-- @include window_arg.lua
if not string.match(ARGV[2] or '', '^%d+$') or #ARGV[2] > 5 then
  return redis.error_reply('fleet-budget: ARGV[2] n must be an integer from 1 to 10000')
end
local n = tonumber(ARGV[2])
if n < 1 or n > 10000 then
  return redis.error_reply('fleet-budget: ARGV[2] n must be an integer from 1 to 10000')
end
local at = 3
local propose = true
-- @include budget.lua
-- @include estimate.lua

-- Decide the n in order, as spend.lua would one after the other at this instant: a grant while
-- retries_est + 1 <= allowance (the allowance does not move within the call).
local g = 0
local used = cur[3] * window + prev[3] * pw + window
while g < n and used <= allowance * window do
  g = g + 1
  used = used + window
end
cur[3] = cur[3] + g
cur[4] = cur[4] + (n - g)

-- Write the counters that changed (the whole hash when the window rolled, the key is new, or the
-- policy in force is new).
local changed = {}
if g > 0 then changed = { 'cr', string.format('%d', cur[3]) } end
if g < n then
  changed[#changed + 1] = 'cd'
  changed[#changed + 1] = string.format('%d', cur[4])
end
-- @include save.lua
-- @include heard.lua
if conflict == 1 and n > 1 then
  -- n calls of spend.lua would each have counted the conflict.
  redis.call('HINCRBY', key, 'xn', n - 1)
end
-- @include reply.lua
reply[1] = g
return reply
