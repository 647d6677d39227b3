#!lua flags=no-writes
-- GENERATED from lua/src/status.lua and the parts it includes from lua/src/shared:
-- edit those, then run FLEET_BUDGET_UPDATE_LUA=1 cargo test -p fleet-budget-e2e --test lua_scripts
-- fleet-budget status: read a dependency's budget without changing it (safe on replicas).
-- Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied, ttl_ms}
--          (the state as the next spend would see it; ttl_ms is -2 when the key does not exist)
-- [shared/window_arg.lua] ARGV[1], the window length in ms: a positive integer.
-- Sets: window.
local window = tonumber(ARGV[1])
if not window or window < 1 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer')
end
local at = 2
-- [shared/budget.lua] The rest of the policy, then the budget rolled to the server's window.
-- Needs: window, and `at`, the ARGV index where ratio, min_allowance, basis and mode start.
-- Sets: ratio, min_allowance, d (the counter that earns allowance: 1 successes for basis "s",
-- 2 first attempts for "a"), sliding; now (server ms), i (window index), cur and prev (the
-- current and previous window's successes, first attempts, retries granted, retries denied:
-- fields cs ca cr cd and ps pa pr pd), rolled (the whole hash must be written).
local ratio = tonumber(ARGV[at])
if not ratio or ratio ~= ratio or ratio < 0 then
  return redis.error_reply('fleet-budget: ARGV[' .. at .. '] ratio must be a number >= 0')
end
local min_allowance = tonumber(ARGV[at + 1])
if not min_allowance or min_allowance < 0 or min_allowance ~= math.floor(min_allowance) then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 1) .. '] min_allowance must be an integer >= 0')
end
local basis = ARGV[at + 2]
if basis ~= 's' and basis ~= 'a' then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 2) .. '] basis must be "s" or "a"')
end
local mode = ARGV[at + 3]
if mode ~= 'sliding' and mode ~= 'fixed' then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 3) .. '] mode must be "sliding" or "fixed"')
end
local d = 1
if basis == 'a' then d = 2 end
local sliding = mode == 'sliding'

-- Server time, never the caller's clock: workers with skewed clocks share the same windows.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx = math.floor(now / window)

-- Load and roll the two windows: the next index shifts current into previous; a jump of two or
-- more, a new key or another window length starts afresh; a lower index (a failover to a server
-- whose clock is behind) keeps the stored window: counters are never un-rolled.
local h = redis.call('HMGET', KEYS[1], 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', 'pr', 'pd')
local i = tonumber(h[2])
local cur = { tonumber(h[3]) or 0, tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0 }
local prev = { tonumber(h[7]) or 0, tonumber(h[8]) or 0, tonumber(h[9]) or 0, tonumber(h[10]) or 0 }
local rolled = true
if tonumber(h[1]) ~= window or not i then
  i = idx; cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }
elseif idx == i + 1 then
  prev = cur; cur = { 0, 0, 0, 0 }; i = idx
elseif idx > i then
  i = idx; cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }
else
  rolled = false
end
-- [shared/estimate.lua] The allowance, from estimates scaled by window_ms so that every
-- comparison is exact in integers (crates/fleet-budget/src/allowance.rs does the same
-- operations in the same order, so both floor to the same integer).
-- Needs: what shared/budget.lua sets. Sets: elapsed (ms into the current window), pw (the
-- previous window's weight: the part of it still inside the last window_ms, 0 in fixed mode),
-- allowance.
local elapsed = now - i * window
if elapsed < 0 then elapsed = 0 end
if elapsed > window - 1 then elapsed = window - 1 end
local pw = 0
if sliding then pw = window - elapsed end
local deposits_sc = cur[d] * window + prev[d] * pw
local allowance = math.floor(ratio * deposits_sc / window)
if allowance < min_allowance then allowance = min_allowance end
-- [shared/reply.lua] The reply every script starts with (lua/README.md, "Reply"); the script
-- sets reply[1] (granted, or -1) and may append.
local reply = { -1, allowance, i, window, elapsed, pw,
  cur[1], cur[2], cur[3], cur[4], prev[1], prev[2], prev[3], prev[4] }
reply[15] = redis.call('PTTL', KEYS[1])
return reply
