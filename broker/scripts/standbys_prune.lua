#!lua
-- standbys_prune: drop standby registrations whose expiry (zset score, unix ms) has passed.
-- KEYS[1] standbys  the standbys zset
-- returns the number of registrations dropped
-- Judged by the Redis clock, the one lease_acquire.lua scores with.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
