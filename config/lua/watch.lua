-- Registers a producer as waiting for a request's answer: returns {'done', result} when the
-- answer exists, {'unknown', ''} when the request has no record, else adds the producer's
-- inbox to the request's waiters (kept as long as the record) and returns {'pending', ''}.

local result_key = KEYS[1]
local record_key = KEYS[2]
local waiters_key = KEYS[3]

local inbox = ARGV[1]

local result = redis.call('GET', result_key)
if result then return {'done', result} end
local ttl = redis.call('PTTL', record_key)
if ttl < 0 then return {'unknown', ''} end
redis.call('SADD', waiters_key, inbox)
redis.call('PEXPIRE', waiters_key, ttl)
return {'pending', ''}
