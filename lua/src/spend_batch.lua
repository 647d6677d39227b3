-- fleet-budget spend_batch: the requests of several budgets decided in one atomic call (group
-- commit across dependencies on one Redis node). Entry j is decided exactly as a spend_many.lua
-- call with KEYS[j] and its six arguments would decide it, the entries in order, so the answer
-- is what the spend.lua calls of every entry, one after the other at that instant, would give.
-- Contract: lua/README.md (key layout v1).
--
-- KEYS     the budget hash of each entry, 1 to 10000 of them (on Redis Cluster: all in one slot).
--          A key may come twice (two policies for one budget): its entries run in order.
-- ARGV     six per entry, entry j's from 6j - 5: window_ms, n (1 to 10000; at most 10000 over
--          all entries), ratio, min_allowance, basis ("s" | "a"), mode ("sliding" | "fixed");
--          or eight per entry (since 0.2.0), entry j's from 8j - 7: the six, then the caller's
--          memory of the hash as spend_many.lua's ARGV 7 and 8
-- Reply    one element per entry, in order: spend_many.lua's reply for it, or, when spend_many.lua
--          would have replied an error for it, that error's text (a string, not an array). An
--          entry's error writes nothing of it and does not stop the others.
-- Six arguments per entry, or (since 0.2.0) eight: spend_many.lua's six and the caller's memory
-- of the hash (its ARGV 7 and 8, lua/README.md, "Lost budgets").
local per = 6
if #KEYS >= 1 and #ARGV == 8 * #KEYS then per = 8 end
if #KEYS < 1 or #KEYS > 10000 or #ARGV ~= per * #KEYS then
  return redis.error_reply('fleet-budget: spend_batch takes 1 to 10000 keys and 6 arguments per key (8 with memory)')
end
-- At most 10000 decisions in all (one call holds the server while it runs); an entry whose n
-- is not a valid count is refused on its own below and does not count here.
local total = 0
for j = 1, #KEYS do
  local nj = ARGV[per * j - per + 2]
  if string.match(nj, '^%d+$') and #nj <= 5 and tonumber(nj) <= 10000 then
    total = total + tonumber(nj)
  end
end
if total > 10000 then
  return redis.error_reply('fleet-budget: spend_batch decides at most 10000 requests in all')
end
-- @include clock.lua
local function spend_many(KEYS, ARGV)
  -- @include window_arg.lua
  -- @include n_arg.lua
  local at = 3
  local propose = true
  local mem = 7
  -- @include budget.lua
  -- @include restore.lua
  -- @include estimate.lua
  -- @include decide_n.lua
  -- @include save.lua
  -- @include heard.lua
  -- @include conflicts_n.lua
  -- @include reply.lua
  -- @include next_grant.lua
  -- @include memory_reply.lua
  reply[1] = g
  return reply
end
local replies = {}
for j = 1, #KEYS do
  local a = per * j - per
  local args = { ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6] }
  if per == 8 then args[7] = ARGV[a + 7]; args[8] = ARGV[a + 8] end
  local r = spend_many({ KEYS[j] }, args)
  if r.err then r = r.err end
  replies[j] = r
end
return replies
