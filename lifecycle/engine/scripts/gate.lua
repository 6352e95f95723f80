#!lua flags=allow-oom
-- gate.lua: admissions under concurrency keys, in the transaction of the commits that
-- queue workflows and end them: one call for every such commit of a transaction.
--
-- KEYS[1]  the lifecycle stream         ({flow}:lifecycle)
-- KEYS[2]  the timers sorted set        ({flow}:timers)
-- KEYS[1+2j], KEYS[2+2j]  for j = 1..K: the running set ({flow}:running:<key>) and the
--          waiting line ({flow}:run-queue:<key>: workflow -> order) of the j-th key
-- KEYS[3+2K..]  the hash of each section's workflow ({flow}:wf:<id>), in section order
--
-- ARGV[1]  the name of the version field of a workflow hash
-- ARGV[2]  the JSON of the admit-workflow kind ('"admit-workflow"')
-- ARGV[3]  the name of the admit-workflow field that says its start-tasks went ('sent')
-- ARGV[4]  the CONCURRENCY field name;  ARGV[5]  the held-list field name (PAUSED)
-- ARGV[6]  K, the number of keys;  ARGV[7]  S, the number of sections
-- then S sections, one per commit, in the order of the commits:
--   j (the section's key), max running of the key, the workflow id,
--   the version the commit wrote ('' = no check: in a watched transaction, whose EXEC
--   runs only if the commit won; else nothing happens unless the hash holds it, so a
--   commit that lost its race, advance.lua returning 0 in the same MULTI, admits and
--   releases nothing),
--   n, then (op, order) × n, op 'enter' (queue the workflow at order) or 'leave' (it
--   ended: out of both sets),
--   then the offer, for a commit that queues its workflow with its start-tasks held:
--   '' (no offer) or the workflow's CONCURRENCY value once admitted (the commit wrote the
--   workflow as admitted: that value, no held list), its CONCURRENCY value while queued
--   and its held list (written here when it is not admitted), then
--     m, (stream, f, (field, value) × f) × m   its held start-tasks, as XADD stream * fields
--                                              (each with admitted = true)
--     (the task streams are named here, not in KEYS: the lifecycle's ACL grants them write
--     only, which a key declared to EVAL does not satisfy; they carry the hash tag of
--     KEYS, so they are in its slot on a cluster)
--     t, (score, member) × t                   their timeout timers, ZADD on KEYS[2]
--
-- A section carries out its ops, then, while fewer than max run under its key and someone
-- waits, admits the first in line: added to the running set and an admit-workflow for it
-- appended to KEYS[1]. When the first is the section's own workflow and an offer came, the
-- admission is carried out here, so no second advance is needed: its start-tasks and
-- timers written, and the record stands as the commit wrote it, admitted, which is what
-- applying an admit-workflow would write (the start records n:<key> included); an offered
-- workflow not admitted is written queued (its CONCURRENCY value and held list).
-- Nothing goes to the lifecycle stream then, as no lifecycle worker has anything left to
-- do: the offered start-tasks carry admitted = true, which is how replay knows the
-- admission happened here. Only an offer without start-tasks, which nothing in the archive
-- would show, still writes an admit-workflow with sent = true (acknowledged as done,
-- applied by replay).
--
-- Its writes go through when Redis is out of memory (flags=allow-oom), as the commit's did:
-- advance.lua's first write is an XACK, which Redis allows then, and once a script has
-- written, its other writes go through too. Without the flag the commit would stand, its
-- events acknowledged, and its admission be refused: a workflow left queued for good. (A
-- watched transaction's plain writes are refused when queued: then nothing is written.)
--
-- Sections run in order, each as if it were called alone after its commit's writes (the
-- commits' writes touch none of the keys a section reads). A section that fails stops
-- alone: its reply is its error, the others go on. Returns one reply per section: the
-- number of workflows it admitted, or its error.

local VERSION, ADMIT, SENT = ARGV[1], ARGV[2], ARGV[3]
local CONCURRENCY, HELD = ARGV[4], ARGV[5]
local K, S = tonumber(ARGV[6]), tonumber(ARGV[7])

-- Per key, what this call knows: how many run, and whether its line is empty (nil:
-- unknown). Only this call changes them while it runs.
local count, empty = {}, {}

local function running(j)
  if count[j] == nil then count[j] = redis.call('SCARD', KEYS[1 + 2 * j]) end
  return count[j]
end

local function line_empty(j)
  if empty[j] == nil then empty[j] = not redis.call('ZRANGE', KEYS[2 + 2 * j], 0, 0)[1] end
  return empty[j]
end

local function add(j, workflow)
  local added = redis.call('SADD', KEYS[1 + 2 * j], workflow)
  if count[j] then count[j] = count[j] + added end
end

local function remove(j, workflow)
  local removed = redis.call('SREM', KEYS[1 + 2 * j], workflow)
  if count[j] then count[j] = count[j] - removed end
  return removed
end

local function admit_sent(workflow, offer)
  local m = tonumber(ARGV[offer + 3])
  local at = offer + 4
  if m == 0 then
    redis.call('XADD', KEYS[1], '*', 'kind', ADMIT, 'workflow', cjson.encode(workflow), SENT,
      'true')
  end
  for _ = 1, m do
    local f = tonumber(ARGV[at + 1])
    redis.call('XADD', ARGV[at], '*', unpack(ARGV, at + 2, at + 1 + 2 * f))
    at = at + 2 + 2 * f
  end
  local t = tonumber(ARGV[at]); at = at + 1
  -- In slices: unpack() of a few thousand values overflows Lua's C stack.
  for first = 0, t - 1, 256 do
    local last = math.min(t, first + 256)
    redis.call('ZADD', KEYS[2], unpack(ARGV, at + 2 * first, at + 2 * last - 1))
  end
end

local function section(hash, j, max, workflow, version, n, ops, offer)
  if version ~= '' and redis.call('HGET', hash, VERSION) ~= version then
    return 0
  end
  local offered = offer ~= nil and n > 0 and ARGV[ops + 2 * (n - 1)] == 'enter'

  -- The common cases in few commands: it enters, nobody waits and there is room; it
  -- ended while admitted, nobody waits.
  if offered and n == 1 and line_empty(j) and running(j) < max then
    add(j, workflow)
    admit_sent(workflow, offer)
    return 1
  end
  if n == 1 and ARGV[ops] == 'leave' and remove(j, workflow) == 1 and line_empty(j) then
    return 0
  end

  local line = KEYS[2 + 2 * j]
  for at = ops, ops + 2 * (n - 1), 2 do
    if ARGV[at] == 'enter' then
      redis.call('ZADD', line, 'NX', ARGV[at + 1], workflow)
      empty[j] = false
    else
      remove(j, workflow)
      if redis.call('ZREM', line, workflow) == 1 then empty[j] = nil end
    end
  end

  local admitted, mine = 0, false
  while running(j) < max do
    local first = redis.call('ZRANGE', line, 0, 0)[1]
    if not first then
      empty[j] = true
      break
    end
    redis.call('ZREM', line, first)
    empty[j] = nil
    add(j, first)
    if offered and first == workflow then
      admit_sent(workflow, offer)
      mine = true
    else
      redis.call('XADD', KEYS[1], '*', 'kind', ADMIT, 'workflow', cjson.encode(first))
    end
    admitted = admitted + 1
  end
  if offered and not mine then
    redis.call('HSET', hash, CONCURRENCY, ARGV[offer + 1], HELD, ARGV[offer + 2])
  end
  return admitted
end

local replies, at = {}, 8
for s = 1, S do
  local j, max, workflow, version = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), ARGV[at + 2],
    ARGV[at + 3]
  local n = tonumber(ARGV[at + 4])
  local ops = at + 5
  local offer = ops + 2 * n
  if ARGV[offer] == '' then
    at, offer = offer + 1, nil
  else
    at = offer + 4
    for _ = 1, tonumber(ARGV[offer + 3]) do at = at + 2 + 2 * tonumber(ARGV[at + 1]) end
    at = at + 1 + 2 * tonumber(ARGV[at])
  end
  local ok, reply = pcall(section, KEYS[2 + 2 * K + s], j, max, workflow, version, n, ops, offer)
  if ok then
    replies[s] = reply
  else
    count[j], empty[j] = nil, nil  -- what it changed before it failed is read again
    if type(reply) == 'table' and reply.err then  -- a command's error, as a table
      replies[s] = reply
    elseif type(reply) == 'string' and string.find(reply, '^%u[%u_]+ ') then  -- as a string
      replies[s] = {err = reply}
    else  -- a fault of the script itself
      replies[s] = {err = 'ERR gate: ' .. tostring(reply)}
    end
  end
end
return replies
