#!lua
-- lease_release: give the lease up at once and wake one standby.
-- KEYS[1] lease     the provider lease
-- KEYS[2] signal    the lease-released signal list
-- KEYS[3] standbys  the standbys zset
-- KEYS[4] record    (optional) the lease record (_kept.lua): a released lease is kept for nobody
-- ARGV[1] fence     '<epoch>:<token>:'
-- ARGV[2] member    this provider's standby member ('<token>:<name>')
-- returns 1 when released, 0 when it was not ours
redis.call('ZREM', KEYS[3], ARGV[2])
local current = redis.call('GET', KEYS[1])
if current and ARGV[1] ~= '' and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  if KEYS[4] then
    redis.call('DEL', KEYS[4])
  end
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('PEXPIRE', KEYS[2], 10000)
  return 1
end
return 0
