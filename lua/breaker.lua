-- GENERATED from lua/src/breaker.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget breaker: the fleet-wide circuit breaker of a dependency (atomic, one round trip per
-- decision). Contract: lua/README.md ("Circuit breaker"). Keep in step with
-- crates/fleet-budget/src/breaker/.
--
-- KEYS[1]  breaker hash, e.g. "fb:v1:{search}:cb" (the budget's hash-tag slot)
-- ARGV     op ("admit" | "record" | "cancel" | "status"), window_ms (1-86400000),
--          failure_ratio (number, 0 < r <= 1), min_volume (integer 1-10^9), open_ms (1-86400000),
--          half_open_probes (integer 1-10^6), close_after (integer 1-half_open_probes),
--          probe_timeout_ms (1-86400000), then
--          record: outcome ("s" success | "f" failure), probe generation ("0": not a probe)
--          cancel: probe generation
-- State    st (0 closed | 1 open | 2 half-open), g (generation: +1 at every change of state and
--          every reissue of probes), ou (open until, server ms), hs (half-open since),
--          pi (probes issued), po (probe successes), ch (last change, server ms), no (times
--          opened), i (window index), cs cf ps pf (successes and failures, current and previous
--          window)
-- Reply    admit:  {verdict (0 run | 1 probe | 2 wait), state, g, ou, changed (0|1), now}
--          record: {state, g, ou, changed (0|1), now}
--          cancel: {state, g, pi, now}
--          status: {state, g, ou, pi, po, ch, no, volume_sc, failures_sc, window_ms, now}
--                  (volume and failures are sliding estimates scaled by window_ms)
local key_names = {'breaker hash'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local key = KEYS[1]
local op = ARGV[1]
if op ~= 'admit' and op ~= 'record' and op ~= 'cancel' and op ~= 'status' then
  return redis.error_reply('fleet-budget: ARGV[1] op must be admit, record, cancel or status')
end
local function int_arg(n, name, lo, hi)
  local v = tonumber(ARGV[n])
  if not v or v ~= v or v < lo or v > hi or v ~= math.floor(v) then
    return nil, redis.error_reply('fleet-budget: ARGV[' .. n .. '] ' .. name ..
      ' must be an integer from ' .. lo .. ' to ' .. hi)
  end
  return v
end
local err
local w, open_ms, probes, close_after, probe_timeout, min_volume
w, err = int_arg(2, 'window_ms', 1, 86400000)
if err then return err end
local ratio = tonumber(ARGV[3])
if not ratio or ratio ~= ratio or ratio <= 0 or ratio > 1 then
  return redis.error_reply('fleet-budget: ARGV[3] failure_ratio must be a number above 0 and at most 1')
end
min_volume, err = int_arg(4, 'min_volume', 1, 1000000000)
if err then return err end
open_ms, err = int_arg(5, 'open_ms', 1, 86400000)
if err then return err end
probes, err = int_arg(6, 'half_open_probes', 1, 1000000)
if err then return err end
close_after, err = int_arg(7, 'close_after', 1, probes)
if err then return err end
probe_timeout, err = int_arg(8, 'probe_timeout_ms', 1, 86400000)
if err then return err end
local outcome, gen_arg = nil, 0
if op == 'record' then
  outcome = ARGV[9]
  if outcome ~= 's' and outcome ~= 'f' then
    return redis.error_reply('fleet-budget: ARGV[9] outcome must be "s" or "f"')
  end
  gen_arg, err = int_arg(10, 'probe generation', 0, 9007199254740991)
  if err then return err end
elseif op == 'cancel' then
  gen_arg, err = int_arg(9, 'probe generation', 1, 9007199254740991)
  if err then return err end
end

local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then
  return redis.error_reply('fleet-budget: key ' .. key .. ' is not a breaker hash (' .. kind .. ')')
end
local names = { 'st', 'g', 'ou', 'hs', 'pi', 'po', 'ch', 'no', 'i', 'cs', 'cf', 'ps', 'pf' }
local raw = redis.call('HMGET', key, unpack(names))
local s = {}
for k = 1, #names do
  local v = raw[k]
  if v then
    local n = tonumber(v)
    if not n or n ~= math.floor(n) or n < 0 or #v > 18 then
      return redis.error_reply('fleet-budget: key ' .. key .. ' field ' .. names[k] ..
        ' is not a non-negative integer of at most 18 digits')
    end
    s[names[k]] = n
  else
    s[names[k]] = 0
  end
end
if s.st > 2 then
  return redis.error_reply('fleet-budget: key ' .. key .. ' field st must be 0, 1 or 2')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The failure counts of the closed state: two windows of w ms, read as a sliding estimate.
local idx = math.floor(now / w)
if idx == s.i + 1 then
  s.ps, s.pf, s.cs, s.cf = s.cs, s.cf, 0, 0
elseif idx > s.i + 1 then
  s.ps, s.pf, s.cs, s.cf = 0, 0, 0, 0
end
if idx > s.i then s.i = idx end
local elapsed = math.min(math.max(now - s.i * w, 0), w - 1)
local prev_weight = w - elapsed
local function estimates()
  return (s.cs + s.cf) * w + (s.ps + s.pf) * prev_weight, s.cf * w + s.pf * prev_weight
end

if op == 'status' then
  local volume, failures = estimates()
  return { s.st, s.g, s.ou, s.pi, s.po, s.ch, s.no, volume, failures, w, now }
end

local changed = 0
local function enter(state)
  s.st = state
  s.g = s.g + 1
  s.ch = now
  s.pi, s.po = 0, 0
  changed = 1
  if state == 1 then
    s.ou = now + open_ms
    s.no = s.no + 1
  elseif state == 2 then
    s.hs = now
  end
  -- Counts of one state never decide the next: closing or opening starts them afresh.
  s.cs, s.cf, s.ps, s.pf = 0, 0, 0, 0
end

-- Time moves an open breaker to half-open, and reissues probes lost with their workers.
if s.st == 1 and now >= s.ou then
  enter(2)
elseif s.st == 2 and now - s.hs >= probe_timeout then
  s.g = s.g + 1
  s.hs = now
  s.pi, s.po = 0, 0
end

local reply
if op == 'admit' then
  local verdict = 2
  if s.st == 0 then
    verdict = 0
  elseif s.st == 2 and s.pi < probes then
    s.pi = s.pi + 1
    verdict = 1
  end
  reply = { verdict, s.st, s.g, s.ou, changed, now }
elseif op == 'record' then
  if s.st == 0 and gen_arg == 0 then
    if outcome == 's' then s.cs = s.cs + 1 else s.cf = s.cf + 1 end
    local volume, failures = estimates()
    if outcome == 'f' and volume >= min_volume * w and failures >= ratio * volume then
      enter(1)
    end
  elseif s.st == 2 and gen_arg == s.g then
    if outcome == 'f' then
      enter(1)
    else
      s.po = s.po + 1
      if s.po >= close_after then enter(0) end
    end
  end
  -- Anything else (a call admitted before the state changed, a probe of an older generation)
  -- is a late answer to a question already settled: ignored.
  reply = { s.st, s.g, s.ou, changed, now }
else
  if s.st == 2 and gen_arg == s.g and s.pi > 0 then s.pi = s.pi - 1 end
  reply = { s.st, s.g, s.pi, now }
end

local fields = {}
for k = 1, #names do
  fields[#fields + 1] = names[k]
  fields[#fields + 1] = s[names[k]]
end
redis.call('HSET', key, unpack(fields))
-- An idle breaker leaves no key once its counts and its open period can no longer matter; it
-- comes back closed. An open breaker has no expiry (since 0.2.0): a volatile-* maxmemory-policy
-- evicts only keys with one, and an evicted open breaker would come back closed. The first call
-- once it may half-open (now >= ou) writes the expiry again.
if s.st == 1 then
  redis.call('PERSIST', key)
else
  redis.call('PEXPIRE', key, 2 * w + open_ms + probe_timeout)
end
return reply
