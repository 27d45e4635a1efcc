-- A worker process's device heartbeat: prunes device consumers whose heartbeat expired, then
-- adds or renews this one, scored by when it expires (Redis server time + ttl).
--#include server_now.lua

local live_devices = KEYS[1]

local device_consumer = ARGV[1]
local ttl_s = tonumber(ARGV[2])

local now = server_now()
redis.call('ZREMRANGEBYSCORE', live_devices, '-inf', now)
return redis.call('ZADD', live_devices, now + ttl_s, device_consumer)
