#!lua
-- settle: the lease holder answers or cancels a pending request; the first terminal transition wins.
-- KEYS[1] provider lease   KEYS[2] request hash   KEYS[3] outcome key   KEYS[4] requests stream
-- KEYS[5] asker's inbox    KEYS[6] audit stream
-- ARGV[1] fence ('<epoch>:<token>:')   ARGV[2] request id   ARGV[3] new state ('answered' | 'cancelled')
-- ARGV[4] outcome JSON   ARGV[5] result TTL ms   ARGV[6] provider name   ARGV[7] epoch   ARGV[8] group
-- ARGV[9] audit max length   ARGV[10] who, for the audit ('' when unknown)   ARGV[11] this call's unique id
-- ARGV[12] '1' to hold the asker's notice back (the caller pushes it once replicas confirm; min_replicas)
-- returns {'ok'} | {'err', CODE, message}
-- A retry of the same call after a lost reply finds its own settlement and succeeds again.
local lease = redis.call('GET', KEYS[1])
if not lease or ARGV[1] == '' or string.sub(lease, 1, #ARGV[1]) ~= ARGV[1] then
  return {'err', 'LEASE_LOST', 'this provider no longer holds the lease'}
end
local r = redis.call('HMGET', KEYS[2], 'state', 'entry', 'settle_call', 'by')
if not r[1] then
  return {'err', 'NOT_PENDING', 'request ' .. ARGV[2] .. ' is no longer pending'}
end
if r[1] ~= 'pending' then
  if r[3] == ARGV[11] then
    return {'ok'}
  end
  local by = ''
  if r[4] and r[4] ~= '' then by = ' by ' .. r[4] end
  return {'err', 'NOT_PENDING', 'request ' .. ARGV[2] .. ' is already ' .. r[1] .. by}
end
redis.call('HSET', KEYS[2], 'state', ARGV[3], 'settle_call', ARGV[11], 'epoch', ARGV[7], 'by', ARGV[10])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
redis.pcall('XACK', KEYS[4], ARGV[8], r[2])
redis.call('XDEL', KEYS[4], r[2])
if ARGV[12] ~= '1' then
  redis.call('RPUSH', KEYS[5], ARGV[2] .. ' ' .. ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ARGV[5])
end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[3], 'rid', ARGV[2],
  'provider', ARGV[6], 'epoch', ARGV[7], 'by', ARGV[10], 'outcome', ARGV[4])
return {'ok'}
