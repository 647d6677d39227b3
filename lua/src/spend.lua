-- fleet-budget spend: try to spend one retry from a dependency's budget (atomic, one round trip).
-- Contract: lua/README.md (key layout v1). Keep in step with crates/fleet-budget/src/allowance.rs.
--
-- KEYS[1]  budget hash, e.g. "fb:v1:{search}"
-- ARGV     window_ms, ratio, min_allowance, basis ("s" successes | "a" first attempts),
--          mode ("sliding" | "fixed"), then optionally (since 0.2.0) the caller's memory of the
--          hash: the birth it last saw ("" none) and fu,su,sr,sm,w,i,cs,ca,cr,cd,ps,pa,pr,pd
--          (lua/README.md, "Lost budgets")
-- Reply    {granted (1|0), allowance, window_index, window_ms, elapsed_ms, previous_weight_ms,
--           cur_successes, cur_first_attempts, cur_retries, cur_denied,
--           prev_successes, prev_first_attempts, prev_retries, prev_denied,
--           conflict, frozen, overridden, [ratio, min_allowance, basis, mode,] next_grant_ms}
--          (window_ms and the bracketed four, sent only on a conflict: the policy in force, which
--          may differ from ARGV; next_grant_ms, the last field: ms until one more spend could be
--          granted if nothing changed, 0 now, -1 never: lua/README.md, "Reply"), then, for a
--          caller that sent its memory: birth, fu, su, sr, sm, lost
local key_names = {'budget hash'}
-- @include keys_arg.lua
-- @include window_arg.lua
local at = 2
local propose = true
local mem = 6
-- @include clock.lua
-- @include budget.lua
-- @include restore.lua
-- @include estimate.lua

-- Decide and count: a grant is a retry, a refusal is a denial (never a retry). In scaled
-- integers: retries_est + 1 <= allowance.
local granted = 0
if cur[3] * window + prev[3] * pw + window <= allowance * window then
  granted = 1
  cur[3] = cur[3] + 1
else
  cur[4] = cur[4] + 1
end

-- Write the counter that changed (the whole hash when the window rolled, the key is new, or the
-- policy in force is new).
local changed
if granted == 1 then
  changed = { 'cr', string.format('%d', cur[3]) }
else
  changed = { 'cd', string.format('%d', cur[4]) }
end
-- @include save.lua
-- @include heard.lua
-- @include reply.lua
-- @include next_grant.lua
-- @include memory_reply.lua
reply[1] = granted
return reply
