-- gate.lua: a concurrency key's admissions, in the transaction of a workflow's commit.
--
-- KEYS[1]  the workflow hash            ({flow}:wf:<id>)
-- KEYS[2]  the key's running set        ({flow}:running:<key>)
-- KEYS[3]  the key's waiting line       ({flow}:run-queue:<key>: workflow -> order)
-- KEYS[4]  the lifecycle stream         ({flow}:lifecycle)
--
-- ARGV[1]  the name of the version field of KEYS[1]
-- ARGV[2]  the version the commit wrote ('' = no check): nothing happens unless KEYS[1]
--          holds it, so a commit that lost its race (advance.lua returned 0 in the same
--          MULTI) admits and releases nothing
-- ARGV[3]  the workflow id
-- ARGV[4]  max running of the key
-- ARGV[5]  the JSON of the admit-workflow kind ('"admit-workflow"')
-- then n, (op, order) × n, op 'enter' (queue the workflow at order) or 'leave' (it ended:
-- out of both sets)
--
-- Then, while fewer than max run and someone waits, the first in line is admitted:
-- added to KEYS[2] and an admit-workflow for it appended to KEYS[4]. Writes KEYS[2..4].
-- Returns how many were admitted.

if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
local workflow, max = ARGV[3], tonumber(ARGV[4])
local n = tonumber(ARGV[6])
local i = 7
for _ = 1, n do
  if ARGV[i] == 'enter' then
    redis.call('ZADD', KEYS[3], 'NX', ARGV[i + 1], workflow)
  else
    redis.call('SREM', KEYS[2], workflow)
    redis.call('ZREM', KEYS[3], workflow)
  end
  i = i + 2
end
local admitted = 0
while redis.call('SCARD', KEYS[2]) < max do
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not first then break end
  redis.call('ZREM', KEYS[3], first)
  redis.call('SADD', KEYS[2], first)
  redis.call('XADD', KEYS[4], '*', 'kind', ARGV[5], 'workflow', cjson.encode(first))
  admitted = admitted + 1
end
return admitted
