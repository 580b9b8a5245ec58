-- _ask_enqueue: ask.lua's last step: a new question goes onto the requests stream for the namespace's provider,
-- and its request hash, the record of who asks (docs/architecture.md), is written.
-- Not a script of its own: ask.lua includes it (a line '--! include _ask_enqueue', which broker/_lua.py replaces with
-- this code on one line); so no comment may follow code here.
-- ask_enqueue(k, a, fp, now, deadline) (k, a: ask.lua's named KEYS and ARGV; fp the agent token's fingerprint; now
-- Redis ms; deadline the asker's, Redis ms as text or '') returns {'ok', entry id}, or {'err', 'NO_PROVIDER', message}
-- when no provider holds the lease or stands by (a standby's score is when it lapses).
-- The entry carries the request JSON (the provider presents it without reading the hash), who asked first and a
-- gateway's attestation of the ask (a.attest, verified by the provider);
-- the hash's 'client', 'remember', 'coalesce' and 'deadline' are the authoritative copies. A keyed ask's hash
-- also holds 'key', 'grace' and 'digest', and its durable key names it: set to outlive the request and a kept
-- answer (settle.lua shortens it to the hash's TTL), a name whose request ended is simply asked anew.
local function ask_enqueue(k, a, fp, now, deadline)
  local up = a.seen['up ' .. a.lease]
  if up == nil then
    up = redis.call('EXISTS', a.lease) == 1 or redis.call('ZCOUNT', a.standbys, now, '+inf') > 0
    a.seen['up ' .. a.lease] = up
  end
  if not up then
    return {'err', 'NO_PROVIDER', 'no provider holds or stands by for this namespace'}
  end
  local remember, coalesce = a.remember == '0' and '0' or '1', a.solo and '0' or '1'
  local fields = {'kind', 'ask', 'rid', a.rid, 'client', a.client, 'agent', a.agent, 'request', a.body,
    'remember', remember}
  if a.solo then
    fields[#fields + 1] = 'coalesce'
    fields[#fields + 1] = '0'
  end
  if a.attest ~= '' then
    fields[#fields + 1] = 'attest'
    fields[#fields + 1] = a.attest
  end
  local entry = redis.call('XADD', k.requests, '*', unpack(fields))
  redis.call('HSET', k.request, 'state', 'pending', 'request', a.body, 'agent', a.agent, 'agent_fp', fp,
    'client', a.client, 'entry', entry, 'created', a.now_text, 'deadline', deadline, 'remember', remember,
    'coalesce', coalesce)
  redis.call('PEXPIRE', k.request, a.request_ttl)
  if a.key ~= '' then
    redis.call('HSET', k.request, 'key', a.key, 'grace', a.grace, 'digest', a.digest)
    redis.call('SET', k.durable, a.rid, 'PX', 2 * tonumber(a.request_ttl) + tonumber(a.grace))
  end
  redis.call('XADD', k.asklog, 'MAXLEN', '~', a.log_max, '*', 'event', 'asked', 'rid', a.rid, 'agent', a.agent,
    'client', a.client)
  return {'ok', entry}
end
