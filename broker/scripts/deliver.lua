#!lua
--! include _fence
--! include _audit
--! include _away
--! include _restart
-- deliver: the lease holder takes the ask entries of one read (XREADGROUP, XAUTOCLAIM, XCLAIM) for presentation.
-- KEYS[1] lease           the provider lease
-- KEYS[2] requests        the requests stream
-- KEYS[3] audit           the audit stream
-- KEYS[4] away            the away zset
-- then five per entry i = 0, 1, ..., from k = 5 + 5i:
-- KEYS[k] request         the request hash
-- KEYS[k + 1] record      the agent record (the request hash when none)
-- KEYS[k + 2] liveness    the asker's client liveness key
-- KEYS[k + 3] inbox       the asker's inbox
-- KEYS[k + 4] outcome     the outcome key
-- ARGV[1] fence           '<epoch>:<token>:'
-- ARGV[2] group
-- ARGV[3] epoch
-- ARGV[4] result_ttl      result TTL ms
-- ARGV[5] audit_max       the audit's max length
-- ARGV[6] liveness_grace  the askers' liveness grace after a Redis start, ms (see below)
-- then three per entry i, from a = 7 + 3i:
-- ARGV[a] entry           its entry id
-- ARGV[a + 1] rid         request id
-- ARGV[a + 2] want_body   '1' to get the request JSON back (an entry written without its request body) or '0'
-- returns {'err', 'LEASE_LOST', message} for the whole read, or {'ok', {one reply per entry}}, each
--   {'ok', request JSON or '', agent id, created unix ms, 'again' or '', '1' if its asker is away else '0',
--    the ask's key or '', the asking process's client id, remember ('0': opted out), coalesce ('0': opted out),
--    the asker's deadline (unix ms, Redis clock) or ''}
--   | {'gone', why}
--   | {'moved', client id}  the hash names another asking process than the one this entry's keys were built for
--                          (a keyed ask re-attached): nothing was done; deliver it again with that client's keys
-- Who asks is the request hash's (its 'client', 'away', 'remember', 'coalesce'), never the stream entry's: the entry
-- says who asked first, and a keyed ask may have re-attached from another process since (docs/architecture.md).
-- A hash naming no client ('') is a keyed ask whose asker detached: its asker is away.
-- ('again': this epoch delivered it before, e.g. a re-claim after a broken read)
-- A request whose asker is gone is withdrawn here rather than shown (the asker, if it still
-- waits, is told CALLER_NOT_LIVE). A keyed request (asked with a key) is not: its asker is marked
-- away (the hash's 'away' field, and the away zset scored by when its detach grace ends) and it is
-- shown; its asker may come back and re-attach. An entry whose request hash is missing (expired
-- after the request TTL, or lost in a failover) is removed, and its asker, if it still waits, is
-- told BROKER_UNAVAILABLE: no ask waits on a request that no longer exists.
-- The asking process is live while its field in the agent record ('p:<fingerprint>', agent_register.lua) has not
-- lapsed. A Redis restart that outlasted the liveness TTLs dropped live askers' keys with the dead ones': a request
-- asked before the server started is not judged by them until it has been up for ARGV[6] ms (time for a live asker
-- to beat again); housekeeping (reap.lua) judges the ones shown meanwhile.
-- Who was given a request is the hash's 'delivered' field (the epoch); the audit records who
-- answered, under which epoch, when the request is settled (settle.lua).
local lost = lease_lost(KEYS[1], ARGV[1])
if lost then
  return lost
end
local replies = {}
local done = {}
local function tell(k, rid, code, message)
  local outcome = cjson.encode({error = {name = 'UserQuestionError', code = code, message = message}})
  redis.call('SET', KEYS[k + 4], outcome, 'PX', ARGV[4])
  redis.call('RPUSH', KEYS[k + 3], rid .. ' ' .. outcome)
  redis.call('PEXPIRE', KEYS[k + 3], ARGV[4])
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Entries of one read mostly share their asker: each agent process and liveness key is read once per call.
local lapses, alive = {}, {}
local function agent_live(key, fp)
  local field = 'p:' .. (fp or '')
  if lapses[key .. ' ' .. field] == nil then
    lapses[key .. ' ' .. field] = tonumber(redis.call('HGET', key, field) or '0')
  end
  return lapses[key .. ' ' .. field] >= now
end
local function process_alive(key)
  if alive[key] == nil then alive[key] = redis.call('EXISTS', key) == 1 end
  return alive[key]
end
for i = 0, (#KEYS - 4) / 5 - 1 do
  local k, a = 5 + 5 * i, 7 + 3 * i
  local entry, rid = ARGV[a], ARGV[a + 1]
  local r = redis.call('HMGET', KEYS[k], 'state', 'agent', 'agent_fp', 'created', 'delivered', 'key', 'grace',
    'away', 'client', 'remember', 'coalesce', 'deadline')
  local why = nil
  local client = r[9] or ''
  if r[1] == 'pending' and client ~= '' and string.sub(KEYS[k + 2], -#client - 1) ~= ':' .. client then
    replies[#replies + 1] = {'moved', client}
  elseif not r[1] or r[1] ~= 'pending' then
    done[#done + 1] = entry
    if not r[1] then
      tell(k, rid, 'BROKER_UNAVAILABLE',
        'request ' .. rid .. ' is gone from Redis (expired after the request TTL, or lost in a failover)')
    end
    replies[#replies + 1] = {'gone', r[1] or 'missing'}
  else
    if r[2] ~= '' and not agent_live(KEYS[k + 1], r[3]) then
      why = 'the asking agent is no longer live'
    elseif client == '' then
      why = 'the asker detached'
    elseif not process_alive(KEYS[k + 2]) then
      why = 'the asking process stopped'
    end
    if why and asked_before_a_restart(r[4], now, ARGV[6]) then
      why = nil
    end
    local away, reason = '0', why
    if why and r[6] then
      away, why = '1', nil
      if not r[8] then
        redis.call('HSET', KEYS[k], 'away', now)
        away_add(KEYS[4], rid, now, now + tonumber(r[7]), ARGV[4])
        audit_append(KEYS[3], ARGV[5], 'event', 'away', 'rid', rid, 'reason', reason)
      end
    end
    if why then
      redis.call('HSET', KEYS[k], 'state', 'withdrawn')
      redis.call('PEXPIRE', KEYS[k], ARGV[4])
      tell(k, rid, 'CALLER_NOT_LIVE', why)
      done[#done + 1] = entry
      audit_append(KEYS[3], ARGV[5], 'event', 'withdrawn', 'rid', rid, 'reason', why)
      replies[#replies + 1] = {'gone', 'asker-gone'}
    else
      local body = ''
      if ARGV[a + 2] == '1' then body = redis.call('HGET', KEYS[k], 'request') end
      if r[5] == ARGV[3] then
        replies[#replies + 1] = {'ok', body, r[2], r[4], 'again', away, r[6] or '', client, r[10] or '', r[11] or '',
          r[12] or ''}
      else
        redis.call('HSET', KEYS[k], 'delivered', ARGV[3])
        replies[#replies + 1] = {'ok', body, r[2], r[4], '', away, r[6] or '', client, r[10] or '', r[11] or '',
          r[12] or ''}
      end
    end
  end
end
if #done > 0 then
  redis.pcall('XACK', KEYS[2], ARGV[2], unpack(done))
  redis.call('XDEL', KEYS[2], unpack(done))
end
return {'ok', replies}
