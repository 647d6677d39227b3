-- [shared/reply.lua] The reply every script starts with (lua/README.md, "Reply"); the script
-- sets reply[1] (granted, or -1) and may append. The policy in force (fields 18 to 21) is sent
-- only when it is not the caller's (a conflict): otherwise the caller has it already, and every
-- field of a reply costs server CPU.
local reply = { -1, allowance, i, window, elapsed, pw,
  cur[1], cur[2], cur[3], cur[4], prev[1], prev[2], prev[3], prev[4],
  conflict, frozen, overridden }
if conflict == 1 then
  reply[18] = ratio_text; reply[19] = min_allowance; reply[20] = basis; reply[21] = mode
end
