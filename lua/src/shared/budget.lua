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
