-- A worker's heartbeat in its model's workers zset: adds or renews its member, scored by when
-- it expires (Redis server time + ttl), or removes it. Returns ZADD's or ZREM's reply.

local workers = KEYS[1]

local member = ARGV[1]
local ttl_s = tonumber(ARGV[2])
local action = ARGV[3]  -- '' to add or renew, 'remove' to leave

if action == 'remove' then return redis.call('ZREM', workers, member) end
local now = redis.call('TIME')
return redis.call('ZADD', workers, now[1] + now[2] / 1e6 + ttl_s, member)
