"""The Lua scripts behind ``server.store`` and ``server.episode_store``: every multi-key change
of a group or an episode is one script.

A Lua script runs atomically in Redis, so a reward, its duplicate/conflict check, the group's
reward count and the open -> complete transition cannot interleave with another process's
reward for the same group, and publishing (``PUBLISH_GROUP``: check ``complete``, XADD, mark
``published``) happens once however many finishers race.

No large value ever passes through a script's arguments or replies (a 13 kB argument costs
Redis ~20x a plain SET of it): rollout records are written with plain SETs to a staging key
and *renamed* into place by the record script; publishing only references them (and removes
their TTL), so a rollout's bytes are written once, when sampled, and read once, by the
learner.

Key names are never spelled here: scripts that find a group id inside Redis build its keys
from ``head .. id .. tail`` templates that ``server.store`` derives from ``Keys``. Because
those keys are not declared in ``KEYS``, the scripts need a standalone (or managed,
non-cluster) Redis; a Redis Cluster would need every key of a group in one hash slot.

Times come from Redis's ``TIME`` so that every server process shares one clock. Keys of a
finished group are shortened with ``EXPIRE ... LT`` (never extended) to ``finished_ttl``.
"""

from __future__ import annotations

# Shared helpers, prepended to the scripts that need them.
_COMMON = """
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function shorten(key, ttl)
  redis.call('EXPIRE', key, ttl, 'LT')
end
-- Shortens the TTL of a finished group's keys and of its rollouts to ttl seconds.
local function expire_group(gk, rolk, rewk, r_head, r_tail, m_head, m_tail, ttl)
  for _, rid in ipairs(redis.call('LRANGE', rolk, 0, -1)) do
    shorten(r_head .. rid .. r_tail, ttl)
    shorten(m_head .. rid .. m_tail, ttl)
  end
  shorten(gk, ttl)
  shorten(rolk, ttl)
  shorten(rewk, ttl)
end
-- Opens a group (see CREATE_GROUP). Returns 1 created, 0 already exists with the same size,
-- -1 exists with another size.
local function create_group(gk, dk, ck, gid, size, metadata, group_ttl, finished_ttl)
  if redis.call('EXISTS', gk) == 1 then
    if redis.call('HGET', gk, 'size') == size then return 0 end
    return -1
  end
  local now = now_s()
  local deadline = now + tonumber(group_ttl)
  redis.call('HSET', gk, 'size', size, 'state', 'open', 'metadata', metadata,
    'created_at', tostring(now), 'deadline', tostring(deadline), 'n_rewarded', 0)
  redis.call('EXPIREAT', gk, math.ceil(deadline + tonumber(finished_ttl)))
  redis.call('ZADD', dk, deadline, gid)
  redis.call('HINCRBY', ck, 'groups_created', 1)
  return 1
end
"""

# KEYS: group, deadlines, counters. ARGV: group_id, size, metadata, group_ttl, finished_ttl.
# Returns 1 created, 0 already exists with the same size, -1 exists with another size.
CREATE_GROUP = _COMMON + """
return create_group(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
"""

# KEYS: group, group rollouts, group rewards, deadlines, counters.
# ARGV: group_id, rollout_ttl, r_head, r_tail (rollout), m_head, m_tail (rollout->group),
#       s_head, s_tail (staging), create (0/1), size, metadata, group_ttl, finished_ttl,
#       then the rollout ids.
# Runs in one MULTI/EXEC after the plain SETs of each rollout's record to its staging key:
# an accepted rollout's staging key is renamed into place, a refused one's deleted. (Passing
# a 13 kB record through a script's ARGV costs Redis ~20x a plain SET of it.) With create=1
# the group is first opened as CREATE_GROUP does (the sampling path: a new group and all its
# rollouts in one round trip); if it exists with another size every rollout is refused with
# group_exists.
# Returns one status per rollout: created | updated | unknown_group | group_closed |
# rollout_rewarded | rollout_in_other_group | group_full | group_exists | no_data. A rollout
# may be recorded again (a multi-turn episode grows) until it has a reward.
RECORD_ROLLOUTS = _COMMON + """
local conflict = false
if ARGV[9] == '1' then
  conflict = create_group(KEYS[1], KEYS[4], KEYS[5], ARGV[1], ARGV[10], ARGV[11], ARGV[12],
    ARGV[13]) < 0
end
local g = redis.call('HMGET', KEYS[1], 'state', 'size', 'n_rewarded')
local state, size, any_reward = g[1], tonumber(g[2]), tonumber(g[3] or 0) > 0
local ids, mks, sks = {}, {}, {}
for i = 14, #ARGV do
  ids[#ids + 1] = ARGV[i]
  mks[#mks + 1] = ARGV[5] .. ARGV[i] .. ARGV[6]
  sks[#sks + 1] = ARGV[7] .. ARGV[i] .. ARGV[8]
end
if #ids == 0 then return {} end
-- One call each for what every rollout needs (a call costs ~1 us of Redis CPU in Lua).
local owners = redis.call('MGET', unpack(mks))
local all_staged = redis.call('EXISTS', unpack(sks)) == #ids
-- A record without its mapping is a published one waiting for the learner: never replaced.
local new_rks = {}
for i, rid in ipairs(ids) do
  if not owners[i] then new_rks[#new_rks + 1] = ARGV[3] .. rid .. ARGV[4] end
end
local orphans = #new_rks > 0 and redis.call('EXISTS', unpack(new_rks)) > 0
local count, group_exp, now = nil, nil, nil
local out, pushed, seen = {}, {}, {}
for i, rid in ipairs(ids) do
  local mk, sk, owner = mks[i], sks[i], owners[i]
  local result
  if seen[rid] or (not all_staged and redis.call('EXISTS', sk) == 0) then
    result = 'no_data'  -- (a repeated id: its staged record went with the first)
  elseif conflict then result = 'group_exists'
  elseif not state then result = 'unknown_group'
  elseif state ~= 'open' then result = 'group_closed'
  elseif any_reward and redis.call('HEXISTS', KEYS[3], rid) == 1 then
    result = 'rollout_rewarded'
  elseif owner and owner ~= ARGV[1] then result = 'rollout_in_other_group'
  elseif not owner and orphans and redis.call('EXISTS', ARGV[3] .. rid .. ARGV[4]) == 1 then
    result = 'rollout_in_other_group'
  else
    group_exp = group_exp or redis.call('EXPIRETIME', KEYS[1])
    now = now or now_s()
    result = 'updated'
    if not owner then
      count = count or redis.call('LLEN', KEYS[2])
      if count >= size then
        result = 'group_full'
      else
        pushed[#pushed + 1] = rid
        count = count + 1
        result = 'created'
      end
    end
  end
  seen[rid] = true
  if result == 'created' or result == 'updated' then
    local exp = math.max(math.ceil(now + tonumber(ARGV[2])), group_exp)
    local rk = ARGV[3] .. rid .. ARGV[4]
    redis.call('RENAME', sk, rk)
    redis.call('EXPIREAT', rk, exp)
    redis.call('SET', mk, ARGV[1], 'EXAT', exp)
  elseif result ~= 'no_data' then
    redis.call('DEL', sk)
  end
  out[#out + 1] = result
end
if #pushed > 0 then
  redis.call('RPUSH', KEYS[2], unpack(pushed))
  redis.call('EXPIREAT', KEYS[2], group_exp)
end
return out
"""

# KEYS: counters, complete set, deadlines.
# ARGV: m_head, m_tail (rollout->group), g_head, g_tail (group), w_head, w_tail (rewards),
#       n, then n pairs (rollout_id, packed reward), then l_head, l_tail (group rollouts).
# All items are checked first; if any fails nothing is written. Returns {statuses, group ids,
# completed}: status ok | duplicate | unknown_rollout | conflict | closed:<state>; completed
# lists, per group this call completed, {group id, metadata, rollout ids, rewards (flat
# hash)}: what publishing needs, so the caller does not read it back.
POST_REWARDS = _COMMON + """
local n = tonumber(ARGV[7])
local statuses, gids = {}, {}
local all_ok = true
local mks = {}
for i = 1, n do mks[i] = ARGV[1] .. ARGV[6 + 2 * i] .. ARGV[2] end
local owners = redis.call('MGET', unpack(mks))
local groups, order = {}, {}  -- gid -> {state, size, items}; gids in first-seen order
for i = 1, n do
  local rid, packed = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
  local gid = owners[i]
  local status
  if not gid then
    status = 'unknown_rollout'
    gid = ''
  else
    local g = groups[gid]
    if not g then
      local h = redis.call('HMGET', ARGV[3] .. gid .. ARGV[4], 'state', 'size')
      g = {state = h[1], size = tonumber(h[2]), items = {}}
      groups[gid] = g
      order[#order + 1] = gid
    end
    local prev = redis.call('HGET', ARGV[5] .. gid .. ARGV[6], rid)
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
local stored, now = 0, nil
for _, gid in ipairs(order) do
  local g = groups[gid]
  if #g.items > 0 then
    local gk, wk = ARGV[3] .. gid .. ARGV[4], ARGV[5] .. gid .. ARGV[6]
    redis.call('HSET', wk, unpack(g.items))
    redis.call('EXPIREAT', wk, redis.call('EXPIRETIME', gk))
    stored = stored + #g.items / 2
    local count = redis.call('HINCRBY', gk, 'n_rewarded', #g.items / 2)
    if count >= g.size then
      now = now or now_s()
      redis.call('HSET', gk, 'state', 'complete', 'completed_at', tostring(now))
      redis.call('SADD', KEYS[2], gid)
      redis.call('ZREM', KEYS[3], gid)
      local l_head, l_tail = ARGV[8 + 2 * n], ARGV[9 + 2 * n]
      completed[#completed + 1] = {gid, redis.call('HGET', gk, 'metadata'),
        redis.call('LRANGE', l_head .. gid .. l_tail, 0, -1), redis.call('HGETALL', wk)}
    end
  end
end
if stored > 0 then redis.call('HINCRBY', KEYS[1], 'rewards_stored', stored) end
if n - stored > 0 then redis.call('HINCRBY', KEYS[1], 'rewards_duplicate', n - stored) end
return {statuses, gids, completed}
"""

# KEYS: group, group rollouts, group rewards, complete set, counters, ready stream, finished
#       rewards (hash: groups, rewards, sum).
# ARGV: group_id, mode (publish | drop), drop reason, finished_ttl, r_head, r_tail (rollout),
#       m_head, m_tail (rollout->group), head (the record's bytes before the rollouts), ids
#       (msgpack list of the rollout ids to publish), head field, ids field, the number of
#       final rewards and their sum (both 0 for a group without rewards), then the ids.
# Ends a complete group exactly once: anything but 'complete' returns {} (another finisher
# won, or the group moved on). Publish: XADD an entry that carries the head and the rollout
# ids -- by reference: the records stay where they are, only their TTL is removed (they
# belong to the entry now; the learner's trim deletes them with it), so no large value passes
# through Lua; a missing record (expired) turns it into a drop (missing_rollouts). Then the
# bookkeeping: state, stream_id or drop_reason, counters, the group's keys, its rollout ->
# group mappings and its unpublished records shortened to finished_ttl.
# Returns {'published', stream id} | {'dropped', reason}.
PUBLISH_GROUP = _COMMON + """
local st = redis.call('HMGET', KEYS[1], 'state', 'partial')
if st[1] ~= 'complete' then return {} end
local mode, reason, sid = ARGV[2], ARGV[3], nil
local rks, moved = {}, {}
for i = 15, #ARGV do rks[#rks + 1] = ARGV[5] .. ARGV[i] .. ARGV[6] end
if mode == 'publish' and (#rks == 0 or redis.call('EXISTS', unpack(rks)) < #rks) then
  mode, reason = 'drop', 'missing_rollouts'
end
if mode == 'publish' then
  sid = redis.call('XADD', KEYS[6], '*', ARGV[11], ARGV[9], ARGV[12], ARGV[10])
  for i, rk in ipairs(rks) do
    redis.call('PERSIST', rk)
    moved[ARGV[14 + i]] = true
  end
  redis.call('HSET', KEYS[1], 'state', 'published', 'stream_id', sid)
  redis.call('HINCRBY', KEYS[5], 'groups_published', 1)
  if st[2] == '1' then redis.call('HINCRBY', KEYS[5], 'groups_published_partial', 1) end
else
  redis.call('HSET', KEYS[1], 'state', 'dropped', 'drop_reason', reason)
  redis.call('HINCRBY', KEYS[5], 'groups_dropped_' .. reason, 1)
end
if tonumber(ARGV[13]) > 0 then
  redis.call('HINCRBY', KEYS[7], 'groups', 1)
  redis.call('HINCRBY', KEYS[7], 'rewards', tonumber(ARGV[13]))
  redis.call('HINCRBYFLOAT', KEYS[7], 'sum', ARGV[14])
end
redis.call('SREM', KEYS[4], ARGV[1])
local ttl = tonumber(ARGV[4])
for _, rid in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if not moved[rid] then shorten(ARGV[5] .. rid .. ARGV[6], ttl) end
  shorten(ARGV[7] .. rid .. ARGV[8], ttl)
end
shorten(KEYS[1], ttl)
shorten(KEYS[2], ttl)
shorten(KEYS[3], ttl)
if sid then return {'published', sid} end
return {'dropped', reason}
"""

# KEYS: deadlines, complete set, counters.
# ARGV: g_head, g_tail, l_head, l_tail (rollouts list), w_head, w_tail (rewards),
#       r_head, r_tail, m_head, m_tail, min_rewarded, finished_ttl, limit.
# Open groups past their deadline: with >= min_rewarded rewards -> 'complete' (partial=1),
# returned for the caller to publish; otherwise -> 'expired'. Returns the ids to publish.
EXPIRE_DUE = _COMMON + """
local now = now_s()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[13]))
local finalise = {}
for _, gid in ipairs(due) do
  redis.call('ZREM', KEYS[1], gid)
  local gk = ARGV[1] .. gid .. ARGV[2]
  local st = redis.call('HMGET', gk, 'state', 'n_rewarded')
  if st[1] == 'open' then
    if tonumber(st[2]) >= tonumber(ARGV[11]) then
      redis.call('HSET', gk, 'state', 'complete', 'partial', 1, 'completed_at', tostring(now))
      redis.call('SADD', KEYS[2], gid)
      redis.call('HINCRBY', KEYS[3], 'groups_expired_finalised', 1)
      finalise[#finalise + 1] = gid
    else
      redis.call('HSET', gk, 'state', 'expired', 'drop_reason', 'expired')
      redis.call('HINCRBY', KEYS[3], 'groups_expired_dropped', 1)
      expire_group(gk, ARGV[3] .. gid .. ARGV[4], ARGV[5] .. gid .. ARGV[6],
        ARGV[7], ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[12]))
    end
  elseif not st[1] then
    redis.call('HINCRBY', KEYS[3], 'groups_expired_lost', 1)
  end
end
return finalise
"""


# Multi-turn episodes (``server.episode_store``).

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# KEYS: group, group rollouts. ARGV: group_id, rollout_ttl, r_head, r_tail, m_head, m_tail,
# e_head, e_tail, then pairs (rollout_id, packed empty record). Returns ok | unknown_group |
# group_closed | group_full.
OPEN_EPISODES = _NOW + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'unknown_group' end
if state ~= 'open' then return 'group_closed' end
local n = (#ARGV - 8) / 2
if redis.call('LLEN', KEYS[2]) + n > tonumber(redis.call('HGET', KEYS[1], 'size')) then
  return 'group_full'
end
local group_exp = redis.call('EXPIRETIME', KEYS[1])
local exp = math.max(math.ceil(now + tonumber(ARGV[2])), group_exp)
for i = 9, #ARGV, 2 do
  local rid = ARGV[i]
  local ek = ARGV[7] .. rid .. ARGV[8]
  redis.call('RPUSH', KEYS[2], rid)
  redis.call('SET', ARGV[3] .. rid .. ARGV[4], ARGV[i + 1], 'EXAT', exp)
  redis.call('SET', ARGV[5] .. rid .. ARGV[6], ARGV[1], 'EXAT', exp)
  redis.call('HSET', ek, 'group_id', ARGV[1], 'n_turns', 0)
  redis.call('EXPIREAT', ek, exp)
end
redis.call('EXPIREAT', KEYS[2], group_exp)
return 'ok'
"""

# KEYS: episode, rollout, rollout->group. ARGV: rollout_id, g_head, g_tail, w_head, w_tail.
# Returns {status, group_id, n_turns, state}; status ok | unknown | not_episode | finished |
# group_closed:<state> | group_gone. The record is read by a GET in the same MULTI/EXEC.
LOAD_EPISODE = """
local ep = redis.call('HMGET', KEYS[1], 'group_id', 'n_turns', 'closed', 'state')
if not ep[1] then
  if redis.call('EXISTS', KEYS[3]) == 1 then return {'not_episode'} end
  return {'unknown'}
end
local gid = ep[1]
local gstate = redis.call('HGET', ARGV[2] .. gid .. ARGV[3], 'state')
if ep[3] == '1' or redis.call('HEXISTS', ARGV[4] .. gid .. ARGV[5], ARGV[1]) == 1 then
  return {'finished', gid}
end
if not gstate then return {'group_gone', gid} end
if gstate ~= 'open' then return {'group_closed:' .. gstate, gid} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'unknown'} end
return {'ok', gid, ep[2], ep[4] or ''}
"""

# KEYS: episode, rollout, rollout->group, group, group rewards, rollout staging.
# ARGV: rollout_id, expected n_turns, packed state, rollout_ttl.
# Runs in one MULTI/EXEC after the SET of the new record to the staging key: renamed into
# place when accepted, deleted otherwise. Returns ok | unknown | finished | group_gone |
# group_closed | concurrent_turn | no_data.
APPEND_TURN = _NOW + """
local function refuse(why)
  redis.call('DEL', KEYS[6])
  return why
end
if redis.call('EXISTS', KEYS[6]) == 0 then return 'no_data' end
local ep = redis.call('HMGET', KEYS[1], 'group_id', 'n_turns', 'closed')
if not ep[1] then return refuse('unknown') end
if ep[3] == '1' or redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then
  return refuse('finished')
end
local gstate = redis.call('HGET', KEYS[4], 'state')
if not gstate then return refuse('group_gone') end
if gstate ~= 'open' then return refuse('group_closed') end
if ep[2] ~= ARGV[2] then return refuse('concurrent_turn') end
local exp = math.max(math.ceil(now + tonumber(ARGV[4])), redis.call('EXPIRETIME', KEYS[4]))
redis.call('RENAME', KEYS[6], KEYS[2])
redis.call('EXPIREAT', KEYS[2], exp)
redis.call('SET', KEYS[3], ep[1], 'EXAT', exp)
redis.call('HSET', KEYS[1], 'n_turns', tonumber(ARGV[2]) + 1, 'state', ARGV[3])
redis.call('EXPIREAT', KEYS[1], exp)
return 'ok'
"""

# ARGV: e_head, e_tail, then pairs (rollout_id, number of turn rewards or -1 for none).
# Checks every item; if all pass, closes every episode among them. Returns one status per
# item: ok:<n_turns> | not_episode (a single-turn rollout or an unknown id: the reward script
# decides) | single_turn (not an episode, but more than one turn reward) | episode_empty |
# turns:<n_turns> (the count differs).
CLOSE_EPISODES = """
local out, ok = {}, true
for i = 3, #ARGV, 2 do
  local n = redis.call('HGET', ARGV[1] .. ARGV[i] .. ARGV[2], 'n_turns')
  local want = tonumber(ARGV[i + 1])
  local status = 'ok:' .. tostring(n)
  if not n then
    if want > 1 then status = 'single_turn' else status = 'not_episode' end
  elseif tonumber(n) == 0 then status = 'episode_empty'
  elseif want >= 0 and want ~= tonumber(n) then status = 'turns:' .. n end
  if string.sub(status, 1, 3) ~= 'ok:' and status ~= 'not_episode' then ok = false end
  out[#out + 1] = status
end
if ok then
  for i = 3, #ARGV, 2 do
    if string.sub(out[(i - 1) / 2], 1, 3) == 'ok:' then
      local ek = ARGV[1] .. ARGV[i] .. ARGV[2]
      redis.call('HSET', ek, 'closed', 1)
      redis.call('HDEL', ek, 'state')
    end
  end
end
return out
"""
