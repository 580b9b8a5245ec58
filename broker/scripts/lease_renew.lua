#!lua
-- lease_renew: extend the lease, only while it is still ours.
-- KEYS[1] lease     the provider lease
-- KEYS[2] standbys  the standbys zset (the live providers' registrations)
-- KEYS[3] record    (optional) the lease record: who held the lease last, under which server run (_kept.lua)
-- ARGV[1] fence     '<epoch>:<token>:'
-- ARGV[2] ttl       the lease TTL ms
-- ARGV[3] member    this provider's member ('<token>:<name>')
-- returns 1 when renewed, 0 when the lease is gone or another's
-- A lease that lapsed while Redis restarted, and that nobody took since, is ours again with the same epoch: a
-- holder keeps its lease through an outage shorter than its TTL (the server's clock ran on while it was down).
-- The holder keeps its own registration fresh (3 x the lease TTL) beside the standbys': a lease
-- that lapsed in an outage (a Redis restart, a failover) does not make asks NO_PROVIDER while
-- the holder lives and is about to take it again.
--! include _kept
local current = redis.call('GET', KEYS[1])
if not current then
  local kept = kept_lease(KEYS[3])
  if kept and ARGV[1] ~= '' and string.sub(kept, 1, #ARGV[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], kept, 'PX', ARGV[2])
    current = kept
  end
end
if current and ARGV[1] ~= '' and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  record_lease(KEYS[3], current, ARGV[2])
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000) + 3 * tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
