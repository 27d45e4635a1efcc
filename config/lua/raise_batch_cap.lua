-- Raises a model's batch cap only if nobody lowered it meanwhile. Returns 1 when raised,
-- else 0.

local cap_key = KEYS[1]

local computed_from = ARGV[1]  -- the cap the raise was computed from
local raised_cap = ARGV[2]  -- '' to drop the cap (back at max_batch_size)

if redis.call('GET', cap_key) ~= computed_from then return 0 end
if raised_cap == '' then redis.call('DEL', cap_key) else redis.call('SET', cap_key, raised_cap) end
return 1
