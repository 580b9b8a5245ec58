#!lua
-- durable_release: a keyed ask's asker received its outcome: its key no longer names a request.
-- KEYS[1] durable  the durable key (qb:{NS}:key:<digest>)
-- ARGV[1] rid      the request id the asker received the outcome of
-- returns 1 when the key was released, 0 when it names another request (asked anew since) or none
-- Without this the key lived twice the request TTL past its answer (issue 23, case 11). Idempotent.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
