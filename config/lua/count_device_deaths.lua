-- For a batch delivered again, per entry: its attempts, counting one more when the device of
-- a process that is gone holds it (that process was running it: the entry could have killed
-- it), or -1 when a live process's device holds it (that process is running it now). Entries
-- not on a live device move to the claiming consumer in the same step, so no one counts the
-- same death again. Returns the counts, in the order of the entries.
--#include server_now.lua

local stream = KEYS[1]
local attempts = KEYS[2]
local live_devices = KEYS[3]

local group = ARGV[1]
local device_suffix = ARGV[2]  -- how a device consumer's name ends
local claiming_consumer = ARGV[3]
local FIRST_ENTRY = 4  -- the entry ids are ARGV[FIRST_ENTRY..]

local now = server_now()
local counts = {}
local claim = {}
for i = FIRST_ENTRY, #ARGV do
  local entry = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, entry, entry, 1)[1]
  local count = tonumber(redis.call('HGET', attempts, entry) or '0')
  if pending and string.sub(pending[2], -string.len(device_suffix)) == device_suffix then
    local alive_until = redis.call('ZSCORE', live_devices, pending[2])
    if alive_until and tonumber(alive_until) > now then
      count = -1
    else
      count = redis.call('HINCRBY', attempts, entry, 1)
    end
  end
  if count >= 0 and pending then claim[#claim + 1] = entry end
  counts[#counts + 1] = count
end
if #claim > 0 then
  -- unpack() spreads the ids only as the last argument; JUSTID goes on the table.
  claim[#claim + 1] = 'JUSTID'
  redis.call('XCLAIM', stream, group, claiming_consumer, 0, unpack(claim))
end
return counts
