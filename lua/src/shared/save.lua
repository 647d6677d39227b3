-- [shared/save.lua] Writes the whole hash (after a roll, or for a new key) and expires it at the
-- end of the next window, when these counters stop counting: a dependency idle for two windows
-- has no key, and no counter lives forever.
redis.call('HSET', KEYS[1], 'w', window, 'i', i, 'cs', cur[1], 'ca', cur[2], 'cr', cur[3],
  'cd', cur[4], 'ps', prev[1], 'pa', prev[2], 'pr', prev[3], 'pd', prev[4])
redis.call('PEXPIREAT', KEYS[1], (i + 2) * window)
