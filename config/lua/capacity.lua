-- The model's capacity as the batcher counts it before each decision: prunes what is gone,
-- then counts what is left (count_capacity.lua). Returns {live worker members, batches in
-- flight}.
--#include count_capacity.lua

local workers = KEYS[1]
local inflight = KEYS[2]
local inflight_owners = KEYS[3]

local lease_s = tonumber(ARGV[1])

return count_capacity(workers, inflight, inflight_owners, lease_s)
