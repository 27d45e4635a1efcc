-- A request's waiters live in its admission record (admit.lua): after what admit.lua writes,
-- one line per producer waiting for its answer, holding that producer's inbox. So they last
-- exactly as long as the record, and the read of a record for its digest names them too.
-- An inbox's name holds no line break (model names and producer ids are printable).
-- Included by admit.lua, watch.lua and publish_answer.lua.

-- The line that adds 'inbox' to the waiters of 'record', or '' when it names it already.
local function waiter_line(record, inbox)
  if string.find(record .. '\n', '\n' .. inbox .. '\n', 1, true) then return '' end
  return '\n' .. inbox
end

-- The line that adds 'inbox' to the waiters of a record that names none yet (a new one).
local function first_waiter_line(inbox) return '\n' .. inbox end

-- The inboxes of the producers waiting for a request, from its admission record (or none).
-- One waiter, the usual case, is found without a pattern match.
local function waiters_of(record)
  local first = record and string.find(record, '\n', 1, true)
  if not first then return {} end
  if not string.find(record, '\n', first + 1, true) then return {string.sub(record, first + 1)} end
  local inboxes = {}
  for inbox in string.gmatch(record, '\n([^\n]+)') do inboxes[#inboxes + 1] = inbox end
  return inboxes
end
