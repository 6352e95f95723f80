-- expire.lua: retention's due steps — compact finished workflows, remove ended ones —
-- each exactly once.
--
-- KEYS[1]  retention's schedule ({flow}:expiring): ended workflow ids by the time (ms)
--          of their next step
-- KEYS[2]  the workflows index ({flow}:workflows)
-- KEYS[3]  the stop records ({flow}:stopped)
-- KEYS[4]  the compacted workflows ({flow}:compacted): id -> record
-- KEYS[5]  the removals of compacted workflows in due order ({flow}:expiring-compacted):
--          a list of '<id> <due>', due in ms, base 36
-- KEYS[6]  when the last of KEYS[5] is due (ms) ({flow}:expiring-compacted-last); gone
--          when KEYS[5] is empty
-- KEYS[7]  the graphs' short names ({flow}:graph-refs)
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most workflows to handle in this call
-- ARGV[3]  the name of a workflow's hash without its id ({flow}:wf:); every hash
--          shares the hash tag of KEYS, so it lives in their slot
-- ARGV[4]  the field that says when its removal is due once compacted (ms, 0: never);
--          present only on a finished workflow not yet compacted
-- ARGV[5]  the field that records when it was compacted
-- ARGV[6]  the fields a compacted record keeps, space-separated, in this order:
--          created ended graph name input state priority
-- ARGV[7]  the fields compaction drops besides the task records, space-separated
-- ARGV[8…] the prefixes (of one length) of the fields compaction removes: task records
--
-- A workflow due with ARGV[4] set is compacted: its task records go (the receipts
-- archive holds every start and end). When the rest of its hash is only what
-- ARGV[6] and ARGV[7] name, it becomes one entry of KEYS[4] (lifecycle/compact.py
-- reads it; numbers in base 36):
--
--   '1' <graph's short name>,<created>,<ended-created>,<compacted-ended>,
--   <due-ended, '': never>[,<priority>] '\n' <name> '\n' <input> '\n'
--   <state less its leading {"status":"finished">
--
-- ('2' in place of '1': the state was its status and output only; the output follows):
-- about 80 bytes for a small input and output, against 350 for the hash it replaces
-- (no key of its own, no field names, no version or attempt salt, which nothing reads
-- once it finished; and a hash with a value over 64 bytes is a table, far larger).
-- Its removal joins KEYS[5] (about 15 bytes an entry, against 80 to 110 in a sorted
-- set) unless one due later is listed already (KEYS[6]): then KEYS[1] keeps it.
-- Anything else (a concurrency key, a chunked state's entries) stays a hash, its task
-- records dropped.
--
-- Any other due workflow is removed: its record, its index entry and its schedule
-- entry go together, so a restart (which takes it off the schedule in the same
-- step) never races a half-removed record. Then the due head of KEYS[5] goes: a
-- compacted record due when its entry says (an entry whose record was deleted, or
-- written again since with another due time, is dropped: it never holds the head; one
-- written again due at the same time is removed then, and its own entry dropped).
-- Costs O(what is due, and the fields of what is compacted). Returns the number handled.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local most = tonumber(ARGV[2])
local finished, with_output = '{"status":"finished"', ',"output":'

local kept, dropped = {}, {}
for name in string.gmatch(ARGV[6], '%S+') do kept[#kept + 1] = name end
for name in string.gmatch(ARGV[7], '%S+') do dropped[name] = true end
local created_f, ended_f, graph_f, name_f, input_f, state_f, priority_f = unpack(kept)
local prefixes, width = {}, #(ARGV[8] or '')
for n = 8, #ARGV do prefixes[ARGV[n]] = true end
for _, name in ipairs(kept) do dropped[name] = true end
dropped[ARGV[4]] = true

local digits = '0123456789abcdefghijklmnopqrstuvwxyz'
local function b36(n)
  if n < 0 then return '-' .. b36(-n) end
  local text = ''
  repeat
    local digit = n % 36
    text = string.sub(digits, digit + 1, digit + 1) .. text
    n = (n - digit) / 36
  until n == 0
  return text
end
local function n36(text)
  if string.sub(text, 1, 1) == '-' then return -tonumber(string.sub(text, 2), 36) end
  return tonumber(text, 36)
end

-- A graph's short name, given at its first compacted workflow (read once a call).
local refs = {}
local function graph_ref(digest)
  local ref = refs[digest] or redis.call('HGET', KEYS[7], digest)
  if not ref then
    ref = b36(redis.call('HINCRBY', KEYS[7], '#', 1))
    redis.call('HSET', KEYS[7], digest, ref, '#' .. ref, digest)
  end
  refs[digest] = ref
  return ref
end

-- What this call lists and takes off the schedule, written once at its end.
local listed, unscheduled, last = {}, {}, nil

-- When a compacted record is due for removal (nil: never).
local function record_due(record)
  local _, created, ended, _, due =
    string.match(record, '^[12]([^,\n]*),([^,\n]*),([^,\n]*),([^,\n]*),([^,\n]*)')
  if not created or due == '' then return nil end
  return n36(created) + n36(ended) + n36(due)
end

-- The record of a workflow's kept fields (values by name), or nil when they do not fit.
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
  local head = table.concat({graph_ref(graph), b36(created), b36(ended - created),
                             b36(now - ended), removal > 0 and b36(removal - ended) or ''}, ',')
  if priority then head = head .. ',' .. priority end
  local form, rest = '1', string.sub(state, #finished + 1)
  -- Most states are {"status":"finished","output":...} alone: the output is kept bare
  -- (checked by decoding it: not worth it for a large one, where 11 bytes are nothing).
  if string.sub(rest, 1, #with_output) == with_output and #state <= 4096 then
    local read, decoded = pcall(cjson.decode, state)
    if read and type(decoded) == 'table' and next(decoded, next(decoded, next(decoded))) == nil
        and decoded['output'] ~= nil then
      form, rest = '2', string.sub(rest, #with_output + 1, -2)
    end
  end
  return form .. head .. '\n' .. name .. '\n' .. input .. '\n' .. rest
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
    redis.call('HSET', KEYS[4], id, record)
    redis.call('DEL', key)
    last = last or tonumber(redis.call('GET', KEYS[6]) or '0')
    if removal > 0 and removal >= last then
      listed[#listed + 1] = id .. ' ' .. b36(removal)
      unscheduled[#unscheduled + 1] = id
      last = removal
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
local handled = #due
for first = 1, #listed, 256 do
  local slice = {unpack(listed, first, math.min(#listed, first + 255))}
  redis.call('RPUSH', KEYS[5], unpack(slice))
  redis.call('ZREM', KEYS[1], unpack(unscheduled, first, math.min(#unscheduled, first + 255)))
end
if #listed > 0 then redis.call('SET', KEYS[6], string.format('%d', last)) end

-- The due head of the compacted removals.
while handled < most do
  local head = redis.call('LINDEX', KEYS[5], 0)
  if not head then
    -- Empty: the next compaction lists its removal whenever it is due (the entry of
    -- a workflow deleted meanwhile, due late, no longer keeps the next ones off it).
    redis.call('DEL', KEYS[6])
    break
  end
  local id, listed_due = string.match(head, '^(.*) (%w+)$')
  local record = id and redis.call('HGET', KEYS[4], id)
  local at = record and record_due(record)
  if at and b36(at) == listed_due then
    if at > now then break end
    if redis.call('EXISTS', ARGV[3] .. id) == 0 then removed[#removed + 1] = id end
  end
  redis.call('LPOP', KEYS[5])  -- removed, or an entry whose record went or is newer
  handled = handled + 1
end

if #removed > 0 then
  for first = 1, #removed, 256 do
    local slice = {unpack(removed, first, math.min(#removed, first + 255))}
    local records = {}
    for n, id in ipairs(slice) do records[n] = ARGV[3] .. id end
    redis.call('DEL', unpack(records))
    redis.call('HDEL', KEYS[4], unpack(slice))
    redis.call('ZREM', KEYS[2], unpack(slice))
    redis.call('HDEL', KEYS[3], unpack(slice))
    redis.call('ZREM', KEYS[1], unpack(slice))
  end
end
return handled
