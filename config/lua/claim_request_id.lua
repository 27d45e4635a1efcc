-- Claims a request id for a model in the fleet-wide index of ids, so that one id names one
-- request of one model at a time: an id no model holds, or this model holds already, becomes
-- (or stays) this model's and lives at least ttl_ms more; another model's is left alone.
-- Returns the model the id belongs to.

local index = KEYS[1]

local model = ARGV[1]
local ttl_ms = tonumber(ARGV[2])

local owner = redis.call('GET', index)
if owner and owner ~= model then return owner end
if redis.call('PTTL', index) < ttl_ms then redis.call('SET', index, model, 'PX', ttl_ms) end
return model
