-- GENERATED from lua/src/dead_letters.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget dead letters: the index of what waits in a dead-letter or parked queue, counted
-- when a copy is confirmed there and when one leaves (replayed, parked, purged), so that looking
-- at the queue never reads it. Atomic, one round trip for a batch of changes. Not part of any
-- decision. Contract: lua/README.md, "Dead-letter index".
--
-- KEYS[1]  the queue's index (HASH row -> count), e.g. "fb:v1:dead-letters:{fleet.dead}"
-- KEYS[2]  optional: the writer's last batch (HASH, field "last": a sequence number), e.g.
--          "fb:v1:dead-letters-writer:{fleet.dead}:<writer>": a batch is applied once, so a
--          writer may send it again after a timeout; expires 10 minutes after its last write
-- ARGV     max_rows (integer, 1 to 100000), with KEYS[2] the batch's sequence number (an
--          integer, 1 to 2^53, above the writer's last), then pairs: row (1-2048 bytes, opaque
--          here: the callers' JSON array), delta (a non-zero integer, -1000000 to 1000000)
-- Reply    with KEYS[2] and a sequence number not above the one it holds: an empty array (the
--          batch was applied before; nothing is written). Else one integer per pair, the change
--          applied. An increase is applied whole: to its row,
--          or, when that row is new and the index already holds max_rows rows, to the row "[]"
--          (counts beyond the bound: a producer's hostile error classes cannot grow the hash
--          without bound). A decrease never takes a count below 0 (a row at 0 is removed): it
--          applies to its row, else to "[]", else to nothing (a message never counted:
--          dead-lettered while Redis was unreachable, or by the broker itself), and replies
--          what it took (0 to delta).
-- Errors   a bad argument (named) or a key of another type; either writes nothing.
local key_names = {'dead-letter index'}
-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
local max_rows = tonumber(ARGV[1])
if not max_rows or max_rows < 1 or max_rows > 100000 or max_rows ~= math.floor(max_rows) then
  return redis.error_reply('fleet-budget: ARGV[1] max_rows must be an integer from 1 to 100000')
end
local first, seq = 2, nil
if KEYS[2] ~= nil then
  seq = tonumber(ARGV[2])
  if not seq or seq < 1 or seq > 9007199254740992 or seq ~= math.floor(seq) then
    return redis.error_reply('fleet-budget: ARGV[2] sequence must be an integer from 1 to 2^53 (KEYS[2] is the writer\'s last batch)')
  end
  first = 3
end
if #ARGV < first + 1 or (#ARGV - first) % 2 ~= 1 then
  if seq then
    return redis.error_reply('fleet-budget: ARGV must be max_rows, the sequence number, then row and delta pairs')
  end
  return redis.error_reply('fleet-budget: ARGV must be max_rows, then row and delta pairs')
end
local deltas = {}
for i = first, #ARGV, 2 do
  local row, delta = ARGV[i], tonumber(ARGV[i + 1])
  if #row < 1 or #row > 2048 then
    return redis.error_reply('fleet-budget: ARGV[' .. i .. '] row must be 1 to 2048 bytes')
  end
  if not delta or delta == 0 or delta ~= math.floor(delta) or delta < -1000000 or delta > 1000000 then
    return redis.error_reply('fleet-budget: ARGV[' .. (i + 1) .. '] delta must be a non-zero integer from -1000000 to 1000000')
  end
  deltas[#deltas + 1] = delta
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return redis.error_reply('fleet-budget: key ' .. KEYS[1] .. ' is not a dead-letter index (' .. kind .. ')')
end
if seq then
  local writer = redis.call('TYPE', KEYS[2]).ok
  if writer ~= 'hash' and writer ~= 'none' then
    return redis.error_reply('fleet-budget: key ' .. KEYS[2] .. ' is not a dead-letter writer\'s last batch (' .. writer .. ')')
  end
  -- Anything but a number (written by someone else) counts as no batch applied.
  -- HGET, HSET and PEXPIRE: what the worker's ACL grants (lua/README.md).
  local last = tonumber(redis.call('HGET', KEYS[2], 'last') or '0') or 0
  if seq <= last then
    return {}
  end
  redis.call('HSET', KEYS[2], 'last', string.format('%d', seq))
  redis.call('PEXPIRE', KEYS[2], 600000)
end
local beyond = '[]'
local reply = {}
for n = 1, #deltas do
  local row, delta = ARGV[first + 2 * (n - 1)], deltas[n]
  local have = tonumber(redis.call('HGET', KEYS[1], row) or '0') or 0
  if delta > 0 then
    if have == 0 and row ~= beyond and redis.call('HLEN', KEYS[1]) >= max_rows then
      row = beyond
    end
    redis.call('HINCRBY', KEYS[1], row, delta)
    reply[n] = delta
  else
    if have == 0 and row ~= beyond then
      -- Counted beyond the bound, perhaps: taken from there, never below 0.
      row = beyond
      have = tonumber(redis.call('HGET', KEYS[1], row) or '0') or 0
    end
    local take = math.min(have, -delta)
    if take > 0 and take == have then
      redis.call('HDEL', KEYS[1], row)
    elseif take > 0 then
      redis.call('HINCRBY', KEYS[1], row, -take)
    end
    reply[n] = -take
  end
end
return reply
