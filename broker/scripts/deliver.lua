#!lua
-- deliver: the lease holder takes one stream entry for presentation.
-- KEYS[1] provider lease   KEYS[2] request hash   KEYS[3] requests stream   KEYS[4] agent record (request hash when none)
-- KEYS[5] asker's client liveness key   KEYS[6] asker's inbox   KEYS[7] outcome key   KEYS[8] audit stream
-- ARGV[1] fence ('<epoch>:<token>:')   ARGV[2] entry id   ARGV[3] group   ARGV[4] provider name   ARGV[5] epoch
-- ARGV[6] result TTL ms   ARGV[7] audit max length   ARGV[8] request id
-- returns {'ok', request JSON, agent id, created unix ms[, 'again']} | {'gone', why} | {'err', 'LEASE_LOST', message}
-- ('again': this epoch delivered it before, e.g. a re-claim after a broken read; no second audit event)
-- A request whose asker is gone is withdrawn here rather than shown (the asker, if it still
-- waits, is told CALLER_NOT_LIVE). An entry whose request hash is missing (expired after the
-- request TTL, or lost in a failover) is removed, and its asker, if it still waits, is told
-- BROKER_UNAVAILABLE: no ask waits on a request that no longer exists.
local lease = redis.call('GET', KEYS[1])
if not lease or ARGV[1] == '' or string.sub(lease, 1, #ARGV[1]) ~= ARGV[1] then
  return {'err', 'LEASE_LOST', 'this provider no longer holds the lease'}
end
local r = redis.call('HMGET', KEYS[2], 'state', 'request', 'agent', 'agent_fp', 'created', 'delivered')
if not r[1] or r[1] ~= 'pending' then
  redis.pcall('XACK', KEYS[3], ARGV[3], ARGV[2])
  redis.call('XDEL', KEYS[3], ARGV[2])
  if not r[1] then
    local outcome = cjson.encode({error = {name = 'UserQuestionError', code = 'BROKER_UNAVAILABLE',
      message = 'request ' .. ARGV[8] .. ' is gone from Redis (expired after the request TTL, or lost in a failover)'}})
    redis.call('SET', KEYS[7], outcome, 'PX', ARGV[6])
    redis.call('RPUSH', KEYS[6], ARGV[8] .. ' ' .. outcome)
    redis.call('PEXPIRE', KEYS[6], ARGV[6])
  end
  return {'gone', r[1] or 'missing'}
end
local why = nil
if r[3] ~= '' and redis.call('HGET', KEYS[4], 'fp') ~= r[4] then
  why = 'the asking agent is no longer live'
elseif redis.call('EXISTS', KEYS[5]) == 0 then
  why = 'the asking process stopped'
end
if why then
  redis.call('HSET', KEYS[2], 'state', 'withdrawn')
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  local outcome = cjson.encode({error = {name = 'UserQuestionError', code = 'CALLER_NOT_LIVE', message = why}})
  redis.call('SET', KEYS[7], outcome, 'PX', ARGV[6])
  redis.call('RPUSH', KEYS[6], ARGV[8] .. ' ' .. outcome)
  redis.call('PEXPIRE', KEYS[6], ARGV[6])
  redis.pcall('XACK', KEYS[3], ARGV[3], ARGV[2])
  redis.call('XDEL', KEYS[3], ARGV[2])
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[7], '*', 'event', 'withdrawn', 'rid', ARGV[8], 'reason', why)
  return {'gone', 'asker-gone'}
end
if r[6] == ARGV[5] then
  return {'ok', r[2], r[3], r[5], 'again'}  -- shown again under the same epoch: one audit event only
end
redis.call('HSET', KEYS[2], 'delivered', ARGV[5])
redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[7], '*', 'event', 'delivered', 'rid', ARGV[8],
  'provider', ARGV[4], 'epoch', ARGV[5])
return {'ok', r[2], r[3], r[5]}
