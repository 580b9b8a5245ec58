-- _restart: whether a request was asked before this Redis started, within the askers' liveness grace (deliver.lua,
-- reap.lua). Not a script of its own: a script that calls asked_before_a_restart includes it (a line
-- '--! include _restart', which broker/_lua.py replaces with this code on one line); so no comment may follow code
-- here.
-- asked_before_a_restart(created: Redis ms or nil, now: Redis ms, grace: ms) returns true while the server has been
-- up for less than grace and the request was created before it started: a restart that outlasted the liveness TTLs
-- dropped live askers' keys with the dead ones', so its asker is not judged by them yet (time to beat again).
-- The server's uptime is read once per script call (INFO, which the answerer and maintenance roles may run).
local restart_uptime = nil
local function asked_before_a_restart(created, now, grace)
  if restart_uptime == nil then
    local info = redis.pcall('INFO', 'server')
    restart_uptime = type(info) == 'string' and tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or false
  end
  local up = restart_uptime
  return up and up * 1000 < tonumber(grace or '0') and tonumber(created or now) < now - (up + 1) * 1000
end
