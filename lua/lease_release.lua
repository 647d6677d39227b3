-- GENERATED from lua/src/lease_release.lua and the parts it includes from lua/src/shared:
-- edit those, then run FLEET_BUDGET_UPDATE_LUA=1 cargo test -p fleet-budget-e2e --test lua_scripts
-- fleet-budget lease_release: give back a slot of a dependency's concurrency budget (atomic, one
-- round trip). Releasing a lease that expired or was never taken is harmless.
-- Contract: lua/README.md ("Concurrency leases").
--
-- KEYS[1]  primary leases (ZSET), e.g. "fb:v1:{search}:lp"
-- KEYS[2]  retry leases (ZSET), e.g. "fb:v1:{search}:lr"
-- ARGV     lease id (1-128 bytes)
-- Reply    leases removed (0 or 1; 2 only when the id was written into both sets by hand),
--          primaries in flight, retries in flight (after the call)
-- Errors   as lease_acquire.lua: a bad argument, or a key of another type; either writes nothing.
local id = ARGV[1] or ''
if #id < 1 or #id > 128 then
  return redis.error_reply('fleet-budget: ARGV[1] lease id must be 1 to 128 bytes')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- As in lease_acquire.lua: each key is checked before any write (a key of another type is
-- refused by name), and at most 1000 expired leases per set are removed per call.
local gone_p = redis.pcall('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000)
if gone_p.err then
  return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' is not a lease set: ' .. gone_p.err)
end
local gone_r = redis.pcall('ZRANGE', KEYS[2], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000)
if gone_r.err then
  return redis.error_reply('fleet-budget: key ' .. KEYS[2] .. ' is not a lease set: ' .. gone_r.err)
end
local removed = redis.call('ZREM', KEYS[1], id) + redis.call('ZREM', KEYS[2], id)
if #gone_p > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone_p))
end
if #gone_r > 0 then
  redis.call('ZREM', KEYS[2], unpack(gone_r))
end
return {removed, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
