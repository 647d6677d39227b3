-- fleet-budget: try to spend one retry from a dependency's budget (atomic, one round trip).
-- Contract: lua/README.md (key layout v1). Keep in step with crates/fleet-budget/src/allowance.rs.
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" successes | "a" first attempts),
--          mode ("sliding" | "fixed")
-- Reply    {granted (1|0), allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied}
local key = KEYS[1]
local window = tonumber(ARGV[1])
local ratio = tonumber(ARGV[2])
local min_allowance = tonumber(ARGV[3])
local basis = ARGV[4]
local mode = ARGV[5]
if not window or window < 1 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer')
end
if not ratio or ratio ~= ratio or ratio < 0 then
  return redis.error_reply('fleet-budget: ARGV[2] ratio must be a number >= 0')
end
if not min_allowance or min_allowance < 0 or min_allowance ~= math.floor(min_allowance) then
  return redis.error_reply('fleet-budget: ARGV[3] min_allowance must be an integer >= 0')
end
if basis ~= 's' and basis ~= 'a' then
  return redis.error_reply('fleet-budget: ARGV[4] basis must be "s" or "a"')
end
if mode ~= 'sliding' and mode ~= 'fixed' then
  return redis.error_reply('fleet-budget: ARGV[5] mode must be "sliding" or "fixed"')
end

-- Server time, never the caller's clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx = math.floor(now / window)

-- Load and roll the two windows.
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

-- Estimates scaled by window_ms (exact integers), then the allowance.
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

-- Decide and count: a grant is a retry, a refusal is a denial (never a retry).
local granted = 0
if c[3] * window + p[3] * pw + window <= allowance * window then
  granted = 1
  c[3] = c[3] + 1
else
  c[4] = c[4] + 1
end

-- Write: the whole hash when the window rolled (or the key is new), with an expiry at the end of
-- the next window, when these counters stop counting (at most two windows of inactivity);
-- otherwise only the counter that changed.
if rolled then
  redis.call('HSET', key, 'w', window, 'i', i, 'cs', c[1], 'ca', c[2], 'cr', c[3], 'cd', c[4],
    'ps', p[1], 'pa', p[2], 'pr', p[3], 'pd', p[4])
  redis.call('PEXPIREAT', key, (i + 2) * window)
elseif granted == 1 then
  redis.call('HINCRBY', key, 'cr', 1)
else
  redis.call('HINCRBY', key, 'cd', 1)
end
return { granted, allowance, i, window, elapsed, pw, c[1], c[2], c[3], c[4], p[1], p[2], p[3], p[4] }
