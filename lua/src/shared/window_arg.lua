-- [shared/window_arg.lua] ARGV[1], the window length in ms: a positive integer.
-- Sets: window.
local window = tonumber(ARGV[1])
if not window or window < 1 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer')
end
