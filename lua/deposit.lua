-- fleet-budget: record deposits (successes and/or first attempts) for a dependency, by a count,
-- so callers can batch. One round trip. Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, successes (n >= 0), first_attempts (n >= 0),
--          ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed")
--          (the last four only shape the snapshot in the reply)
-- Reply    {-1, allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied}
local key = KEYS[1]
local window = tonumber(ARGV[1])
local successes = tonumber(ARGV[2])
local first_attempts = tonumber(ARGV[3])
local ratio = tonumber(ARGV[4])
local min_allowance = tonumber(ARGV[5])
local basis = ARGV[6]
local mode = ARGV[7]
if not window or window < 1 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer')
end
if not string.match(ARGV[2] or '', '^%d+$') or #ARGV[2] > 15 then
  return redis.error_reply('fleet-budget: ARGV[2] successes must be a plain integer from 0 to 10^15')
end
if not string.match(ARGV[3] or '', '^%d+$') or #ARGV[3] > 15 then
  return redis.error_reply('fleet-budget: ARGV[3] first_attempts must be a plain integer from 0 to 10^15')
end
if not ratio or ratio ~= ratio or ratio < 0 then
  return redis.error_reply('fleet-budget: ARGV[4] ratio must be a number >= 0')
end
if not min_allowance or min_allowance < 0 or min_allowance ~= math.floor(min_allowance) then
  return redis.error_reply('fleet-budget: ARGV[5] min_allowance must be an integer >= 0')
end
if basis ~= 's' and basis ~= 'a' then
  return redis.error_reply('fleet-budget: ARGV[6] basis must be "s" or "a"')
end
if mode ~= 'sliding' and mode ~= 'fixed' then
  return redis.error_reply('fleet-budget: ARGV[7] mode must be "sliding" or "fixed"')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx = math.floor(now / window)

local h = redis.call('HMGET', key, 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', 'pr', 'pd')
local i = tonumber(h[2])
local c = { tonumber(h[3]) or 0, tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0 }
local p = { tonumber(h[7]) or 0, tonumber(h[8]) or 0, tonumber(h[9]) or 0, tonumber(h[10]) or 0 }
local rolled = true
if tonumber(h[1]) ~= window or not i then
  i = idx; c = { 0, 0, 0, 0 }; p = { 0, 0, 0, 0 }
elseif idx == i + 1 then
  p = c; c = { 0, 0, 0, 0 }; i = idx
elseif idx > i then
  i = idx; c = { 0, 0, 0, 0 }; p = { 0, 0, 0, 0 }
else
  rolled = false
end

c[1] = c[1] + successes
c[2] = c[2] + first_attempts

local elapsed = now - i * window
if elapsed < 0 then elapsed = 0 end
if elapsed > window - 1 then elapsed = window - 1 end
local pw = 0
if mode == 'sliding' then pw = window - elapsed end
local d = 1
if basis == 'a' then d = 2 end
local deposits_sc = c[d] * window + p[d] * pw
local allowance = math.floor(ratio * deposits_sc / window)
if allowance < min_allowance then allowance = min_allowance end

-- Write: the whole hash when the window rolled (or the key is new), with an expiry at the end of
-- the next window, when these counters stop counting (at most two windows of inactivity);
-- otherwise only the counters that changed (ARGV strings, checked to be plain integers above).
if rolled then
  redis.call('HSET', key, 'w', window, 'i', i, 'cs', c[1], 'ca', c[2], 'cr', c[3], 'cd', c[4],
    'ps', p[1], 'pa', p[2], 'pr', p[3], 'pd', p[4])
  redis.call('PEXPIREAT', key, (i + 2) * window)
else
  if successes > 0 then redis.call('HINCRBY', key, 'cs', ARGV[2]) end
  if first_attempts > 0 then redis.call('HINCRBY', key, 'ca', ARGV[3]) end
end
return { -1, allowance, i, window, elapsed, pw, c[1], c[2], c[3], c[4], p[1], p[2], p[3], p[4] }
