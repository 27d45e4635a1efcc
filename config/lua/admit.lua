-- Admits a chunk of requests for one model, all or nothing: when one id is reused with another
-- input, or the queue has no room for every new request, nothing of the chunk is written and
-- the refused ones say why ('conflict', 'full'; new and cached ones 'withheld', ids already
-- queued with the same input stay 'duplicate'). One by one (the single submits of many
-- callers, sent together), each request stands alone instead: a reused id refuses only
-- itself, and new requests are taken in order while the queue has room, the rest 'full'.
-- The ids of one call are distinct. Otherwise each id is deduplicated by its
-- record, an input the model's response cache holds for its current version is answered at
-- once without entering the queue ('cached'), and the rest are appended to the stream
-- ('accepted'). With an inbox, the producer that will wait for the answers is registered as a
-- waiter of each request this call enqueues (as watch.lua would), so it need not watch them.
-- Returns one status per request, in order.
-- A request's record holds 'digest:entry id:model' while it is queued ('digest' alone for a
-- cache hit), then its waiters (waiters.lua): the digest makes resubmission idempotent, the
-- entry lets cancel find it.
-- A cache entry holds '<version's byte length>:<version><output JSON>' (config.schema's
-- cache_entry): it answers only while that version is the model's current one.
--#include waiters.lua

local use_cache = ARGV[3] == '1'
local inbox = ARGV[11]  -- the waiting producer's inbox; '' for none
local stream = KEYS[1]
local stats = KEYS[2]
local version_key = KEYS[3]
-- Then REQUEST_KEYS keys per request: its record (and with a cache, its result and its cache
-- entry).
local HEADER_KEYS, REQUEST_KEYS = 3, (use_cache and 3 or 1)
local RECORD, RESULT, CACHE_ENTRY = 1, 2, 3

local max_queue_len = tonumber(ARGV[1])
local stream_field = ARGV[2]
local model = ARGV[4]
local accepted_field = ARGV[5]
local id_conflict_field = ARGV[6]
local queue_full_field = ARGV[7]
local cache_hit_field = ARGV[8]
local cache_miss_field = ARGV[9]
local one_by_one = ARGV[10] == '1'
local cached_ttl_ms = ARGV[12]  -- the TTL of a result answered from the cache
-- Then REQUEST_ARGS args per request: its digest, its request JSON, its record's TTL (ms) (and
-- with a cache, the start of its result when answered from there: this script appends the
-- model version and the output).
local HEADER_ARGS, REQUEST_ARGS = 12, (use_cache and 4 or 3)
local DIGEST, REQUEST_JSON, RECORD_TTL_MS, CACHED_HEAD = 1, 2, 3, 4

-- Each request's keys and args are found by index, not through helper functions: in a loop
-- over a chunk's requests, a Lua function call costs Redis more than the arithmetic (as in
-- finalize.lua).
local requests = (#KEYS - HEADER_KEYS) / REQUEST_KEYS

local version = false
if use_cache then version = redis.call('GET', version_key) end

-- The cached output in cache entry 'cache_key', computed by the current version; nil when
-- there is none.
local function cached_output(cache_key)
  local cached = redis.call('GET', cache_key)
  if not cached then return nil end
  local tag = #version .. ':' .. version
  if string.sub(cached, 1, #tag) ~= tag then return nil end
  return string.sub(cached, #tag + 1)
end

local statuses, hits = {}, {}
local conflicts, fresh = 0, 0
for n = 1, requests do
  local k = HEADER_KEYS + (n - 1) * REQUEST_KEYS
  local digest = ARGV[HEADER_ARGS + (n - 1) * REQUEST_ARGS + DIGEST]
  local record = redis.call('GET', KEYS[k + RECORD])
  if record then
    if string.sub(record, 1, #digest) == digest then statuses[n] = 'duplicate'
    else statuses[n] = 'conflict'; conflicts = conflicts + 1 end
  else
    if version then hits[n] = cached_output(KEYS[k + CACHE_ENTRY]) end
    if hits[n] then statuses[n] = 'cached'
    else statuses[n] = 'new'; fresh = fresh + 1 end
  end
end

local refused = false
if one_by_one then
  if conflicts > 0 then redis.call('HINCRBY', stats, id_conflict_field, conflicts) end
  local room, full = max_queue_len - redis.call('XLEN', stream), 0
  for n, status in ipairs(statuses) do
    if status == 'new' then
      if room > 0 then room = room - 1 else statuses[n] = 'full'; full = full + 1 end
    end
  end
  if full > 0 then redis.call('HINCRBY', stats, queue_full_field, full) end
elseif conflicts > 0 then
  refused = 'conflict'
  redis.call('HINCRBY', stats, id_conflict_field, conflicts)
elseif fresh > 0 and redis.call('XLEN', stream) + fresh > max_queue_len then
  refused = 'full'
  redis.call('HINCRBY', stats, queue_full_field, fresh)
end
if refused then
  for n, status in ipairs(statuses) do
    if status == 'new' and refused == 'full' then statuses[n] = 'full'
    elseif status == 'new' or status == 'cached' then statuses[n] = 'withheld' end
  end
  return statuses
end

local waiter = inbox ~= '' and first_waiter_line(inbox) or ''
local accepted, cached = 0, 0
for n, status in ipairs(statuses) do
  local k = HEADER_KEYS + (n - 1) * REQUEST_KEYS
  local a = HEADER_ARGS + (n - 1) * REQUEST_ARGS
  if status == 'cached' then
    redis.call('SET', KEYS[k + RECORD], ARGV[a + DIGEST], 'PX', cached_ttl_ms)
    local result = ARGV[a + CACHED_HEAD] .. cjson.encode(version) .. ',"output":' .. hits[n] .. '}'
    redis.call('SET', KEYS[k + RESULT], result, 'PX', cached_ttl_ms)
    cached = cached + 1
  elseif status == 'new' then
    local entry = redis.call('XADD', stream, '*', stream_field, ARGV[a + REQUEST_JSON])
    local record = ARGV[a + DIGEST] .. ':' .. entry .. ':' .. model .. waiter
    redis.call('SET', KEYS[k + RECORD], record, 'PX', ARGV[a + RECORD_TTL_MS])
    statuses[n] = 'accepted'
    accepted = accepted + 1
  end
end
if accepted > 0 then redis.call('HINCRBY', stats, accepted_field, accepted) end
if version and cached > 0 then redis.call('HINCRBY', stats, cache_hit_field, cached) end
if version and accepted > 0 then redis.call('HINCRBY', stats, cache_miss_field, accepted) end
return statuses
