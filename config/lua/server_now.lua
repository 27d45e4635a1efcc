-- Redis server time in seconds (microseconds as the fraction): every host agrees on it,
-- whatever its own clock says. Included by the scripts that score liveness and dispatch, and
-- by publish_answer.lua for an answer's expiry.
local function server_now()
  local t = redis.call('TIME')
  return t[1] + t[2] / 1e6
end
