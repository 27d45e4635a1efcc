-- Registers a producer as waiting for the answers of some requests. Returns one reply per
-- request, in order: its result when its answer exists, 0 when it has no record (unknown),
-- else 1 (pending), having added the producer's inbox to the request's waiters (waiters.lua:
-- its record names them). A flat list: a pair a request cost Redis a table and the caller a
-- list to decode.
--#include waiters.lua

-- KEYS: REQUEST_KEYS per request: its result, its admission record.
local REQUEST_KEYS = 2
local RESULT_KEY, RECORD_KEY = 1, 2
local UNKNOWN, PENDING = 0, 1

local inbox = ARGV[1]

local replies = {}
for n = 1, #KEYS / REQUEST_KEYS do
  local k = (n - 1) * REQUEST_KEYS
  local result = redis.call('GET', KEYS[k + RESULT_KEY])
  if result then
    replies[n] = result
  else
    local record = redis.call('GET', KEYS[k + RECORD_KEY])
    if not record then
      replies[n] = UNKNOWN
    else
      local line = waiter_line(record, inbox)
      if line ~= '' then redis.call('APPEND', KEYS[k + RECORD_KEY], line) end
      replies[n] = PENDING
    end
  end
end
return replies
