"""Lua scripts run atomically inside Redis by :mod:`services.queues.redis_backend`.

Each script does one step of the queue protocol in a single round trip, so a retry after
a lost reply (Redis restarting mid-call) can never half-apply it.
"""

from __future__ import annotations

# Ledger update shared by several scripts. Expects locals: lh (hash sid -> stage),
# lo (zset sid -> recency), ln (recency counter key), lmax (max entries).
_LEDGER_FN = """
local function ledger_set(lh, lo, ln, sid, stage)
  redis.call('HSET', lh, sid, stage)
  redis.call('ZADD', lo, redis.call('INCR', ln), sid)
end
local function ledger_trim(lh, lo, lmax)
  local over = redis.call('HLEN', lh) - lmax
  if over > 0 then
    local old = redis.call('ZPOPMIN', lo, over)
    for j = 1, #old, 2 do redis.call('HDEL', lh, old[j]) end
  end
end
"""

PUT = (
    _LEDGER_FN
    + """
-- KEYS: 1 stream, 2 producer seq key, 3 ledger hash, 4 ledger zset, 5 ledger counter
-- ARGV: 1 max_depth, 2 seq ttl (s), 3 stage or '', 4 ledger max, 5 producer, 6 n items,
--       then per item 5 args: seq, sample ids (JSON list), kind ('d' inline | 'k' key), value, nbytes
-- Appends items in order while the stream holds fewer than max_depth entries.
-- Returns {gaps, status, id_1, ..., id_k}: id '' = duplicate seq (already accepted);
-- status 'ok' | 'full' (stopped at max depth) | 'blob' (a large-frame key is missing).
local maxd = tonumber(ARGV[1])
local stage = ARGV[3]
local lmax = tonumber(ARGV[4])
local producer = ARGV[5]
local n = tonumber(ARGV[6])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local len = redis.call('XLEN', KEYS[1])
local out = {}
local gaps = 0
local status = 'ok'
local a = 7
for k = 1, n do
  local seq = tonumber(ARGV[a])
  if seq <= last then
    out[#out + 1] = ''
  else
    if len >= maxd then status = 'full'; break end
    if ARGV[a + 2] == 'k' and redis.call('EXISTS', ARGV[a + 3]) == 0 then status = 'blob'; break end
    if seq > last + 1 then gaps = gaps + (seq - last - 1) end
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'p', producer, 's', ARGV[a], 'i', ARGV[a + 1],
                               'n', ARGV[a + 4], ARGV[a + 2], ARGV[a + 3])
    last = seq
    len = len + 1
    if stage ~= '' then
      for _, sid in ipairs(cjson.decode(ARGV[a + 1])) do ledger_set(KEYS[3], KEYS[4], KEYS[5], sid, stage) end
    end
  end
  a = a + 5
end
redis.call('SET', KEYS[2], last, 'EX', tonumber(ARGV[2]))
if stage ~= '' then ledger_trim(KEYS[3], KEYS[4], lmax) end
table.insert(out, 1, status)
table.insert(out, 1, gaps)
return out
"""
)

CLAIM = """
-- Dedupe: the first entry delivered with a sample_id owns it (within a bounded window).
-- KEYS: 1 claims hash (sid -> entry id), 2 claims zset (sid -> age), 3 counter key
-- ARGV: 1 window, 2 JSON [[entry id, [sid, ...]], ...]
-- Returns one string per entry, one char per sample: '1' fresh (ours), '0' duplicate.
-- Reads and writes in batches (HMGET / HSET / ZADD of up to 1000 ids per call).
local window = tonumber(ARGV[1])
local pairs_ = cjson.decode(ARGV[2])
local sids = {}
for _, pair in ipairs(pairs_) do
  for _, sid in ipairs(pair[2]) do sids[#sids + 1] = sid end
end
local owner = {}
for j = 1, #sids, 1000 do
  local part = {unpack(sids, j, math.min(j + 999, #sids))}
  local got = redis.call('HMGET', KEYS[1], unpack(part))
  for k, sid in ipairs(part) do
    if got[k] then owner[sid] = got[k] end
  end
end
local new = {}
local out = {}
for e, pair in ipairs(pairs_) do
  local id = pair[1]
  local flags = {}
  for j, sid in ipairs(pair[2]) do
    local cur = owner[sid]
    if not cur then
      owner[sid] = id
      new[#new + 1] = sid
      flags[j] = '1'
    elseif cur == id then
      flags[j] = '1'
    else
      flags[j] = '0'
    end
  end
  out[e] = table.concat(flags)
end
if #new > 0 then
  local base = redis.call('INCRBY', KEYS[3], #new) - #new
  for j = 1, #new, 500 do
    local hargs, zargs = {}, {}
    for k = j, math.min(j + 499, #new) do
      local sid = new[k]
      hargs[#hargs + 1] = sid
      hargs[#hargs + 1] = owner[sid]
      zargs[#zargs + 1] = base + k
      zargs[#zargs + 1] = sid
    end
    redis.call('HSET', KEYS[1], unpack(hargs))
    redis.call('ZADD', KEYS[2], unpack(zargs))
  end
end
local over = redis.call('HLEN', KEYS[1]) - window
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for j = 1, #old, 2 do redis.call('HDEL', KEYS[1], old[j]) end
end
return out
"""

ACK = (
    _LEDGER_FN
    + """
-- KEYS: 1 stream, 2 ledger hash, 3 ledger zset, 4 ledger counter
-- ARGV: 1 group, 2 stage or '', 3 ledger max, 4 JSON [entry id, ...], 5 JSON [large-frame key, ...],
--       6 JSON [sample id, ...] (stage only)
-- XACK + XDEL the entries, delete their large-frame keys, record the stage. Returns #acked.
local ids = cjson.decode(ARGV[4])
local acked = 0
for j = 1, #ids, 1000 do
  local part = {unpack(ids, j, math.min(j + 999, #ids))}
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(part))
  redis.call('XDEL', KEYS[1], unpack(part))
end
for _, key in ipairs(cjson.decode(ARGV[5])) do redis.call('DEL', key) end
if ARGV[2] ~= '' then
  for _, sid in ipairs(cjson.decode(ARGV[6])) do ledger_set(KEYS[2], KEYS[3], KEYS[4], sid, ARGV[2]) end
  ledger_trim(KEYS[2], KEYS[3], tonumber(ARGV[3]))
end
return acked
"""
)

LEDGER = (
    _LEDGER_FN
    + """
-- KEYS: 1 ledger hash, 2 ledger zset, 3 ledger counter. ARGV: 1 stage, 2 ledger max, sids...
for j = 3, #ARGV do ledger_set(KEYS[1], KEYS[2], KEYS[3], ARGV[j], ARGV[1]) end
ledger_trim(KEYS[1], KEYS[2], tonumber(ARGV[2]))
return #ARGV - 2
"""
)
