-- Ends a request 'cancelled' unless it has its final answer: its stream entry (if it is
-- queued) is deleted and acknowledged, so a request no batcher has read yet never runs, one a
-- batcher or a waiting batch holds is skipped when its batch starts (a batch claims only the
-- entries still in the stream: ResultWriter.start_batch), and no one reclaims it; one on a
-- device now runs on, and its output is discarded (first answer wins).
-- The caller reads the admission record first and passes what it read: the script acts only
-- if the record still holds exactly that.
-- Returns 'unknown' (no record), 'changed' (the record is not what the caller read: read it
-- again), 'final' (it had its answer) or 'cancelled'.
--#include publish_answer.lua

local record_key = KEYS[1]
local result_key = KEYS[2]
local stats = KEYS[3]
local stream = KEYS[4]
local attempts = KEYS[5]

local record_read = ARGV[1]
local result = ARGV[2]  -- the cancelled result's JSON
local ttl_ms = tonumber(ARGV[3])
local group = ARGV[4]
local entry = ARGV[5]  -- the request's stream entry; '' when it has none
local cancelled_field = ARGV[6]  -- the stats field counting a cancelled request

local record = redis.call('GET', record_key)
if not record then return 'unknown' end
if record ~= record_read then return 'changed' end
local inboxes = publish_answer(result_key, record_key, record, result, ttl_ms)
if not inboxes then return 'final' end
local pushes = {}
add_pushes(pushes, inboxes, result, ttl_ms)
push_answers(pushes)
if entry == '' then return 'cancelled' end
redis.call('HINCRBY', stats, cancelled_field, 1)
redis.call('XACK', stream, group, entry)
redis.call('XDEL', stream, entry)
redis.call('HDEL', attempts, entry)
return 'cancelled'
