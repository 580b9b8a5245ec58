#!lua
-- lease_renew: extend the lease, only while it is still ours.
-- KEYS[1] provider lease   ARGV[1] fence ('<epoch>:<token>:')   ARGV[2] lease TTL ms
-- returns 1 when renewed, 0 when the lease is gone or another's
local current = redis.call('GET', KEYS[1])
if current and ARGV[1] ~= '' and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
