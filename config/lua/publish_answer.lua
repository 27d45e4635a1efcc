-- Publishes a request's final answer, first write wins: stores the result unless one exists,
-- keeps the admission record as long as the result, pushes the result to the inbox of every
-- producer waiting for it and forgets the waiters. Included by finalize.lua and cancel.lua.
-- Returns true when this answer was written, false when the request had its answer already.
local function publish_answer(result_key, record_key, waiters_key, result, ttl_ms)
  if not redis.call('SET', result_key, result, 'NX', 'PX', ttl_ms) then return false end
  redis.call('PEXPIRE', record_key, ttl_ms)
  for _, inbox in ipairs(redis.call('SMEMBERS', waiters_key)) do
    redis.call('LPUSH', inbox, result)
    redis.call('PEXPIRE', inbox, ttl_ms)
  end
  redis.call('DEL', waiters_key)
  return true
end
