"""The Lua scripts of the Redis bus (each touches keys of one Cluster slot only).

Scripts are hand-written for atomicity: a delivery append and the writer's
state are one step, and group membership with its leases is another.
"""

from __future__ import annotations

_APPEND_ONE = """
-- Append one stream's entries. stream, meta, control: its keys; keep: seqs kept
-- (MINID ~ <last seq - keep + 1>); ttl, grace: ms; state: the writer state to store, or
-- false (not stored when every event given is older than the stream's last); ends: these events hold the run's own terminal event: from then on the stream,
-- its meta hash and the control stream live only the grace after each append (a worker
-- that later finds no writer state asks the replay log whether the run ended: see
-- Stages._load_states); ARGV[from..to]: pairs,
-- one per entry: its seqs ('first+count' when consecutive, else 'seq,seq,...',
-- increasing) and its events' canonical JSON joined by "\\n" (canonical JSON never holds
-- a raw newline). An entry gets id '<its last seq>-0' and fields s (seqs) and e (events);
-- events whose seq is not above the stream's last are left out of it. Returns how many
-- events were appended.
local function parse(spec)
  local plus = string.find(spec, '+', 1, true)
  if plus then
    local first = tonumber(string.sub(spec, 1, plus - 1))
    local count = tonumber(string.sub(spec, plus + 1))
    return first, first + count - 1, count, nil
  end
  local seqs = {}
  for s in string.gmatch(spec, '[^,]+') do seqs[#seqs + 1] = tonumber(s) end
  return seqs[1], seqs[#seqs], #seqs, seqs
end

-- the part of an entry above seq `above` (its last seq is above it)
local function above_seq(spec, blob, above)
  local first, final, count, seqs = parse(spec)
  if first > above then return spec, blob, count end
  local skip, rest
  if seqs then
    skip = 0
    while seqs[skip + 1] <= above do skip = skip + 1 end
    rest = table.concat(seqs, ',', skip + 1)
  else
    skip = above - first + 1
    rest = (above + 1) .. '+' .. (final - above)
  end
  local pos = 1
  for _ = 1, skip do pos = string.find(blob, '\\n', pos, true) + 1 end
  return rest, string.sub(blob, pos), count - skip
end

local function append_one(stream, meta, control, keep, ttl, grace, state, ends, from, to)
  local got = redis.call('HMGET', meta, 'last', 'end')
  local last = got[1]
  if last then
    last = tonumber(last)
  else  -- no meta (new stream, or the hash was lost): the stream's last entry says
    local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    last = top[1] and tonumber(string.match(top[1][1], '^(%d+)')) or 0
  end
  local n, top = 0, nil
  for i = from, to, 2 do
    local spec, blob = ARGV[i], ARGV[i + 1]
    local _, final = parse(spec)
    if blob ~= '' then top = math.max(top or 0, final) end
    if blob ~= '' and final > last then
      local rest, part, count = above_seq(spec, blob, last)
      redis.call('XADD', stream, 'MINID', '~', math.max(0, final - keep + 1),
                 final .. '-0', 's', rest, 'e', part)
      n = n + count
      last = final
    end
  end
  if n > 0 and state then
    redis.call('HSET', meta, 'last', last, 'state', state)
  elseif n > 0 then
    redis.call('HSET', meta, 'last', last)
  elseif state and (top == nil or top >= last) then
    -- (events all older than the stream's last one: a late write of a writer that lost the
    -- stream, its lease expired while the write was held up; its state is older too)
    redis.call('HSET', meta, 'state', state)
  end
  local ended = ends or got[2] ~= false
  if ends and not got[2] then
    redis.call('HSET', meta, 'end', 1)
  end
  if ended then
    redis.call('PEXPIRE', stream, grace)
    redis.call('PEXPIRE', control, grace)
    redis.call('PEXPIRE', meta, grace)
  else
    redis.call('PEXPIRE', stream, ttl)
    redis.call('PEXPIRE', meta, ttl)
  end
  return n
end
"""

APPEND = _APPEND_ONE + """
-- One stream. KEYS[1] delivery stream, KEYS[2] its meta hash (last seq, writer state,
-- 'end' once the run ended), KEYS[3] the run's control stream.
-- ARGV[1] seqs kept, ARGV[2] ttl ms, ARGV[3] '1' when ARGV[4] is a state to store,
-- ARGV[5] grace ms, ARGV[6] '1' when these events hold the run's own terminal event,
-- ARGV[7], ARGV[8], ... the entries' pairs (see append_one).
return append_one(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2], ARGV[5],
                  ARGV[3] == '1' and ARGV[4], ARGV[6] == '1', 7, #ARGV)
"""

APPEND_MANY = _APPEND_ONE + """
-- Several streams in one call (a standalone server: the keys need not share a slot).
-- KEYS: three per stream, as APPEND's. ARGV[1] seqs kept, ARGV[2] ttl ms, ARGV[3] grace ms,
-- then per stream: '1' when a state follows else '0', the state (or ''), '1' when the
-- events hold the run's own terminal event, the number of entries, the entries' pairs.
-- Returns how many events each stream got.
local keep, ttl, grace = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local counts = {}
local at = 4
for k = 1, #KEYS, 3 do
  local entries = tonumber(ARGV[at + 3])
  local from = at + 4
  local to = from + 2 * entries - 1
  counts[#counts + 1] = append_one(KEYS[k], KEYS[k + 1], KEYS[k + 2], keep, ttl, grace,
                                   ARGV[at] == '1' and ARGV[at + 1], ARGV[at + 2] == '1', from, to)
  at = to + 1
end
return counts
"""

MEMBERSHIP = """
-- KEYS[1] the group's members zset (score = expiry ms), KEYS[2..] lease key of shard 0..N-1
-- ARGV[1] member name, ARGV[2] lease ms, ARGV[3] mode:
--   'rebalance' join, take free shards of my share, release shards outside it
--   'renew'     heartbeat; keep (renew) the leases I hold, take or release nothing
--   'leave'     leave the group and release my leases
-- returns the shards I hold afterwards
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, lease, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local owned = {}
if mode == 'leave' then
  redis.call('ZREM', KEYS[1], me)
  for s = 0, #KEYS - 2 do
    if redis.call('GET', KEYS[s + 2]) == me then redis.call('DEL', KEYS[s + 2]) end
  end
  return owned
end
redis.call('ZADD', KEYS[1], now + lease, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], lease * 10)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
local rank = 0
for i, name in ipairs(live) do
  if name == me then rank = i - 1 end
end
for s = 0, #KEYS - 2 do
  local key = KEYS[s + 2]
  local holder = redis.call('GET', key)
  local mine = (s % #live) == rank
  if holder == me and (mine or mode == 'renew') then
    redis.call('PEXPIRE', key, lease)
    table.insert(owned, s)
  elseif holder == me then
    redis.call('DEL', key)
  elseif mine and mode == 'rebalance' and not holder then
    redis.call('SET', key, me, 'PX', lease)
    table.insert(owned, s)
  end
end
return owned
"""

_INGEST_LIFE = """
-- KEYS[1]: an ingest shard; KEYS[2]: its life marker. ARGV[1]: the life the caller knows
-- ('' : none yet), ARGV[2]: the life to record if the marker is missing (Redis lost it).
local life = redis.call('GET', KEYS[2])
if not life then
  life = ARGV[2]
  redis.call('SET', KEYS[2], life)
end
local same_life = ARGV[1] == '' or ARGV[1] == life
local function before(a, b)  -- stream id a < stream id b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  return am < bm or (am == bm and tonumber(as) < tonumber(bs))
end
-- Whether Redis lost entry ``id`` it once acknowledged: not in the stream, and not trimmed
-- either. Trimming removes a prefix (what every group read, or the MAXLEN cap), so in the
-- same life an absent id after the first entry (or, the stream empty, after its last id
-- ever) was lost; in another life (the marker was lost: a restart without persistence, a
-- flush) every absent id was.
local function lost(id)
  if #redis.call('XRANGE', KEYS[1], id, id) > 0 then return false end
  if not same_life then return true end
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
  if first then return before(first[1], id) end
  if redis.call('EXISTS', KEYS[1]) == 0 then return true end
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for j = 1, #info, 2 do
    if info[j] == 'last-generated-id' then return before(info[j + 1], id) end
  end
  return true
end
"""

INGEST_ADD = _INGEST_LIFE + """
-- Add one publish's entries to one ingest shard, all of them or none. Redis checks
-- maxmemory before a script's first write only, so a publish refused at maxmemory leaves
-- no entry behind; were the entries separate XADDs, a later one could be accepted after an
-- earlier one was refused (memory freed in between), and the publisher's retry would then
-- bring a run's earlier events after its later ones, which a worker drops as duplicates.
-- ARGV[3]: the newest entry the caller keeps unconfirmed on this shard ('' : none); if Redis
-- lost it, nothing is written and the reply is {0, life}. Then quads, one per entry: the
-- id it had when published before ('' : a new entry; else it is added again only if Redis
-- lost it), MAXLEN ('0': none), field, value. Returns {1, life, id of each entry}.
if ARGV[3] ~= '' and lost(ARGV[3]) then return {0, life} end
local ids = {1, life}
for i = 4, #ARGV, 4 do
  local id = ARGV[i]
  if id == '' or lost(id) then
    if ARGV[i + 1] == '0' then
      id = redis.call('XADD', KEYS[1], '*', ARGV[i + 2], ARGV[i + 3])
    else
      id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[i + 1], '*', ARGV[i + 2], ARGV[i + 3])
    end
  end
  ids[#ids + 1] = id
end
return ids
"""

INGEST_CONFIRM = _INGEST_LIFE + """
-- ARGV[3]: the newest entry the caller keeps unconfirmed on this shard. Returns {0, life}
-- if Redis lost it, else {1, life, point, inclusive}: the oldest safe point of the shard's
-- groups ('' : no group). A group's safe point is its oldest pending entry (exclusive), or
-- with nothing pending its last-delivered-id (inclusive): what precedes it was read and
-- acked, and a worker acks only after its replay-log write. (Read is not enough: a worker
-- that loses a shard's lease drops what it fetched, for the next owner to claim from the
-- pending list, which Redis may have lost with the entries.)
if lost(ARGV[3]) then return {0, life} end
local point, inclusive = '', 1
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for j = 1, #group, 2 do
    if group[j] == 'name' then name = group[j + 1] end
    if group[j] == 'last-delivered-id' then delivered = group[j + 1] end
  end
  local pending = redis.call('XPENDING', KEYS[1], name)
  local at, incl = delivered, 1
  if pending[1] > 0 then at, incl = pending[2], 0 end
  if point == '' or before(at, point) or (at == point and incl == 0) then
    point, inclusive = at, incl
  end
end
return {1, life, point, inclusive}
"""
