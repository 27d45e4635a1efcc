--#include server_now.lua
--#include waiters.lua

-- Publishes a request's final answer, first write wins: stores the result unless one exists
-- and keeps the admission record ('record', as just read; false when there is none) exactly as
-- long as the result ('ttl_ms': a number, as add_pushes takes it). Included by finalize.lua
-- and cancel.lua.
-- Returns the inboxes of the producers waiting for it (push_answers sends the result there),
-- or false when the request had its answer already.
local expiries_at_ms = {}  -- by TTL: the answers of one call expire together
local function publish_answer(result_key, record_key, record, result, ttl_ms)
  -- One absolute expiry for both: a record outliving its result by a millisecond would leave
  -- a caller who asks in that millisecond waiting for an answer that never comes.
  local expire_at_ms = expiries_at_ms[ttl_ms]
  if not expire_at_ms then
    expire_at_ms = string.format('%d', math.floor(server_now() * 1000) + ttl_ms)
    expiries_at_ms[ttl_ms] = expire_at_ms
  end
  if not redis.call('SET', result_key, result, 'NX', 'PXAT', expire_at_ms) then return false end
  if record then redis.call('PEXPIREAT', record_key, expire_at_ms) end
  return waiters_of(record)
end

-- Pushes published answers to their waiters' inboxes, one LPUSH per inbox for all of its
-- answers: 'pushes' maps an inbox to {results, ttl_ms}; each inbox lives as long as the
-- longest-lived answer pushed to it.
local PUSH_CHUNK = 1000  -- values per LPUSH: Lua's stack holds a few thousand
local function push_answers(pushes)
  for inbox, push in pairs(pushes) do
    local results = push[1]
    for first = 1, #results, PUSH_CHUNK do
      redis.call('LPUSH', inbox, unpack(results, first, math.min(first + PUSH_CHUNK - 1, #results)))
    end
    redis.call('PEXPIRE', inbox, push[2])
  end
end

-- Adds one published answer to 'pushes' (see push_answers) for each of 'inboxes'.
local function add_pushes(pushes, inboxes, result, ttl_ms)
  for _, inbox in ipairs(inboxes) do
    local push = pushes[inbox]
    if not push then
      push = {{}, 0}
      pushes[inbox] = push
    end
    local results = push[1]
    results[#results + 1] = result
    if ttl_ms > push[2] then push[2] = ttl_ms end
  end
end
