-- _ask_gate: ask.lua's caller gate: only the exact live instance of an agent, and one nobody owns, may ask.
-- Not a script of its own: ask.lua includes it (a line '--! include _ask_gate', which broker/_lua.py replaces with
-- this code on one line); so no comment may follow code here.
-- ask_gate(k, a) (k, a: ask.lua's named KEYS and ARGV, with a.now the Redis clock in ms and a.seen the call's reads)
-- returns the agent token's fingerprint ('' for an agentless
-- ask) and, when the gate refuses, {'err', CODE, message} (nil when it passes).
-- The agent record holds one field per live process of the agent (agent_register.lua): 'p:<fingerprint>', when it
-- lapses (unix ms, Redis clock); 'owner' is set for an owned child, which has no human to ask.
local function ask_gate(k, a)
  if a.agent == '' then
    return '', nil
  end
  local fp = a.token_sha
  if redis.sha1hex then
    fp = redis.sha1hex(a.token)
  end
  local read = 'record ' .. k.record .. ' p:' .. fp
  local record = a.seen[read]
  if not record then
    record = redis.call('HMGET', k.record, 'p:' .. fp, 'owner')
    a.seen[read] = record
  end
  if not record[1] or tonumber(record[1]) < a.now then
    return fp, {'err', 'CALLER_NOT_LIVE', 'agent ' .. a.agent .. ' is not the live instance'}
  end
  if record[2] and record[2] ~= '' then
    return fp, {'err', 'DELEGATED_CALLER', 'agent ' .. a.agent .. ' is owned by agent ' .. record[2] ..
      '; put the unresolved question into your final result for your parent instead'}
  end
  return fp, nil
end
