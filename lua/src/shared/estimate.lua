-- [shared/estimate.lua] The allowance, from estimates scaled by window_ms so that every
-- comparison is exact in integers (crates/fleet-budget/src/allowance.rs does the same
-- operations in the same order, so both floor to the same integer).
-- Needs: what shared/budget.lua sets. Sets: elapsed (ms into the current window), pw (the
-- previous window's weight: the part of it still inside the last window_ms, 0 in fixed mode),
-- allowance (0 while frozen).
local elapsed = now - i * window
if elapsed < 0 then elapsed = 0 end
if elapsed > window - 1 then elapsed = window - 1 end
local pw = 0
if sliding then pw = window - elapsed end
local deposits_sc = cur[d] * window + prev[d] * pw
local allowance = math.floor(eratio * deposits_sc / window)
if allowance < emin then allowance = emin end
if frozen == 1 then allowance = 0 end
