-- expire.lua: remove the workflows whose retention is over, each exactly once.
--
-- KEYS[1]  retention's schedule ({flow}:expiring): ended workflow ids by removal time (ms)
-- KEYS[2]  the workflows index ({flow}:workflows)
-- KEYS[3]  the stop records ({flow}:stopped)
-- KEYS[4]  compaction's schedule ({flow}:compacting): a workflow removed before its
--          task records were compacted leaves it too
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most workflows to remove in this call
-- ARGV[3]  the name of a workflow's hash without its id ({flow}:wf:); every hash
--          shares the hash tag of KEYS, so it lives in their slot
--
-- A workflow's record, its index entry and its schedule entry go together: a
-- restart (which takes it off the schedule in the same step) never races a
-- half-removed record. Costs O(what is due). Returns the number removed.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then return 0 end
local records = {}
for n, id in ipairs(due) do
  records[n] = ARGV[3] .. id
end
redis.call('DEL', unpack(records))
redis.call('ZREM', KEYS[2], unpack(due))
redis.call('HDEL', KEYS[3], unpack(due))
redis.call('ZREM', KEYS[4], unpack(due))
redis.call('ZREM', KEYS[1], unpack(due))
return #due
