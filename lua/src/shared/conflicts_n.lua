-- [shared/conflicts_n.lua] n calls of spend.lua would each have counted a conflict: after
-- shared/heard.lua's one, the other n - 1.
if conflict == 1 and n > 1 then
  redis.call('HINCRBY', key, 'xn', n - 1)
end
