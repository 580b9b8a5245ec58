#!lua
--! include _fence
--! include _audit
-- approve: the lease holder records one person's vote on a request that a quorum policy covers
-- (broker/quorum.py); the votes so far live in an answerer-only hash, so a standby that takes over has them.
-- KEYS[1] lease      the provider lease
-- KEYS[2] request    the request hash
-- KEYS[3] approvals  the approvals hash (person -> vote JSON, and '#at:' .. person -> when that vote was given, unix ms
--                    by the Redis clock)
-- KEYS[4] audit      the audit stream
-- ARGV[1] fence      '<epoch>:<token>:'
-- ARGV[2] rid        request id
-- ARGV[3] person
-- ARGV[4] vote       the vote (JSON)
-- ARGV[5] ttl        the approvals' TTL ms at least (they live as long as the request hash, and no shorter than this)
-- ARGV[6] audit_max  the audit's max length
-- ARGV[7] policy     the policy's name
-- ARGV[8] verdict    'approve' | 'decline' (for the audit)
-- ARGV[9] provider   provider name
-- ARGV[10] epoch
-- returns {'err', 'LEASE_LOST', message} | {'err', 'NOT_PENDING', message} | {'ok', {field, value, ...}} every
--   vote so far (this one included) and its time, flat
-- The same vote again (a retry after a lost reply, a second click) changes nothing and writes no audit entry.
local lost = lease_lost(KEYS[1], ARGV[1])
if lost then
  return lost
end
local state = redis.call('HGET', KEYS[2], 'state')
if state ~= 'pending' then
  return {'err', 'NOT_PENDING', 'request ' .. ARGV[2] .. ' is ' .. (state or 'gone')}
end
local before = redis.call('HGET', KEYS[3], ARGV[3])
if before ~= ARGV[4] then
  local now = redis.call('TIME')
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4], '#at:' .. ARGV[3], now[1] * 1000 + math.floor(now[2] / 1000))
  audit_append(KEYS[4], ARGV[6], 'event', 'vote', 'rid', ARGV[2], 'by', ARGV[3], 'verdict', ARGV[8],
    'policy', ARGV[7], 'provider', ARGV[9], 'epoch', ARGV[10])
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl < tonumber(ARGV[5]) then ttl = tonumber(ARGV[5]) end
redis.call('PEXPIRE', KEYS[3], ttl)
return {'ok', redis.call('HGETALL', KEYS[3])}
