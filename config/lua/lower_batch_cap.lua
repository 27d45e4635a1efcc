-- Lowers a model's batch cap, never raises it (workers may race). Returns the cap now set.

local cap_key = KEYS[1]

local new_cap = ARGV[1]

local cap = tonumber(redis.call('GET', cap_key) or '0')
if cap == 0 or tonumber(new_cap) < cap then redis.call('SET', cap_key, new_cap) end
return tonumber(redis.call('GET', cap_key))
