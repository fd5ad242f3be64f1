"""The Lua scripts that open groups, record rollouts and expire groups (``store``); the ones
that end a group are in ``rewards``, the episodes' in ``gspo_rl.redisq.episodes``.
Every multi-key change of a group is one script, atomic in Redis. No large value passes
through a script's arguments (records are SET, then renamed into place); times come from
Redis's ``TIME``; a finished group's keys are shortened with ``EXPIRE ... LT``. Keys found
inside Redis are built from templates, so the scripts need a standalone (or managed,
non-cluster) Redis. docs/design/redis-protocol.md says why."""

from __future__ import annotations

from gspo_rl.redisq.lua import LuaScript

# '<group id>:<index>' -> the group id and the index (a rollout id of a group recorded whole
# with ids that name it, ``gspo_rl.contract.schema.member_rollout_id``), else nil. The caller
# checks the group (its hash's ``members`` and ``records``).
MEMBER_OF = """
local function member_of(rid)
  local gid, k = string.match(rid, '^(.+):(%d+)$')
  if gid and tostring(tonumber(k)) == k then return gid, tonumber(k) end
  return nil
end
"""

# Shared helpers, prepended to the scripts that need them.
COMMON = MEMBER_OF + """
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- An open group had activity: it counts as in flight for idle_s more seconds (XX: only a
-- group still listed, i.e. open).
local function touch(ak, gid, idle_s)
  redis.call('ZADD', ak, 'XX', now_s() + tonumber(idle_s), gid)
end
local function shorten(key, ttl)
  redis.call('EXPIRE', key, ttl, 'LT')
end
-- Shortens the TTL of a finished group's keys and rollout mappings to ttl seconds and of its
-- records to rttl (0 deletes them; bk: the group's records key, when it was recorded whole;
-- members: its ids name it, no mappings).
local function expire_group(gk, rolk, rewk, r_head, r_tail, m_head, m_tail, ttl, bk, members,
                            rttl)
  if not (bk and members) then
    for _, rid in ipairs(redis.call('LRANGE', rolk, 0, -1)) do
      if not bk then shorten(r_head .. rid .. r_tail, rttl) end
      if not members then shorten(m_head .. rid .. m_tail, ttl) end
    end
  end
  if bk then shorten(bk, rttl) end
  shorten(gk, ttl)
  shorten(rolk, ttl)
  shorten(rewk, ttl)
end
-- Opens a group (see CREATE_GROUP), listed by its deadline (dk) and by until when it counts
-- as in flight without activity (ak, idle_s). Returns 1 created, 0 already exists with the
-- same size, -1 exists with another size; and, when created, the expiry of the group's keys.
local function create_group(gk, dk, ak, ck, gid, size, metadata, group_ttl, finished_ttl, idle_s)
  if redis.call('EXISTS', gk) == 1 then
    if redis.call('HGET', gk, 'size') == size then return 0 end
    return -1
  end
  local now = now_s()
  local deadline = now + tonumber(group_ttl)
  local group_exp = math.ceil(deadline + tonumber(finished_ttl))
  redis.call('HSET', gk, 'size', size, 'state', 'open', 'metadata', metadata,
    'created_at', tostring(now), 'deadline', tostring(deadline), 'n_rewarded', 0)
  redis.call('EXPIREAT', gk, group_exp)
  redis.call('ZADD', dk, deadline, gid)
  redis.call('ZADD', ak, now + tonumber(idle_s), gid)
  redis.call('HINCRBY', ck, 'groups_created', 1)
  return 1, group_exp
end
"""

# Returns 1 created, 0 already exists with the same size, -1 exists with another size.
CREATE_GROUP = LuaScript(
    keys=("group_key", "deadlines_key", "active_key", "counters_key"),
    args=("group_id", "size", "metadata", "group_ttl", "finished_ttl", "idle_s"),
    helpers=COMMON,
    body="""
local created = create_group(group_key, deadlines_key, active_key, counters_key, group_id, size,
  metadata, group_ttl, finished_ttl, idle_s)
return created
""")

# Key templates (head .. id .. tail): r rollout, m rollout->group, s staging.
# Rollouts of an existing group (the multi-turn episodes' path; a new group's go through
# RECORD_NEW_GROUP). Runs in one MULTI/EXEC after the plain SETs of each rollout's record to
# its staging key, each with EX record_ttl: an accepted rollout's staging key is renamed into
# place (its TTL goes with it: record_ttl = max(rollout_ttl, group_ttl + finished_ttl + 1),
# never less than the group's keys), a refused one's deleted. (Passing a 13 kB record through
# a script's ARGV costs Redis ~20x a plain SET of it.) Staging protects what a rollout id may
# already name: a record being recorded again, or a published one waiting for the learner.
# Returns one status per rollout: created | updated | unknown_group | group_closed |
# group_sealed (a group recorded whole by RECORD_NEW_GROUP) | rollout_rewarded |
# rollout_in_other_group | group_full | no_data. A rollout may be recorded again (a multi-turn
# episode grows) until it has a reward.
RECORD_ROLLOUTS = LuaScript(
    keys=("group_key", "rollouts_key", "rewards_key", "active_key"),
    args=("group_id", "record_ttl", "r_head", "r_tail", "m_head", "m_tail", "s_head", "s_tail",
          "idle_s"),
    rest="rollout_ids",
    helpers=COMMON,
    body="""
local g = redis.call('HMGET', group_key, 'state', 'size', 'n_rewarded', 'records')
local state, size, any_reward = g[1], tonumber(g[2]), tonumber(g[3] or 0) > 0
if g[4] then state = 'sealed' end  -- recorded whole: no rollout is recorded on its own
local count = nil
local ids, mks, sks = {}, {}, {}
for i = rollout_ids_at, #ARGV do
  ids[#ids + 1] = ARGV[i]
  mks[#mks + 1] = m_head .. ARGV[i] .. m_tail
  sks[#sks + 1] = s_head .. ARGV[i] .. s_tail
end
if #ids == 0 then return {} end
-- One call each for what every rollout needs (a call costs ~1 us of Redis CPU in Lua).
local owners = redis.call('MGET', unpack(mks))
local all_staged = redis.call('EXISTS', unpack(sks)) == #ids
-- A record without its mapping is a published one waiting for the learner: never replaced.
local new_rks = {}
for i, rid in ipairs(ids) do
  if not owners[i] then new_rks[#new_rks + 1] = r_head .. rid .. r_tail end
end
local orphans = #new_rks > 0 and redis.call('EXISTS', unpack(new_rks)) > 0
local out, pushed, seen, recorded = {}, {}, {}, false
for i, rid in ipairs(ids) do
  local mk, sk, owner = mks[i], sks[i], owners[i]
  local result
  if seen[rid] or (not all_staged and redis.call('EXISTS', sk) == 0) then
    result = 'no_data'  -- (a repeated id: its staged record went with the first)
  elseif not state then result = 'unknown_group'
  elseif state == 'sealed' then result = 'group_sealed'
  elseif state ~= 'open' then result = 'group_closed'
  elseif any_reward and redis.call('HEXISTS', rewards_key, rid) == 1 then
    result = 'rollout_rewarded'
  elseif owner and owner ~= group_id then result = 'rollout_in_other_group'
  elseif not owner and orphans and redis.call('EXISTS', r_head .. rid .. r_tail) == 1 then
    result = 'rollout_in_other_group'
  else
    result = 'updated'
    if not owner then
      count = count or redis.call('LLEN', rollouts_key)
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
    redis.call('RENAME', sk, r_head .. rid .. r_tail)
    redis.call('SET', mk, group_id, 'EX', record_ttl)
    recorded = true
  elseif result ~= 'no_data' then
    redis.call('DEL', sk)
  end
  out[#out + 1] = result
end
if #pushed > 0 then
  redis.call('RPUSH', rollouts_key, unpack(pushed))
  redis.call('EXPIREAT', rollouts_key, redis.call('EXPIRETIME', group_key))
end
if recorded then touch(active_key, group_id, idle_s) end
return out
""")

# m: the rollout->group key template; members: 1 when the ids are '<group_id>:<index>', in
# order.
# A new group and its rollouts, as the sampling path records them: the group id and the rollout
# ids were minted for this call (a uuid4 and ids naming it), and the records are one value, the
# group's records key (a msgpack array in the order of the ids), SET with NX and EX record_ttl
# before this script in the same MULTI/EXEC: no staging key, no per-rollout record, no owner or
# orphan to look up (the checks RECORD_ROLLOUTS needs for ids that may be in use). Opens the group
# as CREATE_GROUP does, with ``records`` (how many: the group is recorded whole, it takes no
# rollout one by one), then maps each rollout to it (unless the ids name their group: ``members``,
# no rollout -> group key at all) and lists them. If the group
# already existed: the same ids listed in the same order is this call retried after its first
# attempt ran ('updated': NX kept the records it wrote); anything else is refused
# ('group_exists'). Either way a records key the group does not own (no ``records`` in its
# hash) was written by this call and is deleted again. ``sampled`` (the records' sampled
# tokens) is added to the counters' ``tokens_generated`` once, by the call that created the
# group. Returns one status for them all: created | updated | group_exists.
RECORD_NEW_GROUP = LuaScript(
    keys=("group_key", "rollouts_key", "deadlines_key", "active_key", "counters_key",
          "records_key"),
    args=("group_id", "size", "metadata", "group_ttl", "finished_ttl", "idle_s", "sampled",
          "record_ttl", "m_head", "m_tail", "members"),
    rest="rollout_ids",
    helpers=COMMON,
    body="""
local created, group_exp = create_group(group_key, deadlines_key, active_key, counters_key,
  group_id, size, metadata, group_ttl, finished_ttl, idle_s)
local ids = {}
for i = rollout_ids_at, #ARGV do ids[#ids + 1] = ARGV[i] end
if created == 1 then
  redis.call('HINCRBY', counters_key, 'tokens_generated', tonumber(sampled))
  if members ~= '1' then
    for _, rid in ipairs(ids) do
      redis.call('SET', m_head .. rid .. m_tail, group_id, 'EX', record_ttl)
    end
  end
  if #ids > 0 then
    redis.call('RPUSH', rollouts_key, unpack(ids))
    redis.call('EXPIREAT', rollouts_key, group_exp)
    if members == '1' then redis.call('HSET', group_key, 'records', #ids, 'members', 1)
    else redis.call('HSET', group_key, 'records', #ids) end
  end
  return 'created'
end
if not redis.call('HGET', group_key, 'records') then redis.call('DEL', records_key) end
local listed = redis.call('LRANGE', rollouts_key, 0, -1)
local same = created == 0 and #listed == #ids
for i = 1, #ids do same = same and listed[i] == ids[i] end
if same then return 'updated' end
return 'group_exists'
""")

# Key templates (head .. id .. tail): g group, l rollouts list, w rewards, r rollout,
# m rollout->group, b a group's records. The start of the bodies of EXPIRE_DUE and
# ABANDON_GROUP (it reads their slots): end_open(gid, now, why) ends an open group now, as its
# deadline does (why 'expired') or its environment giving it up does (why 'abandoned'): with
# >= min_rewarded rewards -> 'complete' (partial=1, in the complete set, for the caller to
# publish); otherwise -> 'expired' (drop_reason why, its keys shortened). It leaves the
# deadlines and the activity sets either way. Returns 'complete' | 'expired' | the state of a
# group that was no longer open | 'gone' (no such group: counted lost when it expired).
_END_OPEN = """
local function end_open(gid, now, why)
  redis.call('ZREM', deadlines_key, gid)
  redis.call('ZREM', active_key, gid)
  local gk = g_head .. gid .. g_tail
  local st = redis.call('HMGET', gk, 'state', 'n_rewarded', 'records', 'members')
  if not st[1] then
    if why == 'expired' then redis.call('HINCRBY', counters_key, 'groups_expired_lost', 1) end
    return 'gone'
  end
  if st[1] ~= 'open' then return st[1] end
  if tonumber(st[2]) >= tonumber(min_rewarded) then
    redis.call('HSET', gk, 'state', 'complete', 'partial', 1, 'completed_at', tostring(now))
    redis.call('SADD', complete_key, gid)
    redis.call('HINCRBY', counters_key, 'groups_' .. why .. '_finalised', 1)
    return 'complete'
  end
  redis.call('HSET', gk, 'state', 'expired', 'drop_reason', why)
  redis.call('HINCRBY', counters_key, 'groups_' .. why .. '_dropped', 1)
  expire_group(gk, l_head .. gid .. l_tail, w_head .. gid .. w_tail,
    r_head, r_tail, m_head, m_tail, tonumber(finished_ttl),
    st[3] and (b_head .. gid .. b_tail) or nil, st[4] == '1', tonumber(records_ttl))
  return 'expired'
end
"""
_END_OPEN_KEYS = ("deadlines_key", "active_key", "complete_key", "counters_key")
_END_OPEN_ARGS = ("g_head", "g_tail", "l_head", "l_tail", "w_head", "w_tail", "r_head", "r_tail",
                  "m_head", "m_tail", "min_rewarded", "finished_ttl", "b_head", "b_tail",
                  "records_ttl")

# Open groups past their deadline, ended (end_open, 'expired'), at most limit per call.
# Returns the ids of those left complete, for the caller to publish.
EXPIRE_DUE = LuaScript(
    keys=_END_OPEN_KEYS,
    args=(*_END_OPEN_ARGS, "limit"),
    helpers=COMMON,
    body=_END_OPEN + """
local now = now_s()
local due = redis.call('ZRANGEBYSCORE', deadlines_key, '-inf', now, 'LIMIT', 0, tonumber(limit))
local finalise = {}
for _, gid in ipairs(due) do
  if end_open(gid, now, 'expired') == 'complete' then finalise[#finalise + 1] = gid end
end
return finalise
""")

# An environment gives group_id up (POST /v1/groups/{id}/abandon): end_open now, 'abandoned',
# whatever its deadline. Returns end_open's answer (a group already ended: its state, as it
# was; idempotent).
ABANDON_GROUP = LuaScript(
    keys=_END_OPEN_KEYS,
    args=(*_END_OPEN_ARGS, "group_id"),
    helpers=COMMON,
    body=_END_OPEN + """
return end_open(group_id, now_s(), 'abandoned')
""")
