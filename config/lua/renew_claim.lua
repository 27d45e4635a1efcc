-- Renews a GPU claim if this owner holds it or nobody does; returns 1, or 0 when another
-- owner took it.

local claim = KEYS[1]

local owner = ARGV[1]
local ttl_ms = ARGV[2]

local holder = redis.call('GET', claim)
if holder and holder ~= owner then return 0 end
redis.call('SET', claim, owner, 'PX', ttl_ms)
return 1
