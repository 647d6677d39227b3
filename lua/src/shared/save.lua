-- [shared/save.lua] Writes the whole hash (after a roll, a new key or a new policy in force) and
-- expires it at the end of the next window, when these counters stop counting (or when the last
-- override ends, if later): a dependency idle for two windows has no key, and no counter lives
-- forever.
redis.call('HSET', KEYS[1], 'w', window, 'i', i, 'cs', cur[1], 'ca', cur[2], 'cr', cur[3],
  'cd', cur[4], 'ps', prev[1], 'pa', prev[2], 'pr', prev[3], 'pd', prev[4],
  'r', ratio_text, 'm', min_allowance, 'b', basis, 'o', mode)
local expire_at = (i + 2) * window
if fu > expire_at then expire_at = fu end
if su > expire_at then expire_at = su end
redis.call('PEXPIREAT', KEYS[1], expire_at)
