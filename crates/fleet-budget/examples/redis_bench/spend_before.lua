-- A FROZEN COPY, not generated: do not edit it or regenerate it. This is lua/spend.lua as it
-- was at commit 45e412d26408b4d975f18941eb8798b195aaa432, the last version before 0483985
-- ("Lua: a leaner spend/spend_many, same answers"), kept as the "before" script of the
-- redis_bench example (throughput.rs, section 2: server CPU per call, before against now).
-- Below these six lines the file is that version byte for byte, without its first two lines
-- (the generated-file note):  git show 45e412d:lua/spend.lua | tail -n +3
-- fleet-budget spend: try to spend one retry from a dependency's budget (atomic, one round trip).
-- Contract: lua/README.md (key layout v1). Keep in step with crates/fleet-budget/src/allowance.rs.
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" successes | "a" first attempts),
--          mode ("sliding" | "fixed")
-- Reply    {granted (1|0), allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, ratio, min_allowance, basis, mode}
--          (window_ms and the last four: the policy in force, which may differ from ARGV)
-- [shared/window_arg.lua] ARGV[1], the window length in ms: a positive integer, at most one day
-- (86400000: the configuration's bound). inf, 1e300 or nan never reach PEXPIREAT: a key
-- without an expiry is never made.
-- Sets: window.
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 86400000 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer, at most 86400000 (one day)')
end
local at = 2
local propose = true
-- [shared/budget.lua] The caller's policy, the policy in force, the overrides, and the budget
-- rolled to the server's window.
-- Needs: window, `at` (the ARGV index where ratio, min_allowance, basis and mode start) and
-- `propose` (true when the caller's policy may become the policy in force: spend and deposit).
-- Sets: ratio (and ratio_text, as sent), min_allowance, basis, mode (the policy in force: the caller's, or the hash's when
-- they differ), ask (the caller's policy as text), conflict (1 when they differ), heard (the
-- caller sent the policy in force), d (the counter that earns allowance: 1 successes for basis
-- "s", 2 first attempts for "a"), sliding; fu and su (server ms when the freeze and the set
-- override end), frozen and overridden (1 while they are in force) and eratio, emin (the ratio and floor the allowance uses: the policy's,
-- or the set override's); now (server ms), i (window index), cur and prev (the current and
-- previous window's successes, first attempts, retries granted, retries denied: fields cs ca cr
-- cd and ps pa pr pd), rolled (the whole hash must be written).
local ratio_text = ARGV[at] or ''
local ratio = tonumber(ratio_text)
if not ratio or ratio ~= ratio or ratio < 0 or ratio > 10 or #ratio_text > 32 then
  return redis.error_reply('fleet-budget: ARGV[' .. at .. '] ratio must be a number >= 0, at most 10 (at most 32 characters)')
end
local min_allowance = tonumber(ARGV[at + 1])
if not min_allowance or min_allowance < 0 or min_allowance > 1000000000
    or min_allowance ~= math.floor(min_allowance) then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 1) .. '] min_allowance must be an integer >= 0, at most 10^9')
end
local basis = ARGV[at + 2]
if basis ~= 's' and basis ~= 'a' then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 2) .. '] basis must be "s" or "a"')
end
local mode = ARGV[at + 3]
if mode ~= 'sliding' and mode ~= 'fixed' then
  return redis.error_reply('fleet-budget: ARGV[' .. (at + 3) .. '] mode must be "sliding" or "fixed"')
end
local ask = window .. ' ' .. ratio_text .. ' ' .. min_allowance .. ' ' .. basis .. ' ' .. mode

-- Server time, never the caller's clock: workers with skewed clocks share the same windows.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The policy in force (fields w r m b o; h: server ms when a caller last sent it). A caller
-- whose policy differs is served by the policy in force and counted as a conflict; its policy
-- replaces the one in force only when nobody sent that one for a whole window of its own (the
-- fleet has moved). Counters are never reset by a disagreement.
-- A key of another type, or a stored number that is not one (tampered with), is refused before
-- any write, naming the key: `fleet-budget: key <key> ...`. Counters and times are integers of at
-- most 18 digits; ratios (r, sr) numbers from 0 to 10; floors (m, sm) integers up to 10^9.
local names = { 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', 'pr', 'pd',
  'r', 'm', 'b', 'o', 'h', 'fu', 'su', 'sr', 'sm' }
local h = redis.pcall('HMGET', KEYS[1], unpack(names))
if h.err then
  return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' is not a budget hash: ' .. h.err)
end
for n = 1, 19 do
  local v = h[n]
  local bad = false
  if v and (n <= 10 or n == 15 or n == 16 or n == 17) then
    bad = not string.match(v, '^%-?%d+$') or #v > 18
  elseif v and (n == 11 or n == 18) then
    local x = tonumber(v)
    bad = not x or x ~= x or x < 0 or x > 10
  elseif v and (n == 12 or n == 19) then
    bad = not string.match(v, '^%d+$') or #v > 10
  end
  if bad then
    return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' field ' .. names[n] .. ' is not a valid number')
  end
end
local sw = tonumber(h[1])
local i = tonumber(h[2])
local cur = { tonumber(h[3]) or 0, tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0 }
local prev = { tonumber(h[7]) or 0, tonumber(h[8]) or 0, tonumber(h[9]) or 0, tonumber(h[10]) or 0 }
local conflict = 0
local heard = propose
local rolled = false
if not sw or sw < 1 or sw ~= math.floor(sw) or not i then
  -- A new key (or one this script cannot read): the caller's policy, fresh counters.
  i = math.floor(now / window); cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }; rolled = true
else
  local fr, fm, fb, fo = tonumber(h[11]), tonumber(h[12]), h[13], h[14]
  local known = fr and fm and (fb == 's' or fb == 'a') and (fo == 'sliding' or fo == 'fixed')
  if not known then
    rolled = true -- counters without a policy: the caller's becomes the one in force
  elseif sw ~= window or fr ~= ratio or fm ~= min_allowance or fb ~= basis or fo ~= mode then
    if propose and now - (tonumber(h[15]) or 0) >= sw then
      rolled = true -- nobody sent the policy in force for one of its windows: the caller's replaces it
    else
      conflict = 1; heard = false
      window = sw; ratio = fr; ratio_text = h[11]; min_allowance = fm; basis = fb; mode = fo
    end
  end
  -- Roll the stored windows to the server's index: the next index shifts current into previous;
  -- a jump of two or more clears both; a lower index (a failover to a server whose clock is
  -- behind) keeps the stored window: counters are never un-rolled.
  local idx = math.floor(now / sw)
  if idx == i + 1 then
    prev = cur; cur = { 0, 0, 0, 0 }; i = idx; rolled = true
  elseif idx > i then
    i = idx; cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }; rolled = true
  end
  if sw ~= window then
    -- The window length changes: carry the counters over so that the new layout never allows
    -- more than the old counters did: every retry and denial still counting is kept (both
    -- windows, in the new current window), deposits only from the current window, scaled down
    -- when the new window is shorter.
    local keep = 1
    if window < sw then keep = window / sw end
    cur = { math.floor(cur[1] * keep), math.floor(cur[2] * keep), cur[3] + prev[3], cur[4] + prev[4] }
    prev = { 0, 0, 0, 0 }
    i = math.floor(now / window)
    rolled = true
  end
end
local d = 1
if basis == 'a' then d = 2 end
local sliding = mode == 'sliding'

-- Overrides (fields fu su sr sm, written by operators through override.lua, ending by
-- themselves): a freeze grants no retry at all, the floor included, until server ms fu; a set
-- override replaces the ratio (sr) and/or the floor (sm) until su.
local fu = tonumber(h[16]) or 0
local su = tonumber(h[17]) or 0
local frozen = 0
local overridden = 0
local eratio = ratio
local emin = min_allowance
if fu > now then frozen = 1 end
if su > now then
  local sr, sm = tonumber(h[18]), tonumber(h[19])
  if sr and sr >= 0 and sr == sr then overridden = 1; eratio = sr end
  if sm and sm >= 0 and sm == math.floor(sm) then overridden = 1; emin = sm end
end
-- [shared/estimate.lua] The allowance, from estimates scaled by window_ms so that every
-- comparison is exact in integers (crates/fleet-budget/src/allowance.rs does the same
-- operations in the same order, so both floor to the same integer).
-- Needs: what shared/budget.lua sets. Sets: elapsed (ms into the current window), pw (the
-- previous window's weight: the part of it still inside the last window_ms, 0 in fixed mode),
-- allowance (0 while frozen).
local elapsed = now - i * window
if elapsed < 0 then elapsed = 0 end
if elapsed > window - 1 then elapsed = window - 1 end
local pw = 0
if sliding then pw = window - elapsed end
local deposits_sc = cur[d] * window + prev[d] * pw
local allowance = math.floor(eratio * deposits_sc / window)
if allowance < emin then allowance = emin end
if frozen == 1 then allowance = 0 end

-- Decide and count: a grant is a retry, a refusal is a denial (never a retry). In scaled
-- integers: retries_est + 1 <= allowance.
local granted = 0
if cur[3] * window + prev[3] * pw + window <= allowance * window then
  granted = 1
  cur[3] = cur[3] + 1
else
  cur[4] = cur[4] + 1
end

-- Write the whole hash when the window rolled (or the key is new, or the policy in force is
-- new), else only the counter that changed.
if rolled then
  -- [shared/save.lua] Writes the whole hash (after a roll, a new key or a new policy in force) and
  -- expires it at the end of the next window, when these counters stop counting (or when the last
  -- override ends, if later): a dependency idle for two windows has no key, and no counter lives
  -- forever.
  redis.call('HSET', KEYS[1], 'w', window, 'i', i, 'cs', cur[1], 'ca', cur[2], 'cr', cur[3],
    'cd', cur[4], 'ps', prev[1], 'pa', prev[2], 'pr', prev[3], 'pd', prev[4],
    'r', ratio_text, 'm', min_allowance, 'b', basis, 'o', mode)
  local expire_at = (i + 2) * window
  if fu > expire_at then expire_at = fu end
  if su > expire_at then expire_at = su end
  redis.call('PEXPIREAT', KEYS[1], expire_at)
elseif granted == 1 then
  redis.call('HINCRBY', KEYS[1], 'cr', 1)
else
  redis.call('HINCRBY', KEYS[1], 'cd', 1)
end
-- [shared/heard.lua] Records who the caller agrees with: the time the policy in force was last
-- sent (h), or, for a caller whose policy differs, the conflict (xn: count, xp: its policy,
-- xt: server ms).
if heard then
  redis.call('HSET', KEYS[1], 'h', now)
elseif conflict == 1 and propose then
  redis.call('HINCRBY', KEYS[1], 'xn', 1)
  redis.call('HSET', KEYS[1], 'xp', ask, 'xt', now)
end
-- [shared/reply.lua] The reply every script starts with (lua/README.md, "Reply"); the script
-- sets reply[1] (granted, or -1) and may append.
local reply = { -1, allowance, i, window, elapsed, pw,
  cur[1], cur[2], cur[3], cur[4], prev[1], prev[2], prev[3], prev[4],
  conflict, frozen, overridden, ratio_text, min_allowance, basis, mode }
reply[1] = granted
return reply
