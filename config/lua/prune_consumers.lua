-- Forgets consumers (dead batchers, departed workers) that hold nothing and have been idle
-- past the lease; atomic, so a consumer that just took entries is never deleted with them.
-- Returns how many were removed.

local stream = KEYS[1]

local group = ARGV[1]
local min_idle_ms = tonumber(ARGV[2])
local own_consumer = ARGV[3]  -- the caller, never removed

local removed = 0
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local fields = {}
  for i = 1, #consumer, 2 do fields[consumer[i]] = consumer[i + 1] end
  if fields['pending'] == 0 and fields['idle'] > min_idle_ms and fields['name'] ~= own_consumer then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, fields['name'])
    removed = removed + 1
  end
end
return removed
