-- Registers a producer as waiting for the answers of some requests. Returns one reply per
-- request, in order: {'done', result} when its answer exists, {'unknown', ''} when it has no
-- record, else {'pending', ''}, having added the producer's inbox to the request's waiters
-- (kept as long as the record).

-- KEYS: REQUEST_KEYS per request: its result, its admission record, its waiters.
local REQUEST_KEYS = 3
local RESULT_KEY, RECORD_KEY, WAITERS_KEY = 1, 2, 3

local inbox = ARGV[1]

local replies = {}
for first = 0, #KEYS - REQUEST_KEYS, REQUEST_KEYS do
  local result = redis.call('GET', KEYS[first + RESULT_KEY])
  if result then
    table.insert(replies, {'done', result})
  else
    local ttl = redis.call('PTTL', KEYS[first + RECORD_KEY])
    if ttl < 0 then
      table.insert(replies, {'unknown', ''})
    else
      redis.call('SADD', KEYS[first + WAITERS_KEY], inbox)
      redis.call('PEXPIRE', KEYS[first + WAITERS_KEY], ttl)
      table.insert(replies, {'pending', ''})
    end
  end
end
return replies
