-- _audit: the one way every script appends to the audit stream, chained (docs/protocol.md, "the audit chain").
-- Not a script of its own: a script that calls audit_append includes it (a line '--! include _audit', which
-- broker/_lua.py replaces with this code on one line, so the script's own line numbers hold); so no comment may
-- follow code here.
-- audit_append(stream key, max length, field, value, ...) returns the new entry's id.
-- Each entry starts with prev: the chain head before it, '<entry id> <chain>' ('' for the first), and ends with
-- chain: the SHA-1 hex of every field and value before it, each as '<byte length>:<bytes>'. The head is kept
-- in '<stream key>:head' (the same hash tag: the same slot), written here only, in the same script as the entry.
-- prev comes first so that no one can know what is hashed before the entry is written (docs/security.md).
-- fakeredis has no redis.sha1hex: there chain is '' and `qbroker audit verify` reports the entries unchained.
local function audit_append(key, maxlen, ...)
  local head_key = key .. ':head'
  local fields = {'prev', redis.call('GET', head_key) or '', ...}
  local parts = {}
  for i = 1, #fields do
    local value = fields[i]
    if type(value) ~= 'string' then
      value = tostring(value)
      fields[i] = value
    end
    parts[2 * i - 1] = #value .. ':'
    parts[2 * i] = value
  end
  local chain = ''
  if redis.sha1hex then
    chain = redis.sha1hex(table.concat(parts))
  end
  fields[#fields + 1] = 'chain'
  fields[#fields + 1] = chain
  local id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  redis.call('SET', head_key, id .. ' ' .. chain)
  return id
end
