-- Records a batch as in flight, scored by its dispatch time (Redis server time), and counts
-- it by flush reason in the model's stats. Returns the capacity left (count_capacity.lua),
-- which the batcher's next decision uses instead of asking again.
--#include count_capacity.lua

local workers = KEYS[1]
local inflight = KEYS[2]
local inflight_owners = KEYS[3]
local stats = KEYS[4]

local lease_s = tonumber(ARGV[1])
local batch_id = ARGV[2]
local reason_field = ARGV[3]  -- the stats field counting batches sent for this reason

redis.call('ZADD', inflight, server_now(), batch_id)
redis.call('HINCRBY', stats, reason_field, 1)
return count_capacity(workers, inflight, inflight_owners, lease_s)
