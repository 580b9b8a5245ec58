-- _ask_attach: a keyed ask re-attaches to its key's request while that lives (pending, or settled and not yet
-- collected). The request hash is the record of who asks (docs/architecture.md): the re-attach rewrites its
-- 'client', 'agent_fp', 'deadline' and opt-outs ('remember', 'coalesce'), and clears 'away'.
-- Not a script of its own: ask.lua includes it (a line '--! include _ask_attach', which broker/_lua.py replaces with
-- this code on one line); so no comment may follow code here.
-- ask_attach(k, a, fp, deadline) (k, a: ask.lua's named KEYS and ARGV; fp the agent token's fingerprint; deadline
-- the asker's, Redis ms or '') returns ask.lua's reply when the key decides the ask, nil for a new question:
--   {'retry'}                   the durable key changed since the asker read it (k.named is not what it names)
--   {'err', 'BAD_REQUEST', ...} the key's live request is another request (its digest differs)
--   {'settled', state}          answered or cancelled while the asker was away: this asker collects the outcome
--   {'attached', previous}      pending: this asker's now; the previous client ('' for none) is to be told it was
--                               replaced, also on a retry of this very call after a lost reply (the hash's
--                               'replaced', '<previous client> <rid of the re-attach>', keeps it)
-- A provider that was shown the request gets a 'back' entry when who asks or an opt-out changed: it re-reads the
-- hash (settlements then go to the new client).
local function ask_attach(k, a, fp, deadline)
  local named = redis.call('GET', k.durable)
  local read_as = string.sub(k.request, 1, #k.request - #a.rid) .. (named or a.rid)
  if read_as ~= k.named then
    return {'retry'}
  end
  if not named then
    return nil
  end
  local r = redis.call('HMGET', k.named, 'state', 'digest', 'client', 'away', 'delivered', 'request', 'created',
    'remember', 'coalesce', 'replaced')
  local settled = (r[1] == 'answered' or r[1] == 'cancelled') and r[6] ~= false
  if r[1] ~= 'pending' and not settled then
    return nil
  end
  if r[2] ~= a.digest then
    return {'err', 'BAD_REQUEST', 'key ' .. a.key .. ' names a different request, asked at ' .. r[7] ..
      ' (unix ms) and still ' .. r[1] .. '; ask it with a new key'}
  end
  if settled then
    -- this asker collects it (settled_cleanup.lua)
    redis.call('HSET', k.named, 'client', a.client)
    redis.call('ZREM', k.away, named)
    return {'settled', r[1]}
  end
  local remember, coalesce = a.remember == '0' and '0' or '1', a.solo and '0' or '1'
  local previous = r[3] or ''
  if previous == a.client and r[10] then
    local was, by = string.match(r[10], '^(%S*) (%S+)$')
    if by == a.rid then previous = was end
  end
  redis.call('HSET', k.named, 'client', a.client, 'agent_fp', fp, 'deadline', deadline, 'remember', remember,
    'coalesce', coalesce)
  if r[3] ~= a.client then
    redis.call('HSET', k.named, 'replaced', (r[3] or '') .. ' ' .. a.rid)
  end
  if r[4] then
    redis.call('HDEL', k.named, 'away')
    redis.call('ZREM', k.away, named)
  end
  if r[5] and (r[4] or r[3] ~= a.client or (r[8] or '1') ~= remember or (r[9] or '1') ~= coalesce) then
    redis.call('XADD', k.requests, '*', 'kind', 'back', 'rid', named, 'client', a.client)
  end
  if r[3] ~= a.client then
    redis.call('XADD', k.asklog, 'MAXLEN', '~', a.log_max, '*', 'event', 'attached', 'rid', named, 'agent', a.agent,
      'client', a.client, 'key', a.key)
  end
  return {'attached', previous}
end
