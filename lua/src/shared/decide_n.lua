-- [shared/decide_n.lua] Decides the n in order, as spend.lua would one after the other at this
-- instant: a grant while retries_est + 1 <= allowance (the allowance does not move within the
-- call). Grants count as retries, the rest as denials.
-- Needs: n, and what shared/estimate.lua sets. Sets: g (granted, 0..n), changed (the counters
-- that moved, for shared/save.lua).
local g = 0
local used = cur[3] * window + prev[3] * pw + window
while g < n and used <= allowance * window do
  g = g + 1
  used = used + window
end
cur[3] = cur[3] + g
cur[4] = cur[4] + (n - g)
local changed = {}
if g > 0 then changed = { 'cr', string.format('%d', cur[3]) } end
if g < n then
  changed[#changed + 1] = 'cd'
  changed[#changed + 1] = string.format('%d', cur[4])
end
