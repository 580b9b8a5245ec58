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
-- A person's decision (event answered, cancelled, vote, remembered, forgotten: broker/audit.py HUMAN_EVENTS) is
-- also copied, same id and fields, into the human record '<stream key>:human', capped alike, which nothing else
-- enters: no volume of asker-caused entries (withdrawn, expired, away, ...) trims it. Its entries carry (before
-- chain, so hashed) hprev, the record's head before it ('<stream key>:human:head'), chaining the decisions on their
-- own, and hcap, the cap it was written under: only that XADD trims the record, which leaves at least hcap entries,
-- so a record that names a trimmed predecessor and holds fewer was cut (verify reports it).
-- An automatic provider (qbroker auto) writes its epoch to '<stream key>:automatic' when it takes the lease: an entry
-- of that epoch is its settlement, no person's, and stays out of the record (an asker's volume of them would fill it).
-- The copy is a pcall: a record that refuses it (an id at or below its last) never fails the decision; verify
-- reports a decision missing from its record.
-- Every append runs inside a settlement, where each Redis command counts (docs/benchmarks-budget.md): the chain head,
-- the automatic epoch and the record's head are read in one MGET, once per script run (a settle call's later
-- appends follow the heads it wrote), and the heads written in one MSET (one hash tag: one slot). Each field's
-- length is written with string.format('%d'): Lua's `..` on a
-- number goes through the C library's float printer ('%.14g'), which was most of Redis's number formatting per ask.
-- Each length's '<n>:' is formatted once per script run (audit_lengths): a settle call's entries share most of
-- theirs, and a string.format was a tenth of Redis's work per settled asker. The pieces hashed go in one table
-- per run (audit_parts), reused by each append up to its own length, so that a batch builds no table per entry.
local audit_human_events = {answered = true, cancelled = true, vote = true, remembered = true, forgotten = true}
local audit_read = {}
local audit_lengths = {}
local audit_parts = {}
local function audit_heads(key)
  local heads = audit_read[key]
  if heads == nil then
    local read = redis.call('MGET', key .. ':head', key .. ':automatic', key .. ':human:head')
    heads = {read[1] or '', read[2] or '', read[3] or ''}
    audit_read[key] = heads
  end
  return heads
end
local function audit_append(key, maxlen, ...)
  local head_key, human_key = key .. ':head', key .. ':human'
  local heads = audit_heads(key)
  local fields = {'prev', heads[1], ...}
  local human = fields[3] == 'event' and audit_human_events[fields[4]]
  local automatic = human and heads[2]
  if automatic and automatic ~= '' then
    for i = 5, #fields - 1, 2 do
      if fields[i] == 'epoch' and tostring(fields[i + 1]) == automatic then
        human = false
      end
    end
  end
  if human then
    fields[#fields + 1] = 'hprev'
    fields[#fields + 1] = heads[3]
    fields[#fields + 1] = 'hcap'
    fields[#fields + 1] = maxlen
  end
  local parts = audit_parts
  for i = 1, #fields do
    local value = fields[i]
    if type(value) ~= 'string' then
      value = tostring(value)
      fields[i] = value
    end
    local length = audit_lengths[#value]
    if not length then
      length = string.format('%d:', #value)
      audit_lengths[#value] = length
    end
    parts[2 * i - 1] = length
    parts[2 * i] = value
  end
  local chain = ''
  if redis.sha1hex then
    chain = redis.sha1hex(table.concat(parts, '', 1, 2 * #fields))
  end
  fields[#fields + 1] = 'chain'
  fields[#fields + 1] = chain
  local id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  heads[1] = id .. ' ' .. chain
  local writes = {head_key, heads[1]}
  if human and type(redis.pcall('XADD', human_key, 'MAXLEN', '~', maxlen, id, unpack(fields))) == 'string' then
    heads[3] = id .. ' ' .. chain
    writes[3], writes[4] = human_key .. ':head', heads[3]
  end
  redis.call('MSET', unpack(writes))
  return id
end
