#!lua
-- settle: the lease holder answers or cancels pending requests (one call for every settlement a
-- provider has queued); for each request the first terminal transition wins.
-- KEYS[1] provider lease   KEYS[2] requests stream   KEYS[3] audit stream
-- then three keys per settlement i = 0, 1, ..., starting at KEYS[4 + 3i]: request hash, outcome key, asker's inbox
-- ARGV[1] fence ('<epoch>:<token>:')   ARGV[2] provider name   ARGV[3] epoch   ARGV[4] group
-- ARGV[5] audit max length   ARGV[6] result TTL ms
-- ARGV[7] '1' to hold the askers' notices back (the caller pushes them once replicas confirm; min_replicas)
-- then five arguments per settlement, starting at ARGV[8 + 5i]: request id, new state ('answered' | 'cancelled'),
-- outcome JSON, who, for the audit ('' when unknown), this call's unique id
-- returns {'err', 'LEASE_LOST', message} for the whole call, or {'ok', {one reply per settlement}}, each
--   {'ok'} | {'err', CODE, message}
-- A retry of the same call after a lost reply finds its own settlement and succeeds again.
-- A keyed request (asked with a key) keeps its outcome for its detach grace if that is longer than the
-- result TTL; while its asker is away no notice is pushed (nobody reads that inbox, or a process that
-- detached would clean the outcome up): the asker that re-attaches reads the outcome.
local lease = redis.call('GET', KEYS[1])
if not lease or ARGV[1] == '' or string.sub(lease, 1, #ARGV[1]) ~= ARGV[1] then
  return {'err', 'LEASE_LOST', 'this provider no longer holds the lease'}
end
local replies = {}
local done = {}
for i = 0, (#KEYS - 3) / 3 - 1 do
  local k, a = 4 + 3 * i, 8 + 5 * i
  local rid, state, outcome, by, call = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local r = redis.call('HMGET', KEYS[k], 'state', 'entry', 'settle_call', 'by', 'grace', 'away')
  if not r[1] then
    replies[#replies + 1] = {'err', 'NOT_PENDING', 'request ' .. rid .. ' is no longer pending'}
  elseif r[1] ~= 'pending' then
    if r[3] == call then
      replies[#replies + 1] = {'ok'}
    else
      local who = ''
      if r[4] and r[4] ~= '' then who = ' by ' .. r[4] end
      replies[#replies + 1] = {'err', 'NOT_PENDING', 'request ' .. rid .. ' is already ' .. r[1] .. who}
    end
  else
    redis.call('HSET', KEYS[k], 'state', state, 'settle_call', call, 'epoch', ARGV[3], 'by', by)
    local keep, hash_keep = tonumber(ARGV[6]), tonumber(ARGV[6])
    if r[5] then
      -- keyed: the outcome waits the grace out; the hash outlives it, for away_end.lua's audit
      keep = math.max(keep, tonumber(r[5]))
      hash_keep = keep + 60000
    end
    redis.call('PEXPIRE', KEYS[k], hash_keep)
    redis.call('SET', KEYS[k + 1], outcome, 'PX', keep)
    done[#done + 1] = r[2]
    if ARGV[7] ~= '1' and not r[6] then
      redis.call('RPUSH', KEYS[k + 2], rid .. ' ' .. outcome)
      redis.call('PEXPIRE', KEYS[k + 2], ARGV[6])
    end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'event', state, 'rid', rid,
      'provider', ARGV[2], 'epoch', ARGV[3], 'by', by, 'outcome', outcome)
    replies[#replies + 1] = {'ok'}
  end
end
if #done > 0 then
  redis.pcall('XACK', KEYS[2], ARGV[4], unpack(done))
  redis.call('XDEL', KEYS[2], unpack(done))
end
return {'ok', replies}
