-- [shared/reply.lua] The reply every script starts with (lua/README.md, "Reply"); the script
-- sets reply[1] (granted, or -1) and may append.
local reply = { -1, allowance, i, window, elapsed, pw,
  cur[1], cur[2], cur[3], cur[4], prev[1], prev[2], prev[3], prev[4],
  conflict, frozen, overridden, ratio_text, min_allowance, basis, mode }
