-- [shared/window_arg.lua] ARGV[1], the window length in ms: a positive integer, at most one day
-- (86400000: the configuration's bound). inf, 1e300 or nan never reach PEXPIREAT: a key
-- without an expiry is never made by accident (only while an operator's override is in force).
-- Sets: window.
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 86400000 or window ~= math.floor(window) then
  return redis.error_reply('fleet-budget: ARGV[1] window_ms must be a positive integer, at most 86400000 (one day)')
end
