-- _ask_decisions: remembered decisions (issue 15) answer an ask in ask.lua when every question has a live one.
-- Not a script of its own: ask.lua includes it (a line '--! include _ask_decisions', which broker/_lua.py replaces with
-- this code on one line); so no comment may follow code here.
-- ask_decided(k, a, fp, now) (k, a: ask.lua's named KEYS and ARGV; fp the agent token's fingerprint; now Redis ms)
-- returns {'decided', outcome JSON, now, records}, or nil when the ask is not looked up (a.remember is not '1', or
-- no question is: a.questions empty) or a question has no live decision.
-- Per question the agent's decision key is read first, then the namespace's (a.decision_keys holds both, in that
-- order; the namespace's twice when no agent). Most asks find none: one EXISTS of them all says so, where reading
-- each (two HMGETs a question) would cost every ask more Redis commands (docs/benchmarks-budget.md).
-- The request is settled here as answered: request hash (by 'decision:<id>[,<id>...]'), outcome key, askers' log
-- 'answered'; nothing is enqueued. records: per question its
-- decision's id, selected labels and signature (proof), which the asker verifies before the answer counts (a
-- decision hash is only as trustworthy as its signature: broker/decisions.py verified_decisions). The answer
-- echoes this request's question ids.
local function ask_decided(k, a, fp, now)
  if a.remember ~= '1' or #a.questions == 0 then
    return nil
  end
  if redis.call('EXISTS', unpack(a.decision_keys)) == 0 then
    return nil
  end
  local items, ids, setters, records = {}, {}, {}, {}
  for i, question in ipairs(a.questions) do
    local mine, shared = a.decision_keys[2 * i - 1], a.decision_keys[2 * i]
    local d = redis.call('HMGET', mine, 'id', 'selected', 'by', 'provider', 'proof')
    if not d[1] and shared ~= mine then
      d = redis.call('HMGET', shared, 'id', 'selected', 'by', 'provider', 'proof')
    end
    if not d[1] then
      return nil
    end
    items[#items + 1] = '{"id":' .. cjson.encode(question) .. ',"selected":' .. d[2] .. '}'
    ids[#ids + 1] = d[1]
    setters[#setters + 1] = (d[3] or '') .. ' via ' .. (d[4] or '')
    records[#records + 1] = d[1]
    records[#records + 1] = d[2] or ''
    records[#records + 1] = d[5] or ''
  end
  local decided = '{"answer":{"answers":[' .. table.concat(items, ',') .. ']}}'
  local by = 'decision:' .. table.concat(ids, ',')
  redis.call('HSET', k.request, 'state', 'answered', 'request', a.body, 'agent', a.agent, 'agent_fp', fp,
    'client', a.client, 'created', now, 'deadline', '', 'by', by, 'settle_call', by)
  redis.call('PEXPIRE', k.request, a.result_ttl)
  redis.call('SET', k.outcome, decided, 'PX', a.result_ttl)
  redis.call('XADD', k.asklog, 'MAXLEN', '~', a.log_max, '*', 'event', 'answered', 'rid', a.rid, 'agent', a.agent,
    'client', a.client, 'by', by, 'decided_by', table.concat(setters, ', '), 'outcome', decided)
  return {'decided', decided, now, records}
end
