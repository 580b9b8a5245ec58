#!lua
--! include _audit
-- audit_append: append one entry to the audit stream, chained like every other (the answering side's checkpoints).
-- KEYS[1] audit      the audit stream
-- ARGV[1] audit_max  the audit's max length
-- ARGV[2] head       the chain head the entry must follow ('<entry id> <chain>'; '' for any)
-- then fields: the entry's fields and values, from ARGV[3]
-- returns {'ok', entry id} | {'moved', the current head} (nothing written)
-- A checkpoint names the head it signs: it is written only right after that head, so that it seals everything
-- before it.
if ARGV[2] ~= '' and (redis.call('GET', KEYS[1] .. ':head') or '') ~= ARGV[2] then
  return {'moved', redis.call('GET', KEYS[1] .. ':head') or ''}
end
return {'ok', audit_append(KEYS[1], ARGV[1], unpack(ARGV, 3))}
