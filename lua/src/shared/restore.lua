-- [shared/restore.lua] A budget hash lost mid-window (evicted under an allkeys-* or volatile-*
-- maxmemory-policy, FLUSHALL, a restart without persistence) is detected and restored from what
-- the caller remembers of it (lua/README.md, "Lost budgets"). Optional: a caller that sends no
-- memory (every caller before 0.2.0) is served exactly as before.
-- Needs: `mem` (the ARGV index of the remembered birth, the remembered state at mem + 1; ARGV[mem]
-- absent: no memory), and what shared/budget.lua sets. Sets: lost (1 when the hash the caller
-- remembers is gone while what it remembered still counts: an override in force, or counters of
-- this window or the last one), extra (field/value pairs shared/save.lua writes: the birth when the
-- hash has none, the restored override's fields); may raise fu, su, frozen, overridden, eratio,
-- emin and the counters (never lower them), and sets rolled when it restored anything.
local lost = 0
local extra = {}
local seen_birth = ARGV[mem]
if seen_birth then
  if #seen_birth > 18 or not string.find(seen_birth, '^%d*$') then
    return redis.error_reply('fleet-budget: ARGV[' .. mem .. '] birth must be empty or an integer of at most 18 digits')
  end
  -- A birth that is not one (written by hand) is none: this call writes a new one.
  if birth and (#birth > 18 or not string.find(birth, '^%d+$')) then birth = false end
  if seen_birth ~= '' and seen_birth ~= birth then
    -- The hash is not the one the caller saw. Its memory: fu,su,sr,sm,w,i, then the counters
    -- cs,ca,cr,cd,ps,pa,pr,pd of window i (14 fields; sr and sm may be empty).
    local text = ARGV[mem + 1] or ''
    local m = {}
    if #text <= 400 then
      for v in string.gmatch(text .. ',', '([^,]*),') do m[#m + 1] = v end
    end
    local ok = #m == 14
    for k = 1, 14 do
      if not ok then break end
      local v = m[k]
      if k == 3 then
        local x = tonumber(v)
        ok = v == '' or (x and x == x and x >= 0 and x <= 1000 and #v <= 32)
      elseif k == 4 then
        ok = v == '' or (#v <= 10 and string.find(v, '^%d+$'))
      else
        ok = #v <= 18 and string.find(v, '^%d+$')
        if ok then m[k] = v + 0 end
      end
    end
    if not ok then
      return redis.error_reply('fleet-budget: ARGV[' .. (mem + 1) .. '] memory must be 14 comma-separated fields: fu,su,sr,sm,w,i,cs,ca,cr,cd,ps,pa,pr,pd')
    end
    -- An override the caller saw, still in force, comes back (unless one in force now ends later).
    if m[1] > now then
      lost = 1
      if m[1] > fu then
        fu = m[1]; frozen = 1; rolled = true
        for _, v in ipairs({ 'fu', string.format('%d', fu), 'fa', 'fleet-budget (restored)',
            'fy', 'restored from a worker: the budget hash was lost', 'ft', string.format('%d', now) }) do
          extra[#extra + 1] = v
        end
      end
    end
    if m[2] > now then
      lost = 1
      if su <= now then
        su = m[2]; rolled = true
        for _, v in ipairs({ 'su', string.format('%d', su), 'sa', 'fleet-budget (restored)',
            'sy', 'restored from a worker: the budget hash was lost', 'st', string.format('%d', now) }) do
          extra[#extra + 1] = v
        end
        if m[3] ~= '' then
          overridden = 1; eratio = tonumber(m[3])
          extra[#extra + 1] = 'sr'; extra[#extra + 1] = m[3]
        end
        if m[4] ~= '' then
          overridden = 1; emin = tonumber(m[4])
          extra[#extra + 1] = 'sm'; extra[#extra + 1] = m[4]
        end
      end
    end
    -- Counters the caller saw, of this window or the last (same window length): each is raised
    -- to what the caller saw, never lowered (what the caller saw had been counted).
    if m[5] == window and (m[6] == i or m[6] == i - 1) then
      local seen_cur = { m[7], m[8], m[9], m[10] }
      local seen_prev = { m[11], m[12], m[13], m[14] }
      local into_cur, into_prev = nil, nil
      if m[6] == i then into_cur = seen_cur; into_prev = seen_prev else into_prev = seen_cur end
      for k = 1, 4 do
        if into_cur and into_cur[k] > 0 then
          lost = 1
          if into_cur[k] > cur[k] then cur[k] = into_cur[k]; rolled = true end
        end
        if into_prev[k] > 0 then
          lost = 1
          if into_prev[k] > prev[k] then prev[k] = into_prev[k]; rolled = true end
        end
      end
    end
  end
end
if not birth then
  birth = string.format('%d', now)
  extra[#extra + 1] = 'e'; extra[#extra + 1] = birth
end
