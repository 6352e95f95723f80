-- expire.lua: retention's due steps — compact finished workflows, remove ended ones —
-- each exactly once.
--
-- KEYS[1]  retention's schedule ({flow}:expiring): ended workflow ids by the time (ms)
--          of their next step
-- KEYS[2]  the workflows index ({flow}:workflows)
-- KEYS[3]  the stop records ({flow}:stopped)
-- KEYS[4]  the removals of compacted workflows in due order ({flow}:expiring-compacted):
--          a list of '<due ms> <id>'
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most workflows to handle in this call
-- ARGV[3]  the name of a workflow's hash without its id ({flow}:wf:); every hash
--          shares the hash tag of KEYS, so it lives in their slot
-- ARGV[4]  the field that says when its removal is due once compacted (ms, 0: never);
--          present only on a finished workflow not yet compacted
-- ARGV[5]  the field that records when it was compacted
-- ARGV[6]  the name of a compacted record without its id ({flow}:wfc:), same slot
-- ARGV[7]  the fields a compacted record keeps, space-separated, in its order:
--          created ended graph name input state priority
-- ARGV[8]  the fields compaction drops besides the task records, space-separated
-- ARGV[9…] the prefixes (of one length) of the fields compaction removes: task records
--
-- A workflow due with ARGV[4] set is compacted: its task records go (the receipts
-- archive holds every start and end). When the rest of its hash is only what
-- ARGV[7] and ARGV[8] name, it becomes one string (lifecycle/compact.py reads it):
--
--   '1' <graph hash, 32 raw bytes> <created>,<ended-created>,<compacted-ended>,
--   <due-ended>[,<priority>] '\n' <name> '\n' <input> '\n' <state less its status>
--
-- ('2' in place of '1': the state was its status and output only; the output follows)
--
-- about 200 bytes fewer than the hash (no field names, no version or attempt salt,
-- which nothing reads once it finished, a hash over 64 bytes a value no longer turned
-- into a table), and its removal joins KEYS[4] (about 20 bytes an entry, against
-- 80 in a sorted set) unless one due later is there already: then KEYS[1] keeps it.
-- Anything else (a concurrency key, a chunked state's entries) stays a hash.
--
-- Any other due workflow is removed: its record, its index entry and its schedule
-- entry go together, so a restart (which takes it off the schedule in the same
-- step) never races a half-removed record. Then the due head of KEYS[4] goes: a
-- compacted record whose due time is the entry's (an entry whose record was deleted,
-- or written again since, is dropped). Costs O(what is due, and the fields of what
-- is compacted). Returns the number handled.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local most = tonumber(ARGV[2])
local finished, with_output = '{"status":"finished"', ',"output":'

local kept, dropped = {}, {}
for name in string.gmatch(ARGV[7], '%S+') do kept[#kept + 1] = name end
for name in string.gmatch(ARGV[8], '%S+') do dropped[name] = true end
local created_f, ended_f, graph_f, name_f, input_f, state_f, priority_f = unpack(kept)
local prefixes, width = {}, #(ARGV[9] or '')
for n = 9, #ARGV do prefixes[ARGV[n]] = true end
for _, name in ipairs(kept) do dropped[name] = true end
dropped[ARGV[4]] = true

-- The string form of a workflow's kept fields (values by name), or nil when they do
-- not fit it.
local function packed(fields, removal)
  local graph, state, name = fields[graph_f], fields[state_f], fields[name_f] or ''
  local created, ended = tonumber(fields[created_f]), tonumber(fields[ended_f])
  local input, priority = fields[input_f], fields[priority_f]
  if not (graph and state and created and ended and input) then return nil end
  if #graph ~= 64 or string.find(graph, '[^0-9a-f]') or string.find(name, '\n')
      or string.sub(state, 1, #finished) ~= finished
      or (priority and not string.match(priority, '^%-?%d+$')) then
    return nil
  end
  local head = string.format('%d,%d,%d,%d', created, ended - created, now - ended,
                             removal > 0 and removal - ended or -1)
  if priority then head = head .. ',' .. priority end
  local raw = string.gsub(graph, '%x%x', function(h) return string.char(tonumber(h, 16)) end)
  local form, rest = '1', string.sub(state, #finished + 1)
  -- Most states are {"status":"finished","output":...} alone: the output is kept bare.
  if string.sub(rest, 1, #with_output) == with_output then
    local read, decoded = pcall(cjson.decode, state)
    if read and type(decoded) == 'table' and next(decoded, next(decoded, next(decoded))) == nil
        and decoded['output'] ~= nil then
      form, rest = '2', string.sub(rest, #with_output + 1, -2)
    end
  end
  return form .. raw .. head .. '\n' .. name .. '\n' .. input .. '\n' .. rest
end

local function compact(id, key, removal)
  local gone, other = {ARGV[4]}, false
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if prefixes[string.sub(field, 1, width)] then
      gone[#gone + 1] = field
    elseif not dropped[field] then
      other = true
    end
  end
  local record
  if not other then
    local values = redis.call('HMGET', key, unpack(kept))
    local fields = {}
    for n, name in ipairs(kept) do fields[name] = values[n] or nil end
    record = packed(fields, removal)
  end
  if record then
    redis.call('SET', ARGV[6] .. id, record)
    redis.call('DEL', key)
    local tail = redis.call('LINDEX', KEYS[4], -1)
    if removal > 0 and (not tail or tonumber(string.match(tail, '^%d+')) <= removal) then
      redis.call('RPUSH', KEYS[4], string.format('%d %s', removal, id))
      redis.call('ZREM', KEYS[1], id)
      return
    end
  else
    -- in slices: unpack() of a few thousand values overflows Lua's C stack
    for first = 1, #gone, 256 do
      redis.call('HDEL', key, unpack(gone, first, math.min(#gone, first + 255)))
    end
    redis.call('HSET', key, ARGV[5], now)
  end
  if removal > 0 then
    redis.call('ZADD', KEYS[1], removal, id)
  else
    redis.call('ZREM', KEYS[1], id)
  end
end

local handled = 0
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, most)
local removed = {}
for _, id in ipairs(due) do
  local key = ARGV[3] .. id
  local removal = redis.call('HGET', key, ARGV[4])
  if removal then
    compact(id, key, tonumber(removal))
  else
    removed[#removed + 1] = id
  end
end
handled = #due

-- The due head of the compacted removals: each entry's record, when it is still the
-- one the entry was written for (its own due time says so).
local listed = {}
while handled < most do
  local head = redis.call('LINDEX', KEYS[4], 0)
  if not head then break end
  local at, id = string.match(head, '^(%d+) (.*)$')
  if not at or tonumber(at) > now then break end
  redis.call('LPOP', KEYS[4])
  handled = handled + 1
  local record = redis.call('GET', ARGV[6] .. id)
  if record then
    local created, ended, _, due_in = string.match(record, '^(%d+),(%d+),(%d+),(%-?%d+)', 34)
    if due_in and tonumber(created) + tonumber(ended) + tonumber(due_in) == tonumber(at)
        and redis.call('EXISTS', ARGV[3] .. id) == 0 then
      listed[#listed + 1] = id
    end
  end
end
for _, id in ipairs(listed) do removed[#removed + 1] = id end

if #removed > 0 then
  local records = {}
  for n, id in ipairs(removed) do
    records[#records + 1] = ARGV[3] .. id
    records[#records + 1] = ARGV[6] .. id
  end
  for first = 1, #records, 256 do
    redis.call('DEL', unpack(records, first, math.min(#records, first + 255)))
  end
  for first = 1, #removed, 256 do
    local slice = {unpack(removed, first, math.min(#removed, first + 255))}
    redis.call('ZREM', KEYS[2], unpack(slice))
    redis.call('HDEL', KEYS[3], unpack(slice))
    redis.call('ZREM', KEYS[1], unpack(slice))
  end
end
return handled
