-- [shared/n_arg.lua] ARGV[2], how many requests to decide: a plain integer from 1 to 10000.
-- Sets: n.
if not string.match(ARGV[2] or '', '^%d+$') or #ARGV[2] > 5 then
  return redis.error_reply('fleet-budget: ARGV[2] n must be an integer from 1 to 10000')
end
local n = tonumber(ARGV[2])
if n < 1 or n > 10000 then
  return redis.error_reply('fleet-budget: ARGV[2] n must be an integer from 1 to 10000')
end
