-- Records a batch as in flight, scored by its dispatch time (Redis server time).
--#include server_now.lua

local inflight = KEYS[1]

local batch_id = ARGV[1]

return redis.call('ZADD', inflight, server_now(), batch_id)
