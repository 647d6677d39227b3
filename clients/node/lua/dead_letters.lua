-- GENERATED from lua/src/dead_letters.lua and the parts it includes from lua/src/shared:
-- edit those, then run scripts/gen-lua
-- fleet-budget dead letters: the index of what waits in a dead-letter or parked queue, counted
-- when a copy is confirmed there and when one leaves (replayed, parked, purged), so that looking
-- at the queue never reads it. Atomic, one round trip for a batch of changes. Not part of any
-- decision. Contract: lua/README.md, "Dead-letter index".
--
-- KEYS[1]  the queue's index (HASH row -> count), e.g. "fb:v1:dead-letters:{fleet.dead}"
-- ARGV     max_rows (integer, 1 to 100000), then pairs: row (1-2048 bytes, opaque here: the
--          callers' JSON array), delta (a non-zero integer, -1000000 to 1000000)
-- Reply    one integer per pair, the change applied. An increase is applied whole: to its row,
--          or, when that row is new and the index already holds max_rows rows, to the row "[]"
--          (counts beyond the bound: a producer's hostile error classes cannot grow the hash
--          without bound). A decrease never takes a count below 0 (a row at 0 is removed): it
--          applies to its row, else to "[]", else to nothing (a message never counted:
--          dead-lettered while Redis was unreachable, or by the broker itself), and replies
--          what it took (0 to delta).
-- Errors   a bad argument (named) or a key of another type; either writes nothing.
local max_rows = tonumber(ARGV[1])
if not max_rows or max_rows < 1 or max_rows > 100000 or max_rows ~= math.floor(max_rows) then
  return redis.error_reply('fleet-budget: ARGV[1] max_rows must be an integer from 1 to 100000')
end
if #ARGV < 3 or #ARGV % 2 ~= 1 then
  return redis.error_reply('fleet-budget: ARGV must be max_rows, then row and delta pairs')
end
local deltas = {}
for i = 2, #ARGV, 2 do
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
local beyond = '[]'
local reply = {}
for n = 1, #deltas do
  local row, delta = ARGV[2 * n], deltas[n]
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
