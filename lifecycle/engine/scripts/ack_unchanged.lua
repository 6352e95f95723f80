-- ack_unchanged.lua: acknowledge the events judged to change nothing of a workflow,
-- if the workflow is still as that judgement read it.
--
-- A judgement made outside a WATCH (after a lost race, or of a workflow known by its
-- compacted entry, which no WATCH covers) may rest on a record another worker has
-- changed since: a start judged a duplicate of a workflow a delete has just removed
-- must run. The caller judges the events again when this answers 0.
--
-- KEYS[1]  the workflow hash            ({flow}:wf:<id>)
-- KEYS[2]  the lifecycle stream         ({flow}:lifecycle)
-- KEYS[3]  the compacted workflows      ({flow}:compacted: workflow id -> record)
--
-- ARGV[1]  the lifecycle consumer group
-- ARGV[2]  the version the judgement read ('' = no hash)
-- ARGV[3]  the name of the version field of KEYS[1]
-- ARGV[4]  the workflow id (its field of KEYS[3])
-- ARGV[5]  '1' when it was read as compacted (no hash, an entry of KEYS[3]), else '0'
-- ARGV[6…] the entry ids to acknowledge (none: only the check)
--
-- Writes: KEYS[2] (XACK), when the check holds.
-- Returns 1 when the workflow is as it was read (the ids acknowledged), 0 otherwise.

local version = redis.call('HGET', KEYS[1], ARGV[3]) or ''
if version ~= ARGV[2] then return 0 end
if version == '' then
  local compacted = redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1
  if compacted ~= (ARGV[5] == '1') then return 0 end
end
-- in slices: unpack() of a few thousand values overflows Lua's C stack
for first = 6, #ARGV, 256 do
  redis.call('XACK', KEYS[2], ARGV[1], unpack(ARGV, first, math.min(#ARGV, first + 255)))
end
return 1
