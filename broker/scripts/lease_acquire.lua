#!lua
-- lease_acquire: take the namespace's provider lease, or register as a standby while another holds it.
-- KEYS[1] lease        the provider lease
-- KEYS[2] epoch        the epoch counter
-- KEYS[3] standbys     the standbys zset (the holder registers there too)
-- KEYS[4] handover     (optional) the handover reservation: '<provider name>\n<who asked>', PX TTL
--                      (Broker.request_handover)
-- KEYS[5] record       (optional) the lease record: who held the lease last, under which server run (_kept.lua)
-- ARGV[1] token        this acquisition's token
-- ARGV[2] name         the provider's name
-- ARGV[3] ttl          the lease TTL ms
-- ARGV[4] standby_ttl  the standby TTL ms ('0': do not stand by)
-- returns {epoch, lease TTL ms} on acquisition | {0, the holder's remaining ms, holder value} when busy
-- While a handover reservation names another provider, a free lease is busy for this one: {0, the reservation's
-- remaining ms, '0::<reserved name>'}; the named provider's acquisition uses the reservation up.
-- While a lease that lapsed in a Redis restart is kept for its holder (_kept.lua), it is busy for everyone else:
-- {0, the record's remaining ms, its lease value}; the holder renews it (lease_renew.lua) with the same epoch.
-- A retry of the same call after a lost reply (same token) finds its own lease and gets the same epoch.
-- The epoch counter never expires and increases on every acquisition: it is the fencing token.
-- It is at least the Redis clock in ms, so it keeps increasing even when the counter itself is
-- lost (a restart without persistence, a failover that dropped the last writes).
--! include _kept
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local current = redis.call('GET', KEYS[1])
if current then
  local held_epoch, held_token = string.match(current, '^(%d+):([^:]*):')
  if held_token == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {tonumber(held_epoch), tonumber(ARGV[3])}
  end
  if ARGV[4] ~= '0' then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1] .. ':' .. ARGV[2])
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  end
  return {0, redis.call('PTTL', KEYS[1]), current}
end
local kept = kept_lease(KEYS[5])
if kept then
  local kept_epoch, kept_token = string.match(kept, '^(%d+):([^:]*):')
  if kept_token == ARGV[1] then
    redis.call('SET', KEYS[1], kept, 'PX', ARGV[3])
    record_lease(KEYS[5], kept, ARGV[3])
    return {tonumber(kept_epoch), tonumber(ARGV[3])}
  end
  if ARGV[4] ~= '0' then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1] .. ':' .. ARGV[2])
  end
  return {0, redis.call('PTTL', KEYS[5]), kept}
end
local reserved = KEYS[4] and redis.call('GET', KEYS[4])
if reserved then
  local to = string.match(reserved, '^([^\n]*)')
  if to ~= ARGV[2] then
    if ARGV[4] ~= '0' then
      redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1] .. ':' .. ARGV[2])
    end
    return {0, redis.call('PTTL', KEYS[4]), '0::' .. to}
  end
  redis.call('DEL', KEYS[4])
end
local epoch = redis.call('INCR', KEYS[2])
if epoch < now then
  epoch = now
  redis.call('SET', KEYS[2], string.format('%.0f', now))
end
local lease = string.format('%.0f', epoch) .. ':' .. ARGV[1] .. ':' .. ARGV[2]
redis.call('SET', KEYS[1], lease, 'PX', ARGV[3])
record_lease(KEYS[5], lease, ARGV[3])
redis.call('ZADD', KEYS[3], now + 3 * tonumber(ARGV[3]), ARGV[1] .. ':' .. ARGV[2])  -- see lease_renew.lua
return {epoch, tonumber(ARGV[3])}
