-- Writes the final answers of a batch's requests and closes their stream entries: each answer
-- is published (first write wins) only while its request's admission record still holds the
-- same digest, so a late duplicate execution can neither overwrite an answer nor bring back
-- an expired one; written answers are counted in the model's stats, pushed to their
-- waiters, one LPUSH per inbox, and their latency samples kept in the model's capped list of
-- recent ones. Every entry named is acked, deleted and its attempts forgotten whatever its
-- answer's fate.
-- Returns one status per answer, in order: 'written', 'duplicate' (the request had its
-- answer) or 'stale' (the record is gone or holds another input).
--#include publish_answer.lua

local stream = KEYS[1]
local attempts = KEYS[2]
local stats = KEYS[3]
local latencies = KEYS[4]
-- Then ANSWER_KEYS keys per answer: its result, its admission record (which names its
-- waiters, waiters.lua).
local HEADER_KEYS, ANSWER_KEYS = 4, 2
local RESULT_KEY, RECORD_KEY = 1, 2

local group = ARGV[1]
local recent_kept = tonumber(ARGV[2])  -- latency samples the list keeps
local ttl_ms = tonumber(ARGV[3])  -- the results' TTL
-- Then ANSWER_ARGS args per answer: the result JSON, the digest ('' writes whatever the
-- record holds), the stream entry it closes ('' for none), the stats field counting it, its
-- latency sample ('' for none).
local HEADER_ARGS, ANSWER_ARGS = 3, 5
local RESULT, DIGEST, ENTRY, ANSWER_FIELD, LATENCY = 1, 2, 3, 4, 5

local answers = (#KEYS - HEADER_KEYS) / ANSWER_KEYS

-- Each answer's keys and args are read by index into locals: read through helper functions
-- they cost Redis 1.7 to 3.1 microseconds more an answer, a tenth of the script
-- (benchmarks/README.md).
local statuses, counts, entries, pushes, samples = {}, {}, {}, {}, {}
for n = 1, answers do
  local k = HEADER_KEYS + (n - 1) * ANSWER_KEYS
  local a = HEADER_ARGS + (n - 1) * ANSWER_ARGS
  local result_key, record_key = KEYS[k + RESULT_KEY], KEYS[k + RECORD_KEY]
  local result, digest, entry = ARGV[a + RESULT], ARGV[a + DIGEST], ARGV[a + ENTRY]
  local record = redis.call('GET', record_key)
  if digest ~= '' and (not record or string.sub(record, 1, #digest) ~= digest) then
    statuses[n] = 'stale'
  else
    local inboxes = publish_answer(result_key, record_key, record, result, ttl_ms)
    if inboxes then
      statuses[n] = 'written'
      local field = ARGV[a + ANSWER_FIELD]
      counts[field] = (counts[field] or 0) + 1
      add_pushes(pushes, inboxes, result, ttl_ms)
      local latency = ARGV[a + LATENCY]
      if latency ~= '' then samples[#samples + 1] = latency end
    else
      statuses[n] = 'duplicate'
    end
  end
  if entry ~= '' then entries[#entries + 1] = entry end
end

push_answers(pushes)
for field, count in pairs(counts) do redis.call('HINCRBY', stats, field, count) end
local CHUNK = 1000  -- values per command: Lua's stack holds a few thousand
for first = 1, #entries, CHUNK do
  local last = math.min(first + CHUNK - 1, #entries)
  redis.call('XACK', stream, group, unpack(entries, first, last))
  redis.call('XDEL', stream, unpack(entries, first, last))
  redis.call('HDEL', attempts, unpack(entries, first, last))
end
for first = 1, #samples, CHUNK do
  redis.call('LPUSH', latencies, unpack(samples, first, math.min(first + CHUNK - 1, #samples)))
end
if #samples > 0 then redis.call('LTRIM', latencies, 0, recent_kept - 1) end
return statuses
