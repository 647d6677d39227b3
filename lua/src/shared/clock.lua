-- [shared/clock.lua] Server time, never the caller's clock: workers with skewed clocks share the
-- same windows. Read once per call (spend_batch.lua: once for all its entries, one instant).
-- Sets: now (server ms).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
