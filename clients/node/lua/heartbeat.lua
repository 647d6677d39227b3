-- GENERATED from lua/src/heartbeat.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget heartbeat: a worker's entry in the worker registry, written every
-- redis.heartbeat_ms, or its removal when it ends (atomic, one round trip). Not part of any
-- decision: tools read the registry (crates/fleet-budget/src/control/workers/) to show which
-- workers report and which decide from their fallback. Contract: lua/README.md, "Worker registry".
--
-- KEYS[1]  reports (HASH worker id -> report), e.g. "fb:v1:workers:{workers}"
-- KEYS[2]  last seen (ZSET worker id -> server ms), e.g. "fb:v1:workers:{workers}:seen"
-- ARGV     action: "beat" | "leave", then worker id (1-200 bytes), then
--          beat:  report (1-4096 bytes, opaque here), retention_ms (integer, 1000 to 7 days)
--          leave: nothing
-- Reply    {now_ms, n}: the server's time; beat: entries pruned (at most 16: those last seen
--          more than retention_ms ago, or more than retention_ms ahead of now), leave: entries
--          removed (0 or 1)
-- Errors   a bad argument (named) or a key of another type; either writes nothing.
local key_names = {'worker reports hash', 'worker last-seen set'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local action = ARGV[1]
if action ~= 'beat' and action ~= 'leave' then
  return redis.error_reply('fleet-budget: ARGV[1] action must be "beat" or "leave"')
end
local id = ARGV[2] or ''
if #id < 1 or #id > 200 then
  return redis.error_reply('fleet-budget: ARGV[2] worker id must be 1 to 200 bytes')
end
local report, retention = ARGV[3] or '', nil
if action == 'beat' then
  if #report < 1 or #report > 4096 then
    return redis.error_reply('fleet-budget: ARGV[3] report must be 1 to 4096 bytes')
  end
  retention = tonumber(ARGV[4])
  if not retention or retention < 1000 or retention > 604800000 or retention ~= math.floor(retention) then
    return redis.error_reply('fleet-budget: ARGV[4] retention_ms must be an integer from 1000 to 604800000')
  end
end
for k, want in ipairs({ 'hash', 'zset' }) do
  local kind = redis.call('TYPE', KEYS[k]).ok
  if kind ~= want and kind ~= 'none' then
    return redis.error_reply('fleet-budget: key ' .. KEYS[k] .. ' is not the worker registry (' .. kind .. ')')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if action == 'leave' then
  redis.call('HDEL', KEYS[1], id)
  return { now, redis.call('ZREM', KEYS[2], id) }
end

redis.call('HSET', KEYS[1], id, report)
redis.call('ZADD', KEYS[2], now, id)
-- At most 16 entries pruned per beat, so a beat does a bounded amount of work whatever the
-- registry holds: the oldest first, then any seen "in the future" (written by hand).
local gone = redis.call('ZRANGE', KEYS[2], '-inf', '(' .. (now - retention), 'BYSCORE', 'LIMIT', 0, 16)
if #gone < 16 then
  local ahead = redis.call('ZRANGE', KEYS[2], '(' .. (now + retention), '+inf', 'BYSCORE', 'LIMIT', 0, 16 - #gone)
  for k = 1, #ahead do gone[#gone + 1] = ahead[k] end
end
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
-- The registry goes with the fleet: once nobody beats for retention_ms, both keys expire.
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[2], retention)
return { now, #gone }
