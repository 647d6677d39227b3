-- GENERATED from lua/src/lease_release.lua and the parts it includes from lua/src/shared:
-- edit those, then run FLEET_BUDGET_UPDATE_LUA=1 cargo test -p fleet-budget-e2e --test lua_scripts
-- fleet-budget lease_release: give back a slot of a dependency's concurrency budget (atomic, one
-- round trip). Releasing a lease that expired or was never taken is harmless.
-- Contract: lua/README.md ("Concurrency leases").
--
-- KEYS[1]  primary leases (ZSET), e.g. "fb:v1:{search}:lp"
-- KEYS[2]  retry leases (ZSET), e.g. "fb:v1:{search}:lr"
-- ARGV     lease id (1-128 bytes)
-- Reply    leases removed (0 or 1), primaries in flight, retries in flight (after the call)
local id = ARGV[1] or ''
if #id < 1 or #id > 128 then
  return redis.error_reply('fleet-budget: ARGV[1] lease id must be 1 to 128 bytes')
end
local removed = redis.call('ZREM', KEYS[1], id) + redis.call('ZREM', KEYS[2], id)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return {removed, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
