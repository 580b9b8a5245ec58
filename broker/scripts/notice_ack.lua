#!lua
--! include _fence
-- notice_ack: the lease holder takes a withdraw notice off the stream (its UI has taken the card down).
-- KEYS[1] lease     the provider lease
-- KEYS[2] requests  the requests stream
-- ARGV[1] fence     '<epoch>:<token>:'
-- ARGV[2] entry     the notice's entry id
-- ARGV[3] group
-- returns {'ok'} | {'err', 'LEASE_LOST', message}
-- Fenced like every provider action: a reader that lost the lease leaves the notice for the holder.
local lost = lease_lost(KEYS[1], ARGV[1])
if lost then
  return lost
end
redis.pcall('XACK', KEYS[2], ARGV[3], ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[2])
return {'ok'}
