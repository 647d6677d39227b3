-- NOT a contract script: a probe for redis_bench section 1 (docs/BENCHMARKS.md, "1 task against
-- PING: what a new key layout would buy"). The least a single decision could cost if the
-- contract changed: the policy in force as one text field `p`, the nine counters (window index,
-- then current and previous successes, first attempts, retries, denials) packed into one binary
-- field `c`, and the reply packed into one binary string. Sliding mode and the success basis
-- only; no override, no conflict, no check of the arguments or of a stored field beyond the
-- packed field's length. Writes only fields `p`, `c` and `h` of KEYS[1].
-- ARGV: window_ms, ratio, min_allowance, basis, mode (as spend.lua).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local key = KEYS[1]
local pol = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5]
local h = redis.call('HMGET', key, 'p', 'c', 'fu', 'su')
local window = ARGV[1] + 0
local ratio = ARGV[2] + 0
local emin = ARGV[3] + 0
local i, cs, ca, cr, cd, ps, pa, pr, pd
local rolled = false
if h[1] == pol and not h[3] and not h[4] and h[2] and #h[2] == 72 then
  i, cs, ca, cr, cd, ps, pa, pr, pd = struct.unpack('<i8i8i8i8i8i8i8i8i8', h[2])
else
  i = math.floor(now / window); cs = 0; ca = 0; cr = 0; cd = 0; ps = 0; pa = 0; pr = 0; pd = 0
  rolled = true
end
local idx = math.floor(now / window)
if idx == i + 1 then
  ps = cs; pa = ca; pr = cr; pd = cd; cs = 0; ca = 0; cr = 0; cd = 0; i = idx; rolled = true
elseif idx > i then
  i = idx; cs = 0; ca = 0; cr = 0; cd = 0; ps = 0; pa = 0; pr = 0; pd = 0; rolled = true
end
local elapsed = now - i * window
if elapsed < 0 then elapsed = 0 end
if elapsed > window - 1 then elapsed = window - 1 end
local pw = window - elapsed
local allowance = math.floor(ratio * (cs * window + ps * pw) / window)
if allowance < emin then allowance = emin end
local granted = 0
if cr * window + pr * pw + window <= allowance * window then
  granted = 1; cr = cr + 1
else
  cd = cd + 1
end
redis.call('HSET', key, 'p', pol, 'c', struct.pack('<i8i8i8i8i8i8i8i8i8', i, cs, ca, cr, cd, ps, pa, pr, pd), 'h', now)
if rolled then redis.call('PEXPIREAT', key, (i + 2) * window) end
return struct.pack('<i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', granted, allowance, i, window, elapsed,
  pw, cs, ca, cr, cd, ps, pa, pr, pd, 0, 0, 0)
