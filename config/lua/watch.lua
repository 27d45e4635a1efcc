-- Registers a producer as waiting for the answers of some requests. Returns one reply per
-- request, in order: {'done', result} when its answer exists, {'unknown', ''} when it has no
-- record, else {'pending', ''}, having added the producer's inbox to the request's waiters
-- (waiters.lua: its record names them).
--#include waiters.lua

-- KEYS: REQUEST_KEYS per request: its result, its admission record.
local REQUEST_KEYS = 2
local RESULT_KEY, RECORD_KEY = 1, 2

local inbox = ARGV[1]

local replies = {}
for first = 0, #KEYS - REQUEST_KEYS, REQUEST_KEYS do
  local result = redis.call('GET', KEYS[first + RESULT_KEY])
  if result then
    table.insert(replies, {'done', result})
  else
    local record = redis.call('GET', KEYS[first + RECORD_KEY])
    if not record then
      table.insert(replies, {'unknown', ''})
    else
      local line = waiter_line(record, inbox)
      if line ~= '' then redis.call('APPEND', KEYS[first + RECORD_KEY], line) end
      table.insert(replies, {'pending', ''})
    end
  end
end
return replies
