-- Starts a batch's delivery on a worker: records which worker runs it (its death frees the
-- slot at once), moves its stream entries to the worker's consumer (restarting their lease:
-- a running batch is never reclaimed while it can still finish) and says which requests
-- already have their final answer (an earlier delivery wrote it).
-- Returns one 1 (answered) or 0 per result key, in order.

local inflight_owners = KEYS[1]
local stream = KEYS[2]
-- Then the result key of each request.
local HEADER_KEYS = 2

local batch_id = ARGV[1]
local member = ARGV[2]  -- the worker's heartbeat member
local group = ARGV[3]
local consumer = ARGV[4]
-- Then the batch's stream entry ids.
local HEADER_ARGS = 4

redis.call('HSET', inflight_owners, batch_id, member)
local CHUNK = 1000  -- values per command: Lua's stack holds a few thousand
for first = HEADER_ARGS + 1, #ARGV, CHUNK do
  local claim = {'XCLAIM', stream, group, consumer, 0}
  for n = first, math.min(first + CHUNK - 1, #ARGV) do table.insert(claim, ARGV[n]) end
  table.insert(claim, 'JUSTID')
  redis.call(unpack(claim))
end
local answered = {}
for n = HEADER_KEYS + 1, #KEYS do
  answered[n - HEADER_KEYS] = redis.call('EXISTS', KEYS[n])
end
return answered
