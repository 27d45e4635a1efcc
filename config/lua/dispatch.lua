-- Records a batch as in flight, scored by its dispatch time (Redis server time), and counts
-- it by flush reason in the model's stats.
--#include server_now.lua

local inflight = KEYS[1]
local stats = KEYS[2]

local batch_id = ARGV[1]
local reason_field = ARGV[2]  -- the stats field counting batches sent for this reason

redis.call('ZADD', inflight, server_now(), batch_id)
redis.call('HINCRBY', stats, reason_field, 1)
return 1
