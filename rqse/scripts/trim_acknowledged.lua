-- trim_acknowledged.lua: remove the entries every consumer group is done with.
--
-- KEYS[1]  the stream
-- ARGV[1]  name of the receipt log's group ("" for none)
-- ARGV[2]  scan limit: most entries examined for receipts the receipt log has
--          not archived yet; beyond it nothing is removed (safe, not clever)
--
-- An entry is removed when its id is below all of:
--   * every group's last-delivered-id (every group has read it);
--   * every group's smallest pending id (no consumer holds it unacknowledged);
--   * the target ("for") of every receipt the receipt group has not finished
--     (not yet delivered to it, or pending in it), so the receipt log can
--     still archive receipt and target together.
-- A stream without groups is left alone. Atomic: no group can move between
-- the reads and the trim.
--
-- Writes: KEYS[1] (XTRIM MINID, exact).
-- Returns: {removed, bound}: entries removed and the MINID used ("" if none).

local stream = KEYS[1]
local receipt_group = ARGV[1]
local limit = tonumber(ARGV[2])

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return nil end
  return {tonumber(ms), tonumber(seq)}
end

local bound, bound_id = nil, nil
local function lower(id)
  local p = parse(id)
  if not p then return end
  if bound == nil or p[1] < bound[1] or (p[1] == bound[1] and p[2] < bound[2]) then
    bound, bound_id = p, id
  end
end

-- The target of a receipt entry (flat field list), or nil.
local function receipt_target(fields)
  local kind, target = nil, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'kind' then
      local ok, v = pcall(cjson.decode, fields[i + 1]); if ok then kind = v end
    elseif fields[i] == 'for' then
      local ok, v = pcall(cjson.decode, fields[i + 1]); if ok then target = v end
    end
  end
  if kind == 'receipt' and type(target) == 'string' then return target end
  return nil
end

if redis.call('EXISTS', stream) == 0 then return {0, ''} end
local groups = redis.call('XINFO', 'GROUPS', stream)
if #groups == 0 then return {0, ''} end

for _, flat in ipairs(groups) do
  local g = {}
  for i = 1, #flat, 2 do g[flat[i]] = flat[i + 1] end
  lower(g['last-delivered-id'])
  if tonumber(g['pending']) > 0 then
    local summary = redis.call('XPENDING', stream, g['name'])
    lower(summary[2])
  end
  if g['name'] == receipt_group then
    local unread = redis.call('XRANGE', stream, '(' .. g['last-delivered-id'], '+',
                              'COUNT', limit)
    if #unread >= limit then return {0, ''} end
    for _, entry in ipairs(unread) do
      local target = receipt_target(entry[2])
      if target then lower(target) end
    end
    if tonumber(g['pending']) > 0 then
      local pending = redis.call('XPENDING', stream, g['name'], '-', '+', limit)
      if #pending >= limit then return {0, ''} end
      for _, p in ipairs(pending) do
        local rows = redis.call('XRANGE', stream, p[1], p[1])
        if rows[1] then
          local target = receipt_target(rows[1][2])
          if target then lower(target) end
        end
      end
    end
  end
end

if bound_id == nil then return {0, ''} end
return {redis.call('XTRIM', stream, 'MINID', bound_id), bound_id}
