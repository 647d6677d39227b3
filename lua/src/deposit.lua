-- fleet-budget deposit: record deposits (successes and/or first attempts) for a dependency, by a
-- count, so callers can batch. One round trip. Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, successes (n >= 0), first_attempts (n >= 0),
--          ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
--          (the caller's policy: see lua/README.md, "The policy in force")
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, ratio, min_allowance, basis, mode}
-- @include window_arg.lua
if not string.match(ARGV[2] or '', '^%d+$') or #ARGV[2] > 15 then
  return redis.error_reply('fleet-budget: ARGV[2] successes must be a plain integer from 0 to 10^15')
end
if not string.match(ARGV[3] or '', '^%d+$') or #ARGV[3] > 15 then
  return redis.error_reply('fleet-budget: ARGV[3] first_attempts must be a plain integer from 0 to 10^15')
end
local successes = tonumber(ARGV[2])
local first_attempts = tonumber(ARGV[3])
local at = 4
local propose = true
-- @include clock.lua
-- @include budget.lua
cur[1] = cur[1] + successes
cur[2] = cur[2] + first_attempts
-- @include estimate.lua

-- Write the whole hash when the window rolled (or the key is new), else only the counters that
-- changed, by HINCRBY of the ARGV strings (checked to be plain integers above): a deposit may be
-- up to 10^15, so the server adds exactly, not Lua's doubles.
local changed = {}
-- @include save.lua
if not rolled then
  if successes > 0 then redis.call('HINCRBY', key, 'cs', ARGV[2]) end
  if first_attempts > 0 then redis.call('HINCRBY', key, 'ca', ARGV[3]) end
end
-- @include heard.lua
-- @include reply.lua
return reply
