-- [shared/heard.lua] Records who the caller agrees with: the time the policy in force was last
-- sent (h), or, for a caller whose policy differs, the conflict (xn: count, xp: its policy,
-- xt: server ms).
if heard then
  redis.call('HSET', KEYS[1], 'h', now)
elseif conflict == 1 and propose then
  redis.call('HINCRBY', KEYS[1], 'xn', 1)
  redis.call('HSET', KEYS[1], 'xp', ask, 'xt', now)
end
