-- Writes a request's final answer and closes its stream entry: the answer is published (first
-- write wins) only while the request's admission record still holds the same digest, so a
-- late duplicate execution can neither overwrite an answer nor bring back an expired one; a
-- written answer is counted in the model's stats. The entry is acked, deleted and its
-- attempts forgotten whatever the answer's fate.
-- Returns 'written', 'duplicate' (the request had its answer) or 'stale' (the record is gone
-- or holds another input).
--#include publish_answer.lua

local result_key = KEYS[1]
local record_key = KEYS[2]
local waiters_key = KEYS[3]
local stream = KEYS[4]
local attempts = KEYS[5]
local stats = KEYS[6]

local result = ARGV[1]
local digest = ARGV[2]  -- '' writes whatever the record holds
local ttl_ms = ARGV[3]
local group = ARGV[4]
local entry = ARGV[5]  -- '' when the answer closes no entry
local answer_field = ARGV[6]  -- the stats field counting this answer

local status
local record = redis.call('GET', record_key)
if digest ~= '' and (not record or string.sub(record, 1, #digest) ~= digest) then
  status = 'stale'
elseif publish_answer(result_key, record_key, waiters_key, result, ttl_ms) then
  redis.call('HINCRBY', stats, answer_field, 1)
  status = 'written'
else
  status = 'duplicate'
end
if entry ~= '' then
  redis.call('XACK', stream, group, entry)
  redis.call('XDEL', stream, entry)
  redis.call('HDEL', attempts, entry)
end
return status
