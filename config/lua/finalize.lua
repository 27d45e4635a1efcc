-- Writes the final answers of a batch's requests and closes their stream entries: each answer
-- is published (first write wins) only while its request's admission record still holds the
-- same digest, so a late duplicate execution can neither overwrite an answer nor bring back
-- an expired one; written answers are counted in the model's stats and pushed to their
-- waiters, one LPUSH per inbox. Every entry named is acked, deleted and its attempts
-- forgotten whatever its answer's fate.
-- Returns one status per answer, in order: 'written', 'duplicate' (the request had its
-- answer) or 'stale' (the record is gone or holds another input).
--#include publish_answer.lua

local stream = KEYS[1]
local attempts = KEYS[2]
local stats = KEYS[3]
-- Then ANSWER_KEYS keys per answer: its result, its admission record, its waiters.
local HEADER_KEYS, ANSWER_KEYS = 3, 3
local RESULT_KEY, RECORD_KEY, WAITERS_KEY = 1, 2, 3

local group = ARGV[1]
-- Then ANSWER_ARGS args per answer: the result JSON, the digest ('' writes whatever the
-- record holds), the result's TTL (ms), the stream entry it closes ('' for none), the stats
-- field counting it.
local HEADER_ARGS, ANSWER_ARGS = 1, 5
local RESULT, DIGEST, TTL_MS, ENTRY, ANSWER_FIELD = 1, 2, 3, 4, 5

local function key(n, which) return KEYS[HEADER_KEYS + (n - 1) * ANSWER_KEYS + which] end
local function arg(n, which) return ARGV[HEADER_ARGS + (n - 1) * ANSWER_ARGS + which] end
local answers = (#KEYS - HEADER_KEYS) / ANSWER_KEYS

local statuses, counts, entries, pushes = {}, {}, {}, {}
for n = 1, answers do
  local digest = arg(n, DIGEST)
  local record = redis.call('GET', key(n, RECORD_KEY))
  local inboxes = false
  if digest ~= '' and (not record or string.sub(record, 1, #digest) ~= digest) then
    statuses[n] = 'stale'
  else
    local result, ttl_ms = arg(n, RESULT), arg(n, TTL_MS)
    inboxes = publish_answer(key(n, RESULT_KEY), key(n, RECORD_KEY), key(n, WAITERS_KEY), result, ttl_ms)
    if inboxes then
      statuses[n] = 'written'
      counts[arg(n, ANSWER_FIELD)] = (counts[arg(n, ANSWER_FIELD)] or 0) + 1
      add_pushes(pushes, inboxes, result, ttl_ms)
    else
      statuses[n] = 'duplicate'
    end
  end
  if arg(n, ENTRY) ~= '' then table.insert(entries, arg(n, ENTRY)) end
end

push_answers(pushes)
for field, count in pairs(counts) do redis.call('HINCRBY', stats, field, count) end
local ENTRY_CHUNK = 1000  -- entries per command: Lua's stack holds a few thousand
for first = 1, #entries, ENTRY_CHUNK do
  local last = math.min(first + ENTRY_CHUNK - 1, #entries)
  redis.call('XACK', stream, group, unpack(entries, first, last))
  redis.call('XDEL', stream, unpack(entries, first, last))
  redis.call('HDEL', attempts, unpack(entries, first, last))
end
return statuses
