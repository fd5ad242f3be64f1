"""The Lua scripts behind ``gspo_rl.contract.queue.episodes.store`` (multi-turn episodes): every
multi-key change of an episode is one script (see ``gspo_rl.contract.queue.groups.scripts`` for the
conventions: key templates, Redis ``TIME``, no large value through a script's arguments)."""

from __future__ import annotations

from gspo_rl.contract.queue.groups.scripts import MEMBER_OF

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
LOAD_EPISODE = MEMBER_OF + """
local ep = redis.call('HMGET', KEYS[1], 'group_id', 'n_turns', 'closed', 'state')
if not ep[1] then
  if redis.call('EXISTS', KEYS[3]) == 1 then return {'not_episode'} end
  -- a sampled rollout whose id names its group (no rollout -> group key)
  local gid, k = member_of(ARGV[1])
  if gid then
    local g = redis.call('HMGET', ARGV[2] .. gid .. ARGV[3], 'members', 'records')
    if g[1] == '1' and k < tonumber(g[2]) then return {'not_episode'} end
  end
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
