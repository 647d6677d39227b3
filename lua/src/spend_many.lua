-- fleet-budget spend_many: n requests for one retry each from a dependency's budget, decided
-- together in one atomic call (group commit). The answer is what n calls of spend.lua at the
-- same instant would give: the first g are granted (counted as retries), the rest denied
-- (counted as denials). Contract: lua/README.md (key layout v1).
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, n (1 to 10000), ratio, min_allowance, basis ("s" | "a"),
--          mode ("sliding" | "fixed"), then optionally (since 0.2.0) the caller's memory as in
--          spend.lua (ARGV 7 and 8)
-- Reply    {g (granted, 0..n), allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, [ratio, min_allowance, basis, mode,] next_grant_ms}
--          (as spend.lua's; next_grant_ms after all n) with the counters as they are after all n: request k (1-based) saw cur_retries -
--          g + min(k, g) and cur_denied - (n - g) + max(0, k - g).
local key_names = {'budget hash'}
-- @include keys_arg.lua
-- @include window_arg.lua
-- @include n_arg.lua
local at = 3
local propose = true
local mem = 7
-- @include clock.lua
-- @include budget.lua
-- @include restore.lua
-- @include estimate.lua
-- @include decide_n.lua
-- @include save.lua
-- @include heard.lua
-- @include conflicts_n.lua
-- @include reply.lua
-- @include next_grant.lua
-- @include memory_reply.lua
reply[1] = g
return reply
