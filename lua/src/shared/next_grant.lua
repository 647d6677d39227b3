-- [shared/next_grant.lua] Appends to the reply the ms from this call's instant until one more
-- spend could be granted if nothing changed meanwhile (no deposit, spend, override or policy
-- change): 0 when one would be granted now, -1 when none ever would (a floor of 0 and no
-- deposits). Deposits only decay when none come, so the allowance can only fall: the wait is
-- the first ms at which the retries estimate, decaying and rolling, fits the allowance as it is
-- now (exact while the allowance holds, e.g. at its floor; never later than the true instant).
-- While frozen, the freeze's end; while a set override is in force, at most until it ends.
-- crates/fleet-budget/src/allowance.rs (`next_grant_in_ms`) computes the same.
-- Needs: what shared/estimate.lua sets, the counters after the decision, fu, su, reply.
local wait = -1
local nc, np = cur[3], prev[3]
if frozen == 1 then
  wait = fu - now
elseif nc * window + np * pw + window <= allowance * window then
  wait = 0
elseif allowance >= 1 then
  local k = allowance - 1
  -- This window: the previous one's weight (pw) falls 1 per ms, and with it its retries.
  if pw > 0 and np > 0 and k >= nc then
    local a = (k - nc) * window
    local y = math.floor(a / np)
    if y * np > a then y = y - 1 end
    if y >= 1 then wait = window - y - elapsed end
  end
  if wait < 0 then
    if pw == 0 or nc <= k then
      wait = window - elapsed -- the next window, from its start
    else
      -- The next window, where this one's retries decay in turn; else the one after (empty).
      local a = k * window
      local y = math.floor(a / nc)
      if y * nc > a then y = y - 1 end
      if y >= 1 then wait = 2 * window - y - elapsed else wait = 2 * window - elapsed end
    end
  end
end
if overridden == 1 and frozen == 0 and (wait < 0 or su - now < wait) then wait = su - now end
reply[#reply + 1] = wait
