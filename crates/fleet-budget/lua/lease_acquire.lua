-- GENERATED from lua/src/lease_acquire.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget lease_acquire: take one slot of a dependency's concurrency budget (atomic, one
-- round trip), as a lease that expires by the server's clock if its holder never releases it.
-- Contract: lua/README.md ("Concurrency leases"). Keep in step with
-- crates/fleet-budget/src/concurrency/ and fleet_budget_sim::concurrency::retry_slots.
--
-- KEYS[1]  primary leases, a ZSET (member: lease id, score: server ms it expires), e.g. "fb:v1:{search}:lp"
-- KEYS[2]  retry leases, a ZSET, e.g. "fb:v1:{search}:lr"
-- ARGV     kind ("p" primary | "r" retry), lease id (1-128 bytes), lease_ms (1-86400000), cap
--          (integer >= 1), max_retry_fraction (number >= 0), min_retry_slots (integer >= 0),
--          primary_waits ("0": primaries are counted and never refused | "1": refused at the cap)
-- Reply    granted (1|0), refusal (0 none | 1 the cap is reached | 2 the retry share is spent),
--          primaries in flight, retries in flight (after the call), retry slots, server ms
-- Errors   "fleet-budget: ARGV[n] ..." for a bad argument, "fleet-budget: key <key> is not a
--          lease set: WRONGTYPE ..." for a key of another type; either writes nothing.
local key_names = {'primary lease set', 'retry lease set'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local kind = ARGV[1]
if kind ~= 'p' and kind ~= 'r' then
  return redis.error_reply('fleet-budget: ARGV[1] kind must be "p" or "r"')
end
local id = ARGV[2] or ''
if #id < 1 or #id > 128 then
  return redis.error_reply('fleet-budget: ARGV[2] lease id must be 1 to 128 bytes')
end
local lease_ms = tonumber(ARGV[3])
if not lease_ms or lease_ms < 1 or lease_ms > 86400000 or lease_ms ~= math.floor(lease_ms) then
  return redis.error_reply('fleet-budget: ARGV[3] lease_ms must be an integer from 1 to 86400000')
end
local cap = tonumber(ARGV[4])
if not cap or cap < 1 or cap > 1000000000 or cap ~= math.floor(cap) then
  return redis.error_reply('fleet-budget: ARGV[4] cap must be an integer from 1 to 10^9')
end
local fraction = tonumber(ARGV[5])
if not fraction or fraction ~= fraction or fraction < 0 or fraction > 1000 then
  return redis.error_reply('fleet-budget: ARGV[5] max_retry_fraction must be a number from 0 to 1000')
end
local min_slots = tonumber(ARGV[6])
if not min_slots or min_slots < 0 or min_slots > 1000000000 or min_slots ~= math.floor(min_slots) then
  return redis.error_reply('fleet-budget: ARGV[6] min_retry_slots must be an integer from 0 to 10^9')
end
local waits = ARGV[7]
if waits ~= '0' and waits ~= '1' then
  return redis.error_reply('fleet-budget: ARGV[7] primary_waits must be "0" or "1"')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Anyone with access to Redis can write these keys. Both are checked before any write: a key of
-- another type is refused by name.
local p = redis.pcall('ZCARD', KEYS[1])
if type(p) == 'table' then
  return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' is not a lease set: ' .. p.err)
end
local r = redis.pcall('ZCARD', KEYS[2])
if type(r) == 'table' then
  return redis.error_reply('fleet-budget: key ' .. KEYS[2] .. ' is not a lease set: ' .. r.err)
end
-- A lease whose expiry has come is gone: its holder died or forgot it. A set of more than 1000
-- leases (a dead fleet, or stuffed by hand) loses at most 1000 expired ones per call, so that each
-- call does a bounded amount of work; those not yet removed count as in flight until they are
-- (towards the cap, which then refuses sooner, never later).
local n = {p, r}
for k = 1, 2 do
  if n[k] > 1000 then
    local gone = redis.call('ZRANGE', KEYS[k], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000)
    if #gone > 0 then
      n[k] = n[k] - redis.call('ZREM', KEYS[k], unpack(gone))
    end
  elseif n[k] > 0 then
    n[k] = n[k] - redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
  end
end
p, r = n[1], n[2]
local slots = math.max(min_slots, math.floor(fraction * p))
local free = math.max(0, cap - p - r)

local refusal = 0
local at = 1
if kind == 'r' then
  at = 2
  if free < 1 then
    refusal = 1
  elseif r >= slots then
    refusal = 2
  end
elseif waits == '1' and free < 1 then
  refusal = 1
end
local own = KEYS[at]
-- A lease id already held (a renewal) is granted again without counting twice.
if refusal ~= 0 and redis.call('ZSCORE', own, id) then
  refusal = 0
end
-- No lease ends later than the longest lease from now. One that does (+inf, 1e300: written by
-- hand, or by a server whose clock ran ahead) is brought back to that bound, at most 1000 per
-- set per call, so that it still counts and still expires, and a set's expiry stays a whole ms:
-- in the caller's own set at every call, and in both when the call is refused (leases that never
-- end must not keep a cap shut for good).
local latest = now + 86400000
local top = 0
for k = 1, 2 do
  if (refusal ~= 0 or k == at) and n[k] > 0 then
    local last = redis.call('ZRANGE', KEYS[k], -1, -1, 'WITHSCORES')
    local score = tonumber(last[2])
    if score > latest then
      local far = redis.call('ZRANGE', KEYS[k], '(' .. string.format('%d', latest), '+inf', 'BYSCORE', 'LIMIT', 0, 1000)
      if #far > 0 then
        local back = {}
        for i = 1, #far do
          back[2 * i - 1] = latest
          back[2 * i] = far[i]
        end
        redis.call('ZADD', KEYS[k], 'XX', unpack(back))
      end
      score = latest
    end
    if k == at then
      top = math.ceil(score)
    end
  end
end
if refusal ~= 0 then
  return {0, refusal, p, r, slots, now}
end
local added = redis.call('ZADD', own, now + lease_ms, id)
-- The set lives as long as its last lease, so an idle dependency leaves no key.
redis.call('PEXPIREAT', own, math.max(now + lease_ms, top) + 1)
if at == 1 then
  p = p + added
else
  r = r + added
end
return {1, 0, p, r, slots, now}
