-- The keys the script needs, named in `key_names` in order: a call that passes fewer gets an
-- error naming the first one missing, never Lua's own error about a nil value.
for k = 1, #key_names do
  if KEYS[k] == nil then
    return redis.error_reply('fleet-budget: KEYS[' .. k .. '] ' .. key_names[k] .. ' is missing (the call passed ' .. #KEYS .. ' keys)')
  end
end
