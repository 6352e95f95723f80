-- gate.lua: a concurrency key's admissions, in the transaction of a workflow's commit.
--
-- KEYS[1]  the workflow hash            ({flow}:wf:<id>)
-- KEYS[2]  the key's running set        ({flow}:running:<key>)
-- KEYS[3]  the key's waiting line       ({flow}:run-queue:<key>: workflow -> order)
-- KEYS[4]  the lifecycle stream         ({flow}:lifecycle)
-- KEYS[5]  the timers sorted set        ({flow}:timers)
--
-- ARGV[1]  the name of the version field of KEYS[1]
-- ARGV[2]  the version the commit wrote ('' = no check: in a watched transaction, whose
--          EXEC runs only if the commit won): nothing happens unless KEYS[1] holds it, so
--          a commit that lost its race (advance.lua returned 0 in the same MULTI) admits
--          and releases nothing
-- ARGV[3]  the workflow id
-- ARGV[4]  max running of the key
-- ARGV[5]  the JSON of the admit-workflow kind ('"admit-workflow"')
-- ARGV[6]  the name of the admit-workflow field that says its start-tasks went ('sent')
-- ARGV[7]  n, then (op, order) × n, op 'enter' (queue the workflow at order) or 'leave' (it
--          ended: out of both sets)
-- then the offer, for a commit that leaves the workflow queued with its start-tasks held:
--   the workflow's CONCURRENCY value once admitted ('' = no offer: nothing follows),
--   the CONCURRENCY field name, the held-list field name (PAUSED),
--   m, (stream, f, (field, value) × f) × m      its held start-tasks, as XADD stream * fields
--                                                (each with admitted = true)
--   (the task streams are named here, not in KEYS: the lifecycle's ACL grants them write
--   only, which a key declared to EVAL does not satisfy; they carry KEYS[1]'s hash tag,
--   so they are in its slot on a cluster)
--   t, (score, member) × t                       their timeout timers, ZADD on KEYS[5]
--
-- Then, while fewer than max run and someone waits, the first in line is admitted:
-- added to KEYS[2] and an admit-workflow for it appended to KEYS[4]. When the first is
-- this commit's own workflow and an offer came, the admission is carried out here, so
-- no second advance is needed: its start-tasks and timers written, its CONCURRENCY set
-- and held list removed, exactly what applying an admit-workflow would write (the start
-- records n:<key> stand as the commit wrote them). Nothing goes to the lifecycle stream
-- then, as no lifecycle worker has anything left to do: the offered start-tasks carry
-- admitted = true, which is how replay knows the admission happened here. Only an offer
-- without start-tasks, which nothing in the archive would show, still writes an
-- admit-workflow with sent = true (acknowledged as done, applied by replay). Writes
-- KEYS[1..5] and the task streams. Returns how many were admitted.
--
-- (A watched transaction whose commit only leaves, with nobody in the key's line,
-- calls no gate: it watches the line and frees the place with SREM; advance.py.)

if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
local workflow, max = ARGV[3], tonumber(ARGV[4])
local n = tonumber(ARGV[7])
local i = 8 + 2 * n  -- the offer
local offered = n > 0 and ARGV[i] ~= '' and ARGV[i - 2] == 'enter'

local function admit_sent()
  local admitted_value, concurrency, held = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local j = i + 3
  local m = tonumber(ARGV[j]); j = j + 1
  if m == 0 then
    redis.call('XADD', KEYS[4], '*', 'kind', ARGV[5], 'workflow', cjson.encode(workflow),
      ARGV[6], 'true')
  end
  for _ = 1, m do
    local f = tonumber(ARGV[j + 1])
    redis.call('XADD', ARGV[j], '*', unpack(ARGV, j + 2, j + 1 + 2 * f))
    j = j + 2 + 2 * f
  end
  local t = tonumber(ARGV[j]); j = j + 1
  -- In slices: unpack() of a few thousand values overflows Lua's C stack.
  for first = 0, t - 1, 256 do
    local last = math.min(t, first + 256)
    redis.call('ZADD', KEYS[5], unpack(ARGV, j + 2 * first, j + 2 * last - 1))
  end
  redis.call('HSET', KEYS[1], concurrency, admitted_value)
  redis.call('HDEL', KEYS[1], held)
end

-- The common case in few commands: it enters, nobody waits and there is room.
if offered and n == 1 and not redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    and redis.call('SCARD', KEYS[2]) < max then
  redis.call('SADD', KEYS[2], workflow)
  admit_sent()
  return 1
end

-- It ended while admitted (the common end), nobody waits: nothing more to do.
if n == 1 and ARGV[8] == 'leave' and redis.call('SREM', KEYS[2], workflow) == 1
    and not redis.call('ZRANGE', KEYS[3], 0, 0)[1] then
  return 0
end

local at = 8
for _ = 1, n do
  if ARGV[at] == 'enter' then
    redis.call('ZADD', KEYS[3], 'NX', ARGV[at + 1], workflow)
  else
    redis.call('SREM', KEYS[2], workflow)
    redis.call('ZREM', KEYS[3], workflow)
  end
  at = at + 2
end

local admitted = 0
while redis.call('SCARD', KEYS[2]) < max do
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not first then break end
  redis.call('ZREM', KEYS[3], first)
  redis.call('SADD', KEYS[2], first)
  if offered and first == workflow then
    admit_sent()
  else
    redis.call('XADD', KEYS[4], '*', 'kind', ARGV[5], 'workflow', cjson.encode(first))
  end
  admitted = admitted + 1
end
return admitted
