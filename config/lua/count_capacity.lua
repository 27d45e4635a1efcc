--#include server_now.lua

-- Prunes workers whose heartbeat expired, batches whose worker is gone, batches older than
-- the lease (published but never started) and owners of batches no longer counted, then
-- counts what is left. Returns {live worker members, batches in flight}. Included by
-- capacity.lua and dispatch.lua.
local function count_capacity(workers, inflight, inflight_owners, lease_s)
  local now = server_now()
  redis.call('ZREMRANGEBYSCORE', workers, '-inf', now)
  for _, batch in ipairs(redis.call('ZRANGE', inflight, 0, -1)) do
    local owner = redis.call('HGET', inflight_owners, batch)
    if owner and not redis.call('ZSCORE', workers, owner) then
      redis.call('ZREM', inflight, batch)
      redis.call('HDEL', inflight_owners, batch)
    end
  end
  for _, batch in ipairs(redis.call('ZRANGEBYSCORE', inflight, '-inf', now - lease_s)) do
    redis.call('ZREM', inflight, batch)
    redis.call('HDEL', inflight_owners, batch)
  end
  for _, batch in ipairs(redis.call('HKEYS', inflight_owners)) do
    if not redis.call('ZSCORE', inflight, batch) then redis.call('HDEL', inflight_owners, batch) end
  end
  return {redis.call('ZRANGE', workers, 0, -1), redis.call('ZCARD', inflight)}
end
