-- Redis server time in seconds (microseconds as the fraction): every host agrees on it,
-- whatever its own clock says. Read once per script call (a script runs atomically, so one
-- instant serves all of it: a batch's answers expire together). Included by the scripts that
-- score liveness and dispatch, and by publish_answer.lua for an answer's expiry.
local server_time_now = nil
local function server_now()
  if not server_time_now then
    local t = redis.call('TIME')
    server_time_now = t[1] + t[2] / 1e6
  end
  return server_time_now
end
