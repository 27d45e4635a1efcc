-- Records a batch as in flight, scored by its dispatch time (Redis server time), and counts
-- it by flush reason in the model's stats. Given the batch's Celery message, also pushes it
-- onto the batch queue, as kombu's Redis transport does (workers/protocol/task_message.py):
-- the batch is sent in the round trip that records it. Returns the capacity left
-- (count_capacity.lua), which the batcher's next decision uses instead of asking again; the
-- slot-free wake-ups pushed so far are counted in it, and deleted, so that a batcher waiting
-- for a slot is woken by a slot freed after this count, not by one this batch took.
-- Given a room rule (ARGV[5], ARGV[6]), the batch is a full one that waited for room: it is
-- sent only if the capacity counted first has room for it, as the batcher's policy counts
-- room for a full batch (free slots, plus the full batches each live worker may hold beyond
-- its slots), and the reply says whether it was: {members, in flight, 1 or 0}.
--#include count_capacity.lua

local workers = KEYS[1]
local inflight = KEYS[2]
local inflight_owners = KEYS[3]
local stats = KEYS[4]
local slot_free = KEYS[5]
local batch_queue = KEYS[6]  -- only with a message: the model's Celery queue

local lease_s = tonumber(ARGV[1])
local batch_id = ARGV[2]
local reason_field = ARGV[3]  -- the stats field counting batches sent for this reason
local message = ARGV[4]  -- the batch's Celery message, or none: the batcher sends it itself
local batches_per_slot = tonumber(ARGV[5])  -- with the room rule: batches a worker slot takes
local full_ahead = tonumber(ARGV[6])  -- and full batches a live worker may hold beyond them

local counted = nil
if batches_per_slot then
  counted = count_capacity(workers, inflight, inflight_owners, lease_s)
  local members, slots = counted[1], 0
  for _, member in ipairs(members) do
    slots = slots + (tonumber(string.match(member, '|(%d+)$')) or 1)
  end
  if slots * batches_per_slot - counted[2] + #members * full_ahead <= 0 then
    return {members, counted[2], 0}
  end
end
redis.call('ZADD', inflight, server_now(), batch_id)
redis.call('HINCRBY', stats, reason_field, 1)
if message then
  redis.call('LPUSH', batch_queue, message)
end
redis.call('DEL', slot_free)
if counted then return {counted[1], counted[2] + 1, 1} end  -- pruned already
return count_capacity(workers, inflight, inflight_owners, lease_s)
