-- compact.lua: compact the finished workflows whose details are due to go.
--
-- KEYS[1]  compaction's schedule ({flow}:compacting): finished workflow ids by due time (ms)
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most workflows to compact in this call
-- ARGV[3]  the name of a workflow's hash without its id ({flow}:wf:); every hash
--          shares the hash tag of KEYS, so it lives in their slot
-- ARGV[4]  the field that records when it was compacted
-- ARGV[5…] the prefixes of the fields that go (its task records)
--
-- Its task records go (the receipts archive holds every start and end); what
-- the workflow is — state, output, input, times — stays until retention removes
-- it. A workflow deleted or removed meanwhile is only taken off the schedule.
-- Costs O(fields of what is due). Returns the number compacted.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then return 0 end
local prefixes = {}
for n = 5, #ARGV do prefixes[ARGV[n]] = true end
local width = #ARGV[5]
for _, id in ipairs(due) do
  local key = ARGV[3] .. id
  local gone = {}
  for _, name in ipairs(redis.call('HKEYS', key)) do
    if prefixes[string.sub(name, 1, width)] then gone[#gone + 1] = name end
  end
  -- in slices: unpack() of a few thousand values overflows Lua's C stack
  for first = 1, #gone, 256 do
    redis.call('HDEL', key, unpack(gone, first, math.min(#gone, first + 255)))
  end
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, ARGV[4], now)
  end
end
redis.call('ZREM', KEYS[1], unpack(due))
return #due
