"""A Lua copy of the outcome-only credit rule and of the ready group's head, so that the reward
script that completes a group also publishes it (``gspo_rl.redisq.groups.rewards``): no
second round trip, no Python on that path.

It covers the groups ``gspo_rl.contract.credit._outcome_only`` covers (no episode has turn rewards),
which is what single-turn rollouts and multi-turn episodes rewarded on their outcome post;
a group with turn rewards, a non-finite reward or anything else unexpected is left to the
Python rule (``gspo_rl.redisq.groups.finish``), unchanged.

Bit for bit the Python rule's numbers: both work in doubles, in the same order of operations
(``gspo_rl.contract.credit._mean``: sums left to right, one rounding per addition; then ``x -
mean``, ``+ 0.0``, ``sqrt(sum(c * c) / G)``, ``c / (sigma + eps)``), and IEEE 754 rounds ``+ - * /``
and ``sqrt`` correctly on both sides; ``eps`` reaches Lua as Python's ``repr`` (the shortest
string that reads back to the same double). ``tests/redisq/test_groups_credit.py`` checks
it over thousands of random groups against a real redis-server.

The head is written byte for byte as ``gspo_rl.redisq.groups.finish.ready_group_head`` packs
it (msgpack: floats as float64, str/array headers of the smallest size): doubles through
``struct.pack('>d', x)``, the stored metadata bytes as they are, the advantage config packed
once by Python. Helpers only: the scripts that use them prepend this source.
"""

from __future__ import annotations

CREDIT_LUA = """
local function mp_str(s)
  local n = #s
  if n < 32 then return string.char(160 + n) .. s end
  if n < 256 then return '\\217' .. string.char(n) .. s end
  if n < 65536 then return '\\218' .. struct.pack('>I2', n) .. s end
  return '\\219' .. struct.pack('>I4', n) .. s
end
local function mp_arr(n)
  if n < 16 then return string.char(144 + n) end
  if n < 65536 then return '\\220' .. struct.pack('>I2', n) end
  return '\\221' .. struct.pack('>I4', n)
end
local function mp_f64(x) return '\\203' .. struct.pack('>d', x) end
local function mp_f64s(parts, xs)
  parts[#parts + 1] = mp_arr(#xs)
  for i = 1, #xs do parts[#parts + 1] = mp_f64(xs[i]) end
end
-- The msgpack list of the ids (what msgpack.packb(list of str) gives).
local function mp_ids(ids)
  local parts = {mp_arr(#ids)}
  for i = 1, #ids do parts[i + 1] = mp_str(ids[i]) end
  return table.concat(parts)
end

-- gspo_rl.contract.credit._outcome_only: rewards -> (sequence advantages, has_signal).
local function outcome_credit(r, eps, scale)
  local n, flat, c = #r, true, {}
  for i = 2, n do
    if r[i] ~= r[1] then flat = false; break end
  end
  if flat then
    for i = 1, n do c[i] = 0.0 end
  else
    local s = 0.0
    for i = 1, n do s = s + r[i] end
    local m = s / n
    for i = 1, n do c[i] = (r[i] - m) + 0.0 end
  end
  local s2 = 0.0
  for i = 1, n do s2 = s2 + c[i] * c[i] end
  local sigma = math.sqrt(s2 / n)
  local signal = sigma > 0
  local denom = 1.0
  if scale and signal then denom = sigma + eps end
  local a = {}
  for i = 1, n do a[i] = c[i] / denom end
  return a, signal
end

-- A group's rewarded entries, as the credit rule needs them, or nil when the Lua rule does
-- not cover them (turn rewards, a non-finite reward, an odd turn count): the caller then
-- leaves the group to Python. rids: rollout ids in creation order; packed: their stored
-- rewards (nil: not rewarded). Returns ids, rewards, turn_rewards (the stored value: nil or
-- an empty list), n_turns (gspo_rl.redisq.groups.finish.reward_turns).
local function outcome_entries(rids, packed)
  local ids, rewards, trs, turns = {}, {}, {}, {}
  for i, rid in ipairs(rids) do
    if packed[i] then
      local ok, e = pcall(cmsgpack.unpack, packed[i])
      if not ok or type(e) ~= 'table' then return nil end
      local r, tr, nt = e['reward'], e['turn_rewards'], e['n_turns']
      if type(r) ~= 'number' or r ~= r or r == math.huge or r == -math.huge then return nil end
      if tr ~= nil and (type(tr) ~= 'table' or next(tr) ~= nil) then return nil end
      if nt == nil then nt = 1 end
      if type(nt) ~= 'number' or nt < 0 or nt > 65535 or nt ~= math.floor(nt) then
        return nil
      end
      local k = #ids + 1
      ids[k], rewards[k], trs[k], turns[k] = rid, r, tr ~= nil, nt
    end
  end
  return ids, rewards, trs, turns
end

-- gspo_rl.redisq.groups.finish.ready_group_head, byte for byte. has_tr[i]: the
-- episode's stored turn_rewards was an empty list (true) or nil (false).
local function ready_head(gid, metadata, published_at, rewards, adv, has_tr, turns, config)
  local p = {'\\137', mp_str('group_id'), mp_str(gid), mp_str('metadata'), metadata,
    mp_str('published_at'), mp_f64(published_at), mp_str('rewards')}
  mp_f64s(p, rewards)
  p[#p + 1] = mp_str('advantages')
  mp_f64s(p, adv)
  p[#p + 1] = mp_str('turn_rewards')
  p[#p + 1] = mp_arr(#has_tr)
  for i = 1, #has_tr do
    if has_tr[i] then p[#p + 1] = '\\144' else p[#p + 1] = '\\192' end
  end
  p[#p + 1] = mp_str('turn_advantages')
  p[#p + 1] = mp_arr(#turns)
  for i = 1, #turns do
    p[#p + 1] = mp_arr(turns[i])
    if turns[i] > 0 then p[#p + 1] = string.rep(mp_f64(adv[i]), turns[i]) end
  end
  p[#p + 1] = mp_str('advantage_config')
  p[#p + 1] = config
  p[#p + 1] = mp_str('rollouts')
  p[#p + 1] = mp_arr(#rewards)
  return table.concat(p)
end
"""
