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
-- A lease whose expiry has come is gone: its holder died or forgot it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local p = redis.call('ZCARD', KEYS[1])
local r = redis.call('ZCARD', KEYS[2])
local slots = math.max(min_slots, math.floor(fraction * p))
local free = math.max(0, cap - p - r)

local refusal = 0
local own = KEYS[1]
if kind == 'r' then
  own = KEYS[2]
  if free < 1 then
    refusal = 1
  elseif r >= slots then
    refusal = 2
  end
elseif waits == '1' and free < 1 then
  refusal = 1
end
-- A lease id already held (a renewal) is granted again without counting twice.
if refusal ~= 0 and redis.call('ZSCORE', own, id) then
  refusal = 0
end
if refusal ~= 0 then
  return {0, refusal, p, r, slots, now}
end
redis.call('ZADD', own, now + lease_ms, id)
-- The set lives as long as its last lease, so an idle dependency leaves no key.
local last = redis.call('ZRANGE', own, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', own, tonumber(last[2]) + 1)
return {1, 0, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), slots, now}
