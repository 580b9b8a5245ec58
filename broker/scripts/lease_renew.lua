#!lua
-- lease_renew: extend the lease, only while it is still ours.
-- KEYS[1] lease     the provider lease
-- KEYS[2] standbys  the standbys zset (the live providers' registrations)
-- ARGV[1] fence     '<epoch>:<token>:'
-- ARGV[2] ttl       the lease TTL ms
-- ARGV[3] member    this provider's member ('<token>:<name>')
-- returns 1 when renewed, 0 when the lease is gone or another's
-- The holder keeps its own registration fresh (3 x the lease TTL) beside the standbys': a lease
-- that lapsed in an outage (a Redis restart, a failover) does not make asks NO_PROVIDER while
-- the holder lives and is about to take it again.
local current = redis.call('GET', KEYS[1])
if current and ARGV[1] ~= '' and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000) + 3 * tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
