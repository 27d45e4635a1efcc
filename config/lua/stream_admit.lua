-- Admits one streaming request to its model's streaming lane (past the batcher): refused when
-- no worker serves that lane (the model cannot stream) or it holds max_queue_len;
-- deduplicated by its record, which holds the request's digest.
-- Returns one status, as admit.lua's list of one: 'accepted', 'duplicate', 'conflict',
-- 'full' or 'unstreamable'.

local record_key = KEYS[1]
local lane = KEYS[2]
local stats = KEYS[3]

local digest = ARGV[1]
local request_json = ARGV[2]
local record_ttl_ms = ARGV[3]
local max_queue_len = tonumber(ARGV[4])
local stream_field = ARGV[5]
local accepted_field = ARGV[6]
local id_conflict_field = ARGV[7]
local queue_full_field = ARGV[8]

local function admit()
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', lane)
  if not ok or #groups == 0 then return 'unstreamable' end
  local record = redis.call('GET', record_key)
  if record then
    if string.sub(record, 1, #digest) == digest then return 'duplicate' end
    redis.call('HINCRBY', stats, id_conflict_field, 1)
    return 'conflict'
  end
  if redis.call('XLEN', lane) >= max_queue_len then
    redis.call('HINCRBY', stats, queue_full_field, 1)
    return 'full'
  end
  redis.call('SET', record_key, digest, 'PX', record_ttl_ms)
  redis.call('XADD', lane, '*', stream_field, request_json)
  redis.call('HINCRBY', stats, accepted_field, 1)
  return 'accepted'
end

return {admit()}
