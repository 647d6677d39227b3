-- GENERATED from lua/src/lease_release.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget lease_release: give back a slot of a dependency's concurrency budget (atomic, one
-- round trip). Releasing a lease that expired or was never taken is harmless.
-- Contract: lua/README.md ("Concurrency leases").
--
-- KEYS[1]  primary leases (ZSET), e.g. "fb:v1:{search}:lp"
-- KEYS[2]  retry leases (ZSET), e.g. "fb:v1:{search}:lr"
-- ARGV     lease id (1-128 bytes)
-- Reply    leases removed (0 or 1; 2 only when the id was written into both sets by hand),
--          primaries in flight, retries in flight (after the call), then (since 0.2.0) the
--          server's ms: a lease not removed before its expiry was lost (evicted, flushed)
-- Errors   as lease_acquire.lua: a bad argument, or a key of another type; either writes nothing.
local key_names = {'primary lease set', 'retry lease set'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local id = ARGV[1] or ''
if #id < 1 or #id > 128 then
  return redis.error_reply('fleet-budget: ARGV[1] lease id must be 1 to 128 bytes')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- As in lease_acquire.lua: both keys are checked before any write (a key of another type is
-- refused by name), and a set of more than 1000 leases loses at most 1000 expired ones per call.
local p = redis.pcall('ZCARD', KEYS[1])
if type(p) == 'table' then
  return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' is not a lease set: ' .. p.err)
end
local r = redis.pcall('ZCARD', KEYS[2])
if type(r) == 'table' then
  return redis.error_reply('fleet-budget: key ' .. KEYS[2] .. ' is not a lease set: ' .. r.err)
end
local n = {p, r}
local removed = 0
for k = 1, 2 do
  if n[k] > 0 then
    local out = redis.call('ZREM', KEYS[k], id)
    removed = removed + out
    n[k] = n[k] - out
  end
  if n[k] > 1000 then
    local gone = redis.call('ZRANGE', KEYS[k], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000)
    if #gone > 0 then
      n[k] = n[k] - redis.call('ZREM', KEYS[k], unpack(gone))
    end
  elseif n[k] > 0 then
    n[k] = n[k] - redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
  end
end
return {removed, n[1], n[2], now}
