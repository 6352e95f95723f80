-- expire.lua: retention's due steps — compact finished workflows, remove ended ones —
-- each exactly once.
--
-- KEYS[1]  retention's schedule ({flow}:expiring): ended workflow ids by the time (ms)
--          of their next step
-- KEYS[2]  the workflows index ({flow}:workflows)
-- KEYS[3]  the stop records ({flow}:stopped)
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most workflows to handle in this call
-- ARGV[3]  the name of a workflow's hash without its id ({flow}:wf:); every hash
--          shares the hash tag of KEYS, so it lives in their slot
-- ARGV[4]  the field that says when its removal is due once compacted (ms, 0: never);
--          present only on a finished workflow not yet compacted
-- ARGV[5]  the field that records when it was compacted
-- ARGV[6…] the prefixes (of one length) of the fields compaction removes: task records
--
-- A workflow due with ARGV[4] set is compacted: its task records go (the receipts
-- archive holds every start and end), the rest stays, and it is scheduled again
-- for its removal. Any other due workflow is removed: its record, its index entry
-- and its schedule entry go together, so a restart (which takes it off the
-- schedule in the same step) never races a half-removed record. Costs O(what is
-- due, and the fields of what is compacted). Returns the number handled.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then return 0 end
local prefixes, width = {}, #(ARGV[6] or '')
for n = 6, #ARGV do prefixes[ARGV[n]] = true end

local removed = {}
for _, id in ipairs(due) do
  local key = ARGV[3] .. id
  local removal = redis.call('HGET', key, ARGV[4])
  if removal then
    local gone = {ARGV[4]}
    for _, name in ipairs(redis.call('HKEYS', key)) do
      if prefixes[string.sub(name, 1, width)] then gone[#gone + 1] = name end
    end
    -- in slices: unpack() of a few thousand values overflows Lua's C stack
    for first = 1, #gone, 256 do
      redis.call('HDEL', key, unpack(gone, first, math.min(#gone, first + 255)))
    end
    redis.call('HSET', key, ARGV[5], now)
    if tonumber(removal) > 0 then
      redis.call('ZADD', KEYS[1], removal, id)
    else
      redis.call('ZREM', KEYS[1], id)
    end
  else
    removed[#removed + 1] = id
  end
end
if #removed > 0 then
  local records = {}
  for n, id in ipairs(removed) do
    records[n] = ARGV[3] .. id
  end
  redis.call('DEL', unpack(records))
  redis.call('ZREM', KEYS[2], unpack(removed))
  redis.call('HDEL', KEYS[3], unpack(removed))
  redis.call('ZREM', KEYS[1], unpack(removed))
end
return #due
