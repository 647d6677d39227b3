-- [shared/save.lua] Writes what the call changed, in one HSET (each redis.call costs server CPU:
-- a call within a window is TIME, HMGET and this HSET). After a roll (a new window, a new key or
-- a new policy in force) that is the whole hash, expired at the end of the next window, when
-- these counters stop counting (or when the last override ends, if later): a dependency idle for
-- two windows has no key, and no counter lives forever. Otherwise it is the field/value pairs
-- the script put in `changed` (the counters it moved, set to their new values: the script read
-- them in this same atomic call). With either, `h` (now) when the caller sent the policy in
-- force (heard).
-- Needs: changed, extra (shared/restore.lua: the birth, a restored override), and what
-- shared/budget.lua sets. While an override is in force the hash has no expiry (PERSIST).
if rolled then
  changed = { 'w', window, 'i', i, 'cs', cur[1], 'ca', cur[2], 'cr', cur[3], 'cd', cur[4],
    'ps', prev[1], 'pa', prev[2], 'pr', prev[3], 'pd', prev[4],
    'r', ratio_text, 'm', min_allowance, 'b', basis, 'o', mode }
end
if heard then
  changed[#changed + 1] = 'h'
  changed[#changed + 1] = string.format('%d', now)
end
for k = 1, #extra do changed[#changed + 1] = extra[k] end
if #changed > 0 then
  redis.call('HSET', key, unpack(changed))
end
if rolled then
  if fu > now or su > now then
    -- An operator's override in force: no expiry at all, so that a volatile-* maxmemory-policy
    -- (which evicts only keys with one) cannot take it. The first roll after it ends (or
    -- override.lua's unfreeze or clear) sets the expiry again.
    redis.call('PERSIST', key)
  else
    local expire_at = (i + 2) * window
    if fu > expire_at then expire_at = fu end
    if su > expire_at then expire_at = su end
    redis.call('PEXPIREAT', key, expire_at)
  end
end
