-- A worker's heartbeat in its model's workers zset: adds or renews its member, scored by when
-- it expires (Redis server time + ttl), or removes it. Returns ZADD's or ZREM's reply.
--#include server_now.lua

local workers = KEYS[1]

local member = ARGV[1]
local ttl_s = tonumber(ARGV[2])
local action = ARGV[3]  -- '' to add or renew, 'remove' to leave

if action == 'remove' then return redis.call('ZREM', workers, member) end
return redis.call('ZADD', workers, server_now() + ttl_s, member)
