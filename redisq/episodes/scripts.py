"""The Lua scripts behind ``gspo_rl.redisq.episodes.store`` (multi-turn episodes): every
multi-key change of an episode is one script (see ``gspo_rl.redisq.groups.scripts`` for the
conventions: key templates, Redis ``TIME``, no large value through a script's arguments)."""

from __future__ import annotations

from gspo_rl.redisq.groups.scripts import MEMBER_OF
from gspo_rl.redisq.lua import LuaScript

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# episodes: pairs (rollout_id, packed empty record). Returns ok | unknown_group |
# group_closed | group_full.
OPEN_EPISODES = LuaScript(
    keys=("group_key", "rollouts_key"),
    args=("group_id", "rollout_ttl", "r_head", "r_tail", "m_head", "m_tail", "e_head", "e_tail"),
    rest="episodes",
    helpers=_NOW,
    body="""
local state = redis.call('HGET', group_key, 'state')
if not state then return 'unknown_group' end
if state ~= 'open' then return 'group_closed' end
local n = (#ARGV - episodes_at + 1) / 2
if redis.call('LLEN', rollouts_key) + n > tonumber(redis.call('HGET', group_key, 'size')) then
  return 'group_full'
end
local group_exp = redis.call('EXPIRETIME', group_key)
local exp = math.max(math.ceil(now + tonumber(rollout_ttl)), group_exp)
for i = episodes_at, #ARGV, 2 do
  local rid = ARGV[i]
  local ek = e_head .. rid .. e_tail
  redis.call('RPUSH', rollouts_key, rid)
  redis.call('SET', r_head .. rid .. r_tail, ARGV[i + 1], 'EXAT', exp)
  redis.call('SET', m_head .. rid .. m_tail, group_id, 'EXAT', exp)
  redis.call('HSET', ek, 'group_id', group_id, 'n_turns', 0)
  redis.call('EXPIREAT', ek, exp)
end
redis.call('EXPIREAT', rollouts_key, group_exp)
return 'ok'
""")

# Returns {status, group_id, n_turns, state}; status ok | unknown | not_episode | finished |
# group_closed:<state> | group_gone. The record is read by a GET in the same MULTI/EXEC.
LOAD_EPISODE = LuaScript(
    keys=("episode_key", "rollout_key", "mapping_key"),
    args=("rollout_id", "g_head", "g_tail", "w_head", "w_tail"),
    helpers=MEMBER_OF,
    body="""
local ep = redis.call('HMGET', episode_key, 'group_id', 'n_turns', 'closed', 'state')
if not ep[1] then
  if redis.call('EXISTS', mapping_key) == 1 then return {'not_episode'} end
  -- a sampled rollout whose id names its group (no rollout -> group key)
  local gid, k = member_of(rollout_id)
  if gid then
    local g = redis.call('HMGET', g_head .. gid .. g_tail, 'members', 'records')
    if g[1] == '1' and k < tonumber(g[2]) then return {'not_episode'} end
  end
  return {'unknown'}
end
local gid = ep[1]
local gstate = redis.call('HGET', g_head .. gid .. g_tail, 'state')
if ep[3] == '1' or redis.call('HEXISTS', w_head .. gid .. w_tail, rollout_id) == 1 then
  return {'finished', gid}
end
if not gstate then return {'group_gone', gid} end
if gstate ~= 'open' then return {'group_closed:' .. gstate, gid} end
if redis.call('EXISTS', rollout_key) == 0 then return {'unknown'} end
return {'ok', gid, ep[2], ep[4] or ''}
""")

# n_turns: the episode's model turns as the caller loaded it (the compare-and-set guard).
# Runs in one MULTI/EXEC after the SET of the new record to the staging key: renamed into
# place when accepted, deleted otherwise; an accepted turn adds its ``sampled`` tokens to the
# counters' ``tokens_generated``. Returns ok | unknown | finished | group_gone |
# group_closed | concurrent_turn | no_data.
APPEND_TURN = LuaScript(
    keys=("episode_key", "rollout_key", "mapping_key", "group_key", "rewards_key", "staging_key",
          "active_key", "counters_key"),
    args=("rollout_id", "n_turns", "state", "rollout_ttl", "idle_s", "sampled"),
    helpers=_NOW,
    body="""
local function refuse(why)
  redis.call('DEL', staging_key)
  return why
end
if redis.call('EXISTS', staging_key) == 0 then return 'no_data' end
local ep = redis.call('HMGET', episode_key, 'group_id', 'n_turns', 'closed')
if not ep[1] then return refuse('unknown') end
if ep[3] == '1' or redis.call('HEXISTS', rewards_key, rollout_id) == 1 then
  return refuse('finished')
end
local gstate = redis.call('HGET', group_key, 'state')
if not gstate then return refuse('group_gone') end
if gstate ~= 'open' then return refuse('group_closed') end
if ep[2] ~= n_turns then return refuse('concurrent_turn') end
local exp = math.max(math.ceil(now + tonumber(rollout_ttl)), redis.call('EXPIRETIME', group_key))
redis.call('RENAME', staging_key, rollout_key)
redis.call('EXPIREAT', rollout_key, exp)
redis.call('SET', mapping_key, ep[1], 'EXAT', exp)
redis.call('HSET', episode_key, 'n_turns', tonumber(n_turns) + 1, 'state', state)
redis.call('EXPIREAT', episode_key, exp)
-- a turn is activity: the group counts as in flight idle_s more seconds (XX: while open)
redis.call('ZADD', active_key, 'XX', now + tonumber(idle_s), ep[1])
redis.call('HINCRBY', counters_key, 'tokens_generated', tonumber(sampled))
return 'ok'
""")

# items: pairs (rollout_id, number of turn rewards or -1 for none).
# Checks every item; if all pass, closes every episode among them. Returns one status per
# item: ok:<n_turns> | not_episode (a single-turn rollout or an unknown id: the reward script
# decides) | single_turn (not an episode, but more than one turn reward) | episode_empty |
# turns:<n_turns> (the count differs).
CLOSE_EPISODES = LuaScript(
    keys=(),
    args=("e_head", "e_tail"),
    rest="items",
    body="""
local out, ok = {}, true
for i = items_at, #ARGV, 2 do
  local n = redis.call('HGET', e_head .. ARGV[i] .. e_tail, 'n_turns')
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
  for i = items_at, #ARGV, 2 do
    if string.sub(out[(i - items_at) / 2 + 1], 1, 3) == 'ok:' then
      local ek = e_head .. ARGV[i] .. e_tail
      redis.call('HSET', ek, 'closed', 1)
      redis.call('HDEL', ek, 'state')
    end
  end
end
return out
""")
