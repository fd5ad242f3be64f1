"""The learner reader's Lua scripts (``gspo_rl.redisq.ready.reader``): delivery with its
count, and the ack with the trim. Each is one atomic step in Redis."""

from __future__ import annotations

from gspo_rl.redisq.lua import LuaScript

# r and b: the key templates of a rollout's record and of a group's records; ids_field and
# records_field: the entry's fields that name them; keep_s: seconds the records of a trimmed
# entry stay readable (0: deleted at once); entry_ids: the stream ids to acknowledge.
# XACK (counting the newly acked as groups_acked), then trims the stream below the oldest id
# any consumer group still needs (its oldest pending entry, else the one after its last
# delivered), giving each trimmed entry's records their expiry (or deleting them): the
# group's one records key when the entry names it, else each rollout's.
# Returns {newly acked, entries trimmed}. Ids are compared as (ms, seq) numbers: ms < 2^53
# is exact in Lua.
ACK_AND_TRIM = LuaScript(
    keys=("stream_key", "counters_key"),
    args=("consumer_group", "r_head", "r_tail", "ids_field", "keep_s", "b_head", "b_tail",
          "records_field"),
    rest="entry_ids",
    body="""
local newly = 0
for i = entry_ids_at, #ARGV, 1000 do
  newly = newly + redis.call('XACK', stream_key, consumer_group,
    unpack(ARGV, i, math.min(#ARGV, i + 999)))
end
if newly > 0 then redis.call('HINCRBY', counters_key, 'groups_acked', newly) end
if redis.call('EXISTS', stream_key) == 0 then return {newly, 0} end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local min_ms, min_seq = nil, nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream_key)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local ms, seq
  if tonumber(info['pending']) > 0 then
    ms, seq = parse(redis.call('XPENDING', stream_key, info['name'], '-', '+', 1)[1][1])
  else
    ms, seq = parse(info['last-delivered-id'])
    seq = seq + 1
  end
  if not min_ms or ms < min_ms or (ms == min_ms and seq < min_seq) then
    min_ms, min_seq = ms, seq
  end
end
if not min_ms then return {newly, 0} end
local minid = string.format('%d-%d', min_ms, min_seq)
local keep = tonumber(keep_s)
local function release(key)
  if keep > 0 then redis.call('EXPIRE', key, keep) else redis.call('DEL', key) end
end
for _, e in ipairs(redis.call('XRANGE', stream_key, '-', '(' .. minid)) do
  local f, ids, group = e[2], nil, nil
  for i = 1, #f, 2 do
    if f[i] == ids_field then ids = f[i + 1] elseif f[i] == records_field then group = f[i + 1] end
  end
  if group then release(b_head .. group .. b_tail)
  elseif ids then
    for _, rid in ipairs(cmsgpack.unpack(ids)) do release(r_head .. rid .. r_tail) end
  end
end
return {newly, redis.call('XTRIM', stream_key, 'MINID', minid)}
""")


# count_key, count_field, delivered (optional): the hash and field the count goes to, and the
# groups delivered to the batch before this call.
# XREADGROUP of up to ``count`` new entries, never blocking. With a second key, the field is
# set to the groups delivered to the batch so far *in the same atomic step*: the learner's
# ``training`` count (``gspo_rl.contract.admission``), which the servers' admission gate reads with
# the stream's lag, so a group that leaves the stream is never counted nowhere (as it was for
# a round trip when the count followed the XREADGROUP). Returns {entries, false} when some
# were delivered, else {{}, the group's last-delivered id}: where the caller's blocking wait
# for newer entries (XREAD, which delivers nothing) starts.
DELIVER = LuaScript(
    keys=("stream_key", "count_key?"),
    args=("consumer_group", "consumer", "count", "count_field?", "delivered?"),
    body="""
local res = redis.call('XREADGROUP', 'GROUP', consumer_group, consumer, 'COUNT', count,
  'STREAMS', stream_key, '>')
local entries = res and res[1][2] or {}
if #entries > 0 then
  if count_key then redis.call('HSET', count_key, count_field, tonumber(delivered) + #entries) end
  return {entries, false}
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream_key)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == consumer_group then return {entries, info['last-delivered-id']} end
end
return {entries, '0-0'}
""")
