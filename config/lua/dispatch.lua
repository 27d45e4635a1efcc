-- Records a batch as in flight, scored by its dispatch time (Redis server time).

local inflight = KEYS[1]

local batch_id = ARGV[1]

local t = redis.call('TIME')
return redis.call('ZADD', inflight, t[1] + t[2] / 1e6, batch_id)
