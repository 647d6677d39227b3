-- GENERATED from lua/src/override.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget override: an operator's freeze or set override on a dependency's budget, or the
-- removal of one (atomic, one round trip). Not on the workers' path: budgetctl and other tools
-- call it (crates/fleet-budget/src/control/). Contract: lua/README.md, "Overrides".
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     action: "freeze" | "set" | "unfreeze" | "clear", then
--          freeze: duration_ms, actor, reason
--          set:    duration_ms, actor, reason, ratio ("" keeps the policy's), min_allowance ("" keeps it)
--          unfreeze, clear: nothing
-- Reply    {now_ms, fu, fa, fy, ft, su, sr, sm, sa, sy, st}: the server's time and the override
--          fields as they were before (false when absent): freeze until / by / why / since,
--          set until / ratio / floor / by / why / since
local key_names = {'budget hash'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local action = ARGV[1]
local fields = { 'fu', 'fa', 'fy', 'ft', 'su', 'sr', 'sm', 'sa', 'sy', 'st' }
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local before = redis.call('HMGET', KEYS[1], unpack(fields))
local reply = { now }
for k = 1, #fields do reply[k + 1] = before[k] end

if action == 'freeze' or action == 'set' then
  local duration = tonumber(ARGV[2])
  if not duration or duration < 1 or duration > 31622400000 or duration ~= math.floor(duration) then
    return redis.error_reply('fleet-budget: ARGV[2] duration_ms must be an integer from 1 to 366 days')
  end
  if #(ARGV[3] or '') > 200 or #(ARGV[4] or '') > 1000 then
    return redis.error_reply('fleet-budget: ARGV[3] actor (200 bytes) or ARGV[4] reason (1000 bytes) too long')
  end
  local ends = now + duration
  if action == 'freeze' then
    redis.call('HSET', KEYS[1], 'fu', ends, 'fa', ARGV[3], 'fy', ARGV[4], 'ft', now)
  else
    local ratio, floor = ARGV[5] or '', ARGV[6] or ''
    local r = tonumber(ratio)
    if ratio ~= '' and (not r or r ~= r or r < 0 or r > 1000 or #ratio > 32) then
      return redis.error_reply('fleet-budget: ARGV[5] ratio must be empty or a number from 0 to 1000')
    end
    local m = tonumber(floor)
    if floor ~= '' and (not m or m < 0 or m > 1000000000 or m ~= math.floor(m)) then
      return redis.error_reply('fleet-budget: ARGV[6] min_allowance must be empty or an integer from 0 to 10^9')
    end
    if ratio == '' and floor == '' then
      return redis.error_reply('fleet-budget: set needs a ratio (ARGV[5]) or a min_allowance (ARGV[6])')
    end
    redis.call('HDEL', KEYS[1], 'sr', 'sm')
    redis.call('HSET', KEYS[1], 'su', ends, 'sa', ARGV[3], 'sy', ARGV[4], 'st', now)
    if ratio ~= '' then redis.call('HSET', KEYS[1], 'sr', ratio) end
    if floor ~= '' then redis.call('HSET', KEYS[1], 'sm', floor) end
  end
  -- While the override is in force the budget hash has no expiry: a volatile-* maxmemory-policy
  -- evicts only keys with one, so it cannot take the override (the scripts keep it so; the
  -- first roll after the override ends sets the expiry again).
  redis.call('PERSIST', KEYS[1])
elseif action == 'unfreeze' then
  redis.call('HDEL', KEYS[1], 'fu', 'fa', 'fy', 'ft')
elseif action == 'clear' then
  redis.call('HDEL', KEYS[1], unpack(fields))
else
  return redis.error_reply('fleet-budget: ARGV[1] action must be "freeze", "set", "unfreeze" or "clear"')
end
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
elseif action == 'unfreeze' or action == 'clear' then
  -- No override left in force: the hash expires again, at the end of the next window as the
  -- scripts set it (at least one window from now, 60 s without a window), so that its birth
  -- (field e) outlives the lift and workers that remember the freeze learn it was lifted.
  local left = redis.call('HMGET', KEYS[1], 'fu', 'su', 'w', 'i')
  local fu, su = tonumber(left[1]) or 0, tonumber(left[2]) or 0
  if fu <= now and su <= now and redis.call('PTTL', KEYS[1]) == -1 then
    local w, i = tonumber(left[3]), tonumber(left[4])
    local at = now + 60000
    if w and i and w >= 1 and w <= 86400000 and w == math.floor(w) then
      at = math.max((i + 2) * w, now + w)
    end
    redis.call('PEXPIREAT', KEYS[1], math.floor(at))
  end
end
return reply
