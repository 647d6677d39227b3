-- fleet-budget deposit: record deposits (successes and/or first attempts) for a dependency, by a
-- count, so callers can batch, and the denials the caller answered itself (its deny cache) since
-- its last call. One round trip. Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, successes (n >= 0), first_attempts (n >= 0),
--          ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
--          (the caller's policy: see lua/README.md, "The policy in force"),
--          then optionally denied (n >= 0, since 0.2.0: denials answered in the caller's process,
--          added to the window's denial counter cd; callers before 0.2.0 send 7 arguments),
--          then optionally (since 0.2.0, with ARGV 8) the caller's memory as in spend.lua (ARGV 9
--          and 10; the reply then ends with spend.lua's six memory fields)
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, ratio, min_allowance, basis, mode}
local key_names = {'budget hash'}
-- @include keys_arg.lua
-- @include window_arg.lua
if not string.match(ARGV[2] or '', '^%d+$') or #ARGV[2] > 15 then
  return redis.error_reply('fleet-budget: ARGV[2] successes must be a plain integer from 0 to 999999999999999 (at most 15 digits)')
end
if not string.match(ARGV[3] or '', '^%d+$') or #ARGV[3] > 15 then
  return redis.error_reply('fleet-budget: ARGV[3] first_attempts must be a plain integer from 0 to 999999999999999 (at most 15 digits)')
end
local successes = tonumber(ARGV[2])
local first_attempts = tonumber(ARGV[3])
-- ARGV[8], after the policy so that the 7-argument call of older callers means "none".
local denied_text = ARGV[8] or '0'
local denied = 0
local at = 4
local propose = true
local mem = 9
-- @include clock.lua
-- @include budget.lua
-- @include restore.lua
if not string.match(denied_text, '^%d+$') or #denied_text > 15 then
  return redis.error_reply('fleet-budget: ARGV[8] denied must be a plain integer from 0 to 999999999999999 (at most 15 digits)')
end
denied = tonumber(denied_text)
cur[1] = cur[1] + successes
cur[2] = cur[2] + first_attempts
cur[4] = cur[4] + denied
-- @include estimate.lua

-- Write the whole hash when the window rolled (or the key is new), else only the counters that
-- changed, by HINCRBY of the ARGV strings (checked to be plain integers above): a deposit may be
-- up to 999999999999999, so the server adds exactly, not Lua's doubles.
local changed = {}
-- @include save.lua
if not rolled then
  if successes > 0 then redis.call('HINCRBY', key, 'cs', ARGV[2]) end
  if first_attempts > 0 then redis.call('HINCRBY', key, 'ca', ARGV[3]) end
  if denied > 0 then redis.call('HINCRBY', key, 'cd', string.format('%d', denied)) end
end
-- @include heard.lua
-- @include reply.lua
-- @include memory_reply.lua
return reply
