-- _agent_beat: a process's beat in its agent's record (agent_register.lua, agent_heartbeat.lua).
-- Not a script of its own: a script that calls agent_beat includes it (a line '--! include _agent_beat', which
-- broker/_lua.py replaces with this code on one line); so no comment may follow code here.
-- agent_beat(agent record key, agents index key, token fingerprint, agent id, now: Redis ms, ttl: ms)
-- The process's field 'p:<fingerprint>' says when it lapses; the record lives as long as its longest-lived process,
-- and the index scores the agent id by when the record expires (a status read needs no SCAN).
local function agent_beat(record, index, fingerprint, agent, now, ttl)
  redis.call('HSET', record, 'p:' .. fingerprint, now + ttl)
  local left = redis.call('PTTL', record)
  if left < ttl then
    left = ttl
    redis.call('PEXPIRE', record, ttl)
  end
  redis.call('ZADD', index, now + left, agent)
end
