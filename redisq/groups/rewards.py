"""The Lua scripts that end a group: the reward script (which publishes the groups it completes
when the Lua credit rule covers them) and the publish script (the Python path's second step).

A group's end, exactly once: only the reward script leaves ``open`` for good (atomically with
its last reward), and a group leaves ``complete`` only through ``end_group``, atomically with
its XADD. The reward that completes a group publishes it in the same script when every
rewarded episode is outcome-only (``gspo_rl.redisq.groups.credit``); otherwise the group is
left ``complete`` (in the complete set) with its snapshot returned, the caller runs the Python rule
and ``PUBLISH_GROUP`` carries out the decision; a caller that dies in between leaves it to the
sweeper (``gspo_rl.redisq.groups.store.RolloutStore.sweep_once``).

Publishing is by reference (``gspo_rl.contract.schema``): the entry is the head and the
rollout ids; the records stay where the sampling path wrote them and only lose their TTL.
"""

from __future__ import annotations

from gspo_rl.redisq.groups.credit import CREDIT_LUA
from gspo_rl.redisq.groups.scripts import COMMON
from gspo_rl.redisq.lua import LuaScript

# end_group(P, gid, mode, reason, head, ids, packed_ids, all_rids, partial, now, in_set,
#           n_rewards, reward_sum):
# publishes (XADD head + packed ids, and the group id when its records are one key, P.bk;
# the records' TTL removed) or drops the group, then the
# bookkeeping: state, stream_id or drop_reason (and completed_at when now is given),
# counters, the finished-rewards totals (n_rewards > 0: what the group scored, published or
# dropped; ``gspo_rl.learner.runtime.target`` reads them), SREM from the complete set
# (in_set), the group's keys and its rollout -> group mappings shortened to finished_ttl (P.ttl),
# its unpublished records to records_ttl (P.rttl; 0 deletes them: the group's state is its
# tombstone). A missing record (expired) turns a publish into a drop (missing_rollouts). Returns
# {'published', sid} or {'dropped', reason}. P: gk, lk, wk (the group's keys), counters,
# complete, stream, finished (the totals' hash), r_head, r_tail, m_head, m_tail, ttl, rttl,
# head_field, ids_field, records_field, and bk: the group's records key when the group was
# recorded whole (its hash has ``records``), else nil; members: its rollout ids name it (no
# rollout -> group keys).
_END_GROUP = COMMON + """
local function end_group(P, gid, mode, reason, head, ids, packed_ids, all_rids, partial, now,
                         in_set, n_rewards, reward_sum)
  local rks, moved, sid = {}, {}, nil
  if P.bk then rks[1] = P.bk  -- the group's records are one key
  else
    for i, rid in ipairs(ids) do rks[i] = P.r_head .. rid .. P.r_tail end
  end
  if mode == 'publish' and (#ids == 0 or redis.call('EXISTS', unpack(rks)) < #rks) then
    mode, reason = 'drop', 'missing_rollouts'
  end
  local fields
  if mode == 'publish' then
    if P.bk then
      sid = redis.call('XADD', P.stream, '*', P.head_field, head, P.ids_field, packed_ids,
        P.records_field, gid)
    else
      sid = redis.call('XADD', P.stream, '*', P.head_field, head, P.ids_field, packed_ids)
      for _, rid in ipairs(ids) do moved[rid] = true end
    end
    for _, rk in ipairs(rks) do redis.call('PERSIST', rk) end
    fields = {'state', 'published', 'stream_id', sid}
    redis.call('HINCRBY', P.counters, 'groups_published', 1)
    if partial then redis.call('HINCRBY', P.counters, 'groups_published_partial', 1) end
  else
    fields = {'state', 'dropped', 'drop_reason', reason}
    redis.call('HINCRBY', P.counters, 'groups_dropped_' .. reason, 1)
  end
  if now then
    fields[5], fields[6] = 'completed_at', tostring(now)
  end
  redis.call('HSET', P.gk, unpack(fields))
  -- pcall: a sum that is or would become infinite is refused by Redis; a raised error would
  -- end the script half-way (its writes so far kept), so that group is left out of the totals
  if n_rewards > 0 and type(redis.pcall('HINCRBYFLOAT', P.finished, 'sum', reward_sum))
      ~= 'table' then
    redis.call('HINCRBY', P.finished, 'groups', 1)
    redis.call('HINCRBY', P.finished, 'rewards', n_rewards)
  end
  if in_set then redis.call('SREM', P.complete, gid) end
  if not (P.bk and P.members) then
    for _, rid in ipairs(all_rids) do
      if not P.bk and not moved[rid] then shorten(P.r_head .. rid .. P.r_tail, P.rttl) end
      if not P.members then shorten(P.m_head .. rid .. P.m_tail, P.ttl) end
    end
  end
  if P.bk and not sid then shorten(P.bk, P.rttl) end
  shorten(P.gk, P.ttl)
  shorten(P.lk, P.ttl)
  shorten(P.wk, P.ttl)
  if sid then return {'published', sid} end
  return {'dropped', reason}
end
"""

# mode: publish | drop; head: the record's bytes before the rollouts; packed_ids: msgpack
# list of the rollout ids to publish (also passed one by one as rollout_ids); n_rewards and
# reward_sum: the final rewards' count and sum (both 0 for a group without rewards);
# finished_key: the totals' hash (groups, rewards, sum).
# Ends a complete group exactly once (end_group): anything but 'complete' returns {} (another
# finisher won, or the group moved on). Returns {'published', stream id} | {'dropped', reason}.
PUBLISH_GROUP = LuaScript(
    keys=("group_key", "rollouts_key", "rewards_key", "complete_key", "counters_key", "stream_key",
          "finished_key"),
    args=("group_id", "mode", "reason", "finished_ttl", "r_head", "r_tail", "m_head", "m_tail",
          "head", "packed_ids", "head_field", "ids_field", "n_rewards", "reward_sum", "b_head",
          "b_tail", "records_field", "records_ttl"),
    rest="rollout_ids",
    helpers=_END_GROUP,
    body="""
local st = redis.call('HMGET', group_key, 'state', 'partial', 'records', 'members')
if st[1] ~= 'complete' then return {} end
local P = {gk = group_key, lk = rollouts_key, wk = rewards_key, complete = complete_key,
  counters = counters_key, stream = stream_key, finished = finished_key,
  ttl = tonumber(finished_ttl), rttl = tonumber(records_ttl), r_head = r_head,
  r_tail = r_tail, m_head = m_head,
  m_tail = m_tail, head_field = head_field, ids_field = ids_field,
  records_field = records_field, bk = st[3] and (b_head .. group_id .. b_tail) or nil,
  members = st[4] == '1'}
local ids = {}
for i = rollout_ids_at, #ARGV do ids[#ids + 1] = ARGV[i] end
return end_group(P, group_id, mode, reason, head, ids, packed_ids,
  redis.call('LRANGE', rollouts_key, 0, -1), st[2] == '1', nil, true, tonumber(n_rewards),
  reward_sum)
""")

# Key templates (head .. id .. tail): m rollout->group, g group, w rewards, l group rollouts,
# r rollout, b a group's records. inline: 1 publishes the groups the Lua credit rule covers
# here; scale, drop_zero_variance: 1/0; advantage_config: msgpack; pairs: n_pairs pairs
# (rollout_id, packed reward).
# All items are checked first; if any fails nothing is written. Returns {statuses, group ids,
# completed}: status ok | duplicate | unknown_rollout | conflict | closed:<state>; completed
# has, per group this call completed, {group id, 'published', stream id} or {group id,
# 'dropped', reason} when it was ended here, else {group id, 'complete', metadata, rollout
# ids, rewards (flat hash)}: what the Python rule needs, so the caller does not read it back.
POST_REWARDS = LuaScript(
    keys=("counters_key", "complete_key", "deadlines_key", "stream_key", "finished_key",
          "active_key"),
    args=("m_head", "m_tail", "g_head", "g_tail", "w_head", "w_tail", "l_head", "l_tail", "r_head",
          "r_tail", "inline", "eps", "scale", "drop_zero_variance", "advantage_config",
          "finished_ttl", "records_ttl", "idle_s", "head_field", "ids_field", "b_head", "b_tail",
          "records_field", "n_pairs"),
    rest="pairs",
    helpers=_END_GROUP + CREDIT_LUA,
    body="""
local n = tonumber(n_pairs)
local statuses, gids = {}, {}
local all_ok = true
local mks = {}
for i = 1, n do mks[i] = m_head .. ARGV[pairs_at + 2 * i - 2] .. m_tail end
local owners = redis.call('MGET', unpack(mks))
-- An id without a mapping may name its group ('<group id>:<index>', a group recorded whole
-- with such ids: its hash has ``members``); checked below, once the group is read.
local member = {}
for i = 1, n do
  if not owners[i] then
    owners[i], member[i] = member_of(ARGV[pairs_at + 2 * i - 2])
  end
end
-- gid -> {state, size, had (rewards stored before), at (positions of its items), prev
-- (their stored rewards), items (rollout id, packed reward, ...) to store};
-- one HMGET of the group's state and one of its stored rewards per group, not per item
local groups, order, pos = {}, {}, {}
for i = 1, n do
  local gid = owners[i]
  if gid then
    local g = groups[gid]
    if not g then
      g = {at = {}, items = {}}
      groups[gid] = g
      order[#order + 1] = gid
    end
    g.at[#g.at + 1] = i
    pos[i] = #g.at
  end
end
for _, gid in ipairs(order) do
  local g = groups[gid]
  local h = redis.call('HMGET', g_head .. gid .. g_tail, 'state', 'size', 'n_rewarded',
    'records', 'members')
  g.state, g.size, g.had = h[1], tonumber(h[2]), tonumber(h[3] or 0)
  g.n_records, g.members = tonumber(h[4] or 0), h[5] == '1'
  local rids = {}
  for k, i in ipairs(g.at) do rids[k] = ARGV[pairs_at + 2 * i - 2] end
  g.prev = redis.call('HMGET', w_head .. gid .. w_tail, unpack(rids))
end
for i = 1, n do
  local rid, packed = ARGV[pairs_at + 2 * i - 2], ARGV[pairs_at + 2 * i - 1]
  local gid = owners[i]
  local status
  if gid and member[i] and not (groups[gid].members and member[i] < groups[gid].n_records) then
    gid = nil  -- of that form, but not one of its group's ids
  end
  if not gid then
    status = 'unknown_rollout'
    gid = ''
  else
    local g = groups[gid]
    local prev = g.prev[pos[i]]
    if prev then
      if prev == packed then status = 'duplicate' else status = 'conflict' end
    elseif not g.state then status = 'closed:gone'
    elseif g.state ~= 'open' then status = 'closed:' .. g.state
    else
      status = 'ok'
      g.items[#g.items + 1] = rid
      g.items[#g.items + 1] = packed
    end
  end
  if status ~= 'ok' and status ~= 'duplicate' then all_ok = false end
  statuses[i], gids[i] = status, gid
end
local completed = {}
if not all_ok then return {statuses, gids, completed} end

-- The group's end in this script, when the Lua credit rule covers it; nil otherwise.
local function end_here(gid, gk, lk, wk, rids, now, items, n_records, members)
  local vals, mine, all_mine = {}, {}, true
  for k = 1, #items, 2 do mine[items[k]] = items[k + 1] end
  for i, rid in ipairs(rids) do
    vals[i] = mine[rid]
    all_mine = all_mine and vals[i] ~= nil
  end
  if not all_mine then vals = redis.call('HMGET', wk, unpack(rids)) end
  local ids, rewards, has_tr, turns = outcome_entries(rids, vals)
  if not ids then return nil end
  local P = {gk = gk, lk = lk, wk = wk, complete = complete_key, counters = counters_key,
    stream = stream_key, finished = finished_key, ttl = tonumber(finished_ttl),
    rttl = tonumber(records_ttl), r_head = r_head,
    r_tail = r_tail, m_head = m_head, m_tail = m_tail, head_field = head_field,
    ids_field = ids_field, records_field = records_field,
    bk = n_records > 0 and (b_head .. gid .. b_tail) or nil, members = members}
  local mode, reason, head = 'publish', '', ''
  if #ids == 0 then
    mode, reason = 'drop', 'no_rewards'
  else
    local adv, signal = outcome_credit(rewards, tonumber(eps), scale == '1')
    if drop_zero_variance == '1' and not signal then
      mode, reason = 'drop', 'zero_variance'
    else
      head = ready_head(gid, redis.call('HGET', gk, 'metadata') or '\\128', now, rewards,
        adv, has_tr, turns, advantage_config)
    end
  end
  local total = 0.0
  for _, r in ipairs(rewards) do total = total + r end
  local ended = end_group(P, gid, mode, reason, head, ids,
    mode == 'publish' and mp_ids(ids) or '', rids, false, now, false, #rewards,
    string.format('%.17g', total))
  ended[3] = cmsgpack.pack(rewards)  -- the caller's task statistics (tasks.record_outcomes)
  return ended
end

local stored, now = 0, nil
for _, gid in ipairs(order) do
  local g = groups[gid]
  if #g.items > 0 then
    local gk, wk = g_head .. gid .. g_tail, w_head .. gid .. w_tail
    redis.call('HSET', wk, unpack(g.items))
    if g.had == 0 then  -- the group's first rewards: the hash is new, give it the group's TTL
      redis.call('EXPIREAT', wk, redis.call('EXPIRETIME', gk))
    end
    stored = stored + #g.items / 2
    local count = redis.call('HINCRBY', gk, 'n_rewarded', #g.items / 2)
    if count >= g.size then
      now = now or now_s()
      redis.call('ZREM', deadlines_key, gid)
      redis.call('ZREM', active_key, gid)
      local lk = l_head .. gid .. l_tail
      local rids = redis.call('LRANGE', lk, 0, -1)
      local ended = inline == '1' and end_here(gid, gk, lk, wk, rids,
        now, g.items, g.n_records, g.members)
      if ended then
        completed[#completed + 1] = {gid, ended[1], ended[2],
          redis.call('HGET', gk, 'metadata') or false, ended[3]}
      else
        redis.call('HSET', gk, 'state', 'complete', 'completed_at', tostring(now))
        redis.call('SADD', complete_key, gid)
        completed[#completed + 1] = {gid, 'complete', redis.call('HGET', gk, 'metadata'),
          rids, redis.call('HGETALL', wk)}
      end
    else
      touch(active_key, gid, idle_s)
    end
  end
end
if stored > 0 then redis.call('HINCRBY', counters_key, 'rewards_stored', stored) end
if n - stored > 0 then redis.call('HINCRBY', counters_key, 'rewards_duplicate', n - stored) end
return {statuses, gids, completed}
""")
