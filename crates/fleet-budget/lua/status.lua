#!lua flags=no-writes
-- GENERATED from lua/src/status.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
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
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
-- [shared/window_arg.lua] ARGV[1], the window length in ms: a positive integer, at most one day
-- (86400000: the configuration's bound). inf, 1e300 or nan never reach PEXPIREAT: a key
-- without an expiry is never made by accident (only while an operator's override is in force).
-- Sets: window.
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 86400000 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer, at most 86400000 (one day)')
end
local at = 2
local propose = false
-- [shared/clock.lua] Server time, never the caller's clock: workers with skewed clocks share the
-- same windows. Read once per call (spend_batch.lua: once for all its entries, one instant).
-- Sets: now (server ms).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- [shared/budget.lua] The caller's policy, the policy in force, the overrides, and the budget
-- rolled to the server's window.
-- Needs: window, now (shared/clock.lua), `at` (the ARGV index where ratio, min_allowance, basis and mode start) and
-- `propose` (true when the caller's policy may become the policy in force: spend and deposit).
-- Sets: ratio (and ratio_text, as sent), min_allowance, basis, mode (the policy in force: the caller's, or the hash's when
-- they differ), ask (the caller's policy as text, set on a conflict), conflict (1 when they differ), heard (the
-- caller sent the policy in force), d (the counter that earns allowance: 1 successes for basis
-- "s", 2 first attempts for "a"), sliding; fu and su (server ms when the freeze and the set
-- override end), frozen and overridden (1 while they are in force) and eratio, emin (the ratio and floor the allowance uses: the policy's,
-- or the set override's); i (window index), cur and prev (the current and
-- previous window's successes, first attempts, retries granted, retries denied: fields cs ca cr
-- cd and ps pa pr pd), rolled (the whole hash must be written), birth (field e, or false).
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

-- The policy in force (fields w r m b o; h: server ms when a caller last sent it). A caller
-- whose policy differs is served by the policy in force and counted as a conflict; its policy
-- replaces the one in force only when nobody sent that one for a whole window of its own (the
-- fleet has moved). Counters are never reset by a disagreement.
-- A key of another type, or a stored number that is not one (tampered with), is refused before
-- any write, naming the key: `fleet-budget: key <key> ...`. Counters and times are integers of at
-- most 18 digits; ratios (r, sr) numbers from 0 to 10; floors (m, sm) integers up to 10^9.
-- A call in steady state takes the short way: one HMGET of the fields it needs, the policy in
-- force compared with the caller's as text (a field that equals the caller's checked argument is
-- that argument), no override field, every counter an integer of at most 18 digits (one pattern
-- over them all). Anything else takes the long way: no key is a fresh budget; otherwise
-- (another policy, an override, a bad field) the three fields left out (h sr sm) are read too
-- and each field is checked on its own.
local key = KEYS[1]
local h = redis.pcall('HMGET', key, 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', 'pr', 'pd',
  'r', 'm', 'b', 'o', 'fu', 'su', 'e')
if h.err then
  return redis.error_reply('fleet-budget: key ' .. key .. ' is not a budget hash: ' .. h.err)
end
-- The hash's birth (field e: server ms when a script created it, kept for its whole life; false
-- when it has none: new, or written by a script older than 0.2.0). shared/restore.lua compares
-- it with the one a caller remembers, and shared/save.lua writes it when missing.
local birth = h[17]
local sw, i, cur, prev, fu, su
local conflict = 0
local ask = nil
local heard = propose
local rolled = false
local frozen = 0
local overridden = 0
local eratio = ratio
local emin = min_allowance
if h[1] == ARGV[1] and h[11] == ratio_text and h[12] == ARGV[at + 1] and h[13] == basis
    and h[14] == mode and not h[15] and not h[16]
    and h[2] and h[3] and h[4] and h[5] and h[6] and h[7] and h[8] and h[9] and h[10]
    and #h[2] <= 18 and #h[3] <= 18 and #h[4] <= 18 and #h[5] <= 18 and #h[6] <= 18
    and #h[7] <= 18 and #h[8] <= 18 and #h[9] <= 18 and #h[10] <= 18
    and string.find(h[2] .. ',' .. h[3] .. ',' .. h[4] .. ',' .. h[5] .. ',' .. h[6] .. ','
        .. h[7] .. ',' .. h[8] .. ',' .. h[9] .. ',' .. h[10],
      '^%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+$') then
  sw = window; i = h[2] + 0; fu = 0; su = 0
  cur = { h[3] + 0, h[4] + 0, h[5] + 0, h[6] + 0 }
  prev = { h[7] + 0, h[8] + 0, h[9] + 0, h[10] + 0 }
elseif not (h[1] or h[2] or h[3] or h[4] or h[5] or h[6] or h[7] or h[8] or h[9] or h[10]
    or h[11] or h[12] or h[13] or h[14] or h[15] or h[16]) then
  -- No key (or none of these fields): the caller's policy, fresh counters. The three fields not
  -- read could not change that: h only matters against a policy in force, sr and sm with su.
  sw = window; i = math.floor(now / window); cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }
  rolled = true; fu = 0; su = 0
else
  -- The fields the short way leaves out (the key is a hash: the HMGET above worked).
  local more = redis.call('HMGET', key, 'h', 'sr', 'sm')
  h = { h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13], h[14],
    more[1], h[15], h[16], more[2], more[3] }
  -- Each stored number is converted once, here, and h[n] holds the number from then on (the
  -- ratio r keeps its text, which the reply and a conflict's record carry; fr and sr hold the
  -- numbers). Fields are checked in order, so that the first bad one is named.
  local fr, sr
  for n = 1, 19 do
    local v = h[n]
    if v then
      local ok = true
      if n == 11 or n == 18 then
        local x = tonumber(v)
        ok = x and x == x and x >= 0 and x <= 10
        if n == 11 then fr = x else sr = x end
      elseif n <= 10 or n == 15 or n == 16 or n == 17 then
        ok = #v <= 18 and string.find(v, '^%-?%d+$')
        if ok then h[n] = v + 0 end
      elseif n == 12 or n == 19 then
        ok = #v <= 10 and string.find(v, '^%d+$')
        if ok then h[n] = v + 0 end
      end
      if not ok then
        local names = { 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', 'pr', 'pd',
          'r', 'm', 'b', 'o', 'h', 'fu', 'su', 'sr', 'sm' }
        return redis.error_reply('fleet-budget: key ' .. key .. ' field ' .. names[n] .. ' is not a valid number')
      end
    end
  end
  sw = h[1] or nil
  i = h[2] or nil
  cur = { h[3] or 0, h[4] or 0, h[5] or 0, h[6] or 0 }
  prev = { h[7] or 0, h[8] or 0, h[9] or 0, h[10] or 0 }
  if not sw or sw < 1 or sw ~= math.floor(sw) or not i then
    -- A new key (or one this script cannot read): the caller's policy, fresh counters.
    sw = window; i = math.floor(now / window); cur = { 0, 0, 0, 0 }; prev = { 0, 0, 0, 0 }
    rolled = true
  else
    local fm, fb, fo = h[12] or nil, h[13], h[14]
    local known = fr and fm and (fb == 's' or fb == 'a') and (fo == 'sliding' or fo == 'fixed')
    if not known then
      rolled = true -- counters without a policy: the caller's becomes the one in force
    elseif sw ~= window or fr ~= ratio or fm ~= min_allowance or fb ~= basis or fo ~= mode then
      if propose and now - (h[15] or 0) >= sw then
        rolled = true -- nobody sent the policy in force for one of its windows: the caller's replaces it
      else
        conflict = 1; heard = false
        ask = window .. ' ' .. ratio_text .. ' ' .. min_allowance .. ' ' .. basis .. ' ' .. mode
        window = sw; ratio = fr; ratio_text = h[11]; min_allowance = fm; basis = fb; mode = fo
        eratio = ratio; emin = min_allowance
      end
    end
  end
  -- Overrides (fields fu su sr sm, written by operators through override.lua, ending by
  -- themselves): a freeze grants no retry at all, the floor included, until server ms fu; a set
  -- override replaces the ratio (sr) and/or the floor (sm) until su.
  fu = h[16] or 0
  su = h[17] or 0
  if fu > now then frozen = 1 end
  if su > now then
    local sm = h[19] or nil
    if sr and sr >= 0 and sr == sr then overridden = 1; eratio = sr end
    if sm and sm >= 0 and sm == math.floor(sm) then overridden = 1; emin = sm end
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
local d = 1
if basis == 'a' then d = 2 end
local sliding = mode == 'sliding'

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
-- [shared/reply.lua] The reply every script starts with (lua/README.md, "Reply"); the script
-- sets reply[1] (granted, or -1) and may append. The policy in force (fields 18 to 21) is sent
-- only when it is not the caller's (a conflict): otherwise the caller has it already, and every
-- field of a reply costs server CPU.
local reply = { -1, allowance, i, window, elapsed, pw,
  cur[1], cur[2], cur[3], cur[4], prev[1], prev[2], prev[3], prev[4],
  conflict, frozen, overridden }
if conflict == 1 then
  reply[18] = ratio_text; reply[19] = min_allowance; reply[20] = basis; reply[21] = mode
end
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
