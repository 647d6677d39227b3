-- [shared/heard.lua] Records a caller whose policy differs from the one in force: the conflict
-- (xn: count, xp: its policy, xt: server ms). A caller that sent the policy in force refreshed
-- `h` in shared/save.lua's HSET.
if conflict == 1 and propose then
  redis.call('HINCRBY', key, 'xn', '1')
  redis.call('HSET', key, 'xp', ask, 'xt', string.format('%d', now))
end
