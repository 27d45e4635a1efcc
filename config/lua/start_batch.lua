-- Starts a batch's delivery on a worker: records which worker runs it (its death frees the
-- slot at once) and says which requests already have their final answer (an earlier delivery
-- wrote it). The worker moves the batch's stream entries to its consumer in the same round
-- trip, with an XCLAIM that returns them (ResultWriter.start_batch): Redis hands a command's
-- entries back at a fifth of what copying them through a script costs.
-- Returns one 1 (answered) or 0 per result key, in order.

local inflight_owners = KEYS[1]
-- Then the result key of each request.
local HEADER_KEYS = 1

local batch_id = ARGV[1]
local member = ARGV[2]  -- the worker's heartbeat member

redis.call('HSET', inflight_owners, batch_id, member)
local answered = {}
for n = HEADER_KEYS + 1, #KEYS do
  answered[n - HEADER_KEYS] = redis.call('EXISTS', KEYS[n])
end
return answered
