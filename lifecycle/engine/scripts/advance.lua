-- advance.lua: commit one workflow's transition atomically, if nobody else did first.
--
-- KEYS[1]  the workflow hash            ({flow}:wf:<id>)
-- KEYS[2]  the lifecycle stream         ({flow}:lifecycle)
-- KEYS[3]  the timers sorted set        ({flow}:timers)
-- KEYS[4]  the workflows index          ({flow}:workflows)
-- KEYS[5]  the outcome counters         ({flow}:outcomes)
-- KEYS[6]  retention's schedule         ({flow}:expiring)
-- KEYS[7]  the stop records            ({flow}:stopped: workflow id -> stopped attempts)
-- KEYS[8]  the compacted workflows     ({flow}:compacted: workflow id -> record)
--
-- ARGV[1]  the lifecycle consumer group
-- ARGV[2]  the version the transition was computed from ('' = the workflow must not exist)
-- ARGV[3]  the name of the version field of KEYS[1]
-- ARGV[4]  the workflow id (the member of KEYS[4])
-- ARGV[5]  '1' to delete the workflow's record first (KEYS[1] and its members of KEYS[4],
--          [6], [7], [8]), before anything below writes: a start after a delete writes anew
-- then six sections, each led by its count:
--   acks    n, entry id × n                          XACK on KEYS[2]
--   fields  n, (field, value) × n                    HSET on KEYS[1] (includes the new version)
--   removed n, field × n                             HDEL on KEYS[1]
--   events  n, (stream, m, (field, value) × m) × n   XADD stream * fields (task streams
--           and KEYS[2]: named here, not in KEYS, as the lifecycle's ACL grants the task
--           streams write only, which a key declared to EVALSHA does not satisfy; all
--           carry KEYS[1]'s hash tag, so they are in its slot on a cluster)
--   timers  n, (score, member) × n                   ZADD on KEYS[3]
--   cancels n, member × n                            ZREM on KEYS[3]
-- and last: the creation time for KEYS[4], or '' when the workflow already exists
-- (written after the acks, before the record; read as ARGV[#ARGV - 5]);
-- the status the workflow ends with (counted in KEYS[5]), or '' while it runs;
-- when retention removes it (ms, score in KEYS[6]), or '';
-- its stop record for KEYS[7] (it ended failed or terminated: the attempts it stopped), or '';
-- '1' to remove its stop record (it finished after a restart), or '';
-- '1' to take it off retention's schedule KEYS[6] (restarted), or ''.
--
-- Returns 1 when committed, 0 when the version moved (another worker advanced
-- the workflow first: nothing is written, the caller reloads and recomputes).

local version = redis.call('HGET', KEYS[1], ARGV[3])
if ARGV[2] == '' then
  if version then return 0 end
elseif version ~= ARGV[2] then
  return 0
end

-- Calls cmd(head..., ARGV[from .. from + count*width - 1]), in slices when
-- there are many: unpack() of a few thousand values overflows Lua's C stack.
local function sliced(head, from, count, width)
  local slice = 256
  if count == 0 then return from end
  if count <= slice then  -- the common case: one call, no copying
    local n = #head
    if n == 2 then
      redis.call(head[1], head[2], unpack(ARGV, from, from + count * width - 1))
    else
      redis.call(head[1], head[2], head[3], unpack(ARGV, from, from + count * width - 1))
    end
    return from + count * width
  end
  for first = 0, count - 1, slice do
    local last = math.min(count, first + slice)
    local args = {unpack(head)}
    for k = from + first * width, from + last * width - 1 do
      args[#args + 1] = ARGV[k]
    end
    redis.call(unpack(args))
  end
  return from + count * width
end

if ARGV[5] ~= '' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[4], ARGV[4])
  redis.call('ZREM', KEYS[6], ARGV[4])
  redis.call('HDEL', KEYS[7], ARGV[4])
  redis.call('HDEL', KEYS[8], ARGV[4])
end

local i = 6
local n = tonumber(ARGV[i]); i = i + 1
i = sliced({'XACK', KEYS[2], ARGV[1]}, i, n, 1)

-- The index entry before the record: a write refused further on ends the script with
-- what it wrote so far in place, and the lifecycle takes an id the index does not list
-- for one with no record (a start alone asks the index only). After the XACKs: a full
-- Redis refuses a ZADD only as a script's first write, and an XACK is allowed then.
local created = ARGV[#ARGV - 5]
if created ~= '' then
  redis.call('ZADD', KEYS[4], created, ARGV[4])
end

n = tonumber(ARGV[i]); i = i + 1
i = sliced({'HSET', KEYS[1]}, i, n, 2)

n = tonumber(ARGV[i]); i = i + 1
i = sliced({'HDEL', KEYS[1]}, i, n, 1)

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local m = tonumber(ARGV[i + 1])
  redis.call('XADD', ARGV[i], '*', unpack(ARGV, i + 2, i + 1 + 2 * m))
  i = i + 2 + 2 * m
end

n = tonumber(ARGV[i]); i = i + 1
i = sliced({'ZADD', KEYS[3]}, i, n, 2)

n = tonumber(ARGV[i]); i = i + 1
i = sliced({'ZREM', KEYS[3]}, i, n, 1)

if ARGV[i + 1] ~= '' then
  redis.call('HINCRBY', KEYS[5], ARGV[i + 1], 1)
end
if ARGV[i + 2] ~= '' then
  redis.call('ZADD', KEYS[6], ARGV[i + 2], ARGV[4])
end
if ARGV[i + 3] ~= '' then
  redis.call('HSET', KEYS[7], ARGV[4], ARGV[i + 3])
elseif ARGV[i + 4] ~= '' then
  redis.call('HDEL', KEYS[7], ARGV[4])
end
if ARGV[i + 5] ~= '' then
  redis.call('ZREM', KEYS[6], ARGV[4])
end
return 1
