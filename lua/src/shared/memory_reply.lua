-- [shared/memory_reply.lua] For a caller that sent its memory (shared/restore.lua), six fields
-- after the reply as it was, so that it remembers this hash: its birth, the freeze's end (fu, 0
-- none), the set override's end (su, 0 none), its ratio and floor (text, "" when absent or no set
-- override is in force), and lost (1 when this call found the hash the caller remembered gone).
-- A caller without memory gets the reply it always got.
if seen_birth then
  local sr_text, sm_text = '', ''
  if su > now then
    local s = redis.call('HMGET', key, 'sr', 'sm')
    sr_text = s[1] or ''; sm_text = s[2] or ''
  end
  local n_reply = #reply
  reply[n_reply + 1] = tonumber(birth)
  reply[n_reply + 2] = fu
  reply[n_reply + 3] = su
  reply[n_reply + 4] = sr_text
  reply[n_reply + 5] = sm_text
  reply[n_reply + 6] = lost
end
