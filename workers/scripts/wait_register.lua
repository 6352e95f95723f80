-- wait_register.lua: take one wait: start-task — acknowledge it and register or end its wait,
-- atomically, exactly once per start-task entry.
--
-- KEYS[1]  the wait task stream ({flow}:tasks:wait)        XACK of the start-task
-- KEYS[2]  the lifecycle stream ({flow}:lifecycle)         XADD end-task when it ends now
-- KEYS[3]  the waits hash ({flow}:wait:tasks)              HSET task id -> record
-- KEYS[4]  per op: delays zset | event waits hash | latch counter   (else KEYS[3])
-- KEYS[5]  the latch's waiters set (countdown, release)            (else KEYS[3])
--
-- ARGV[1]  the consumer group        ARGV[2]  the start-task entry id
-- ARGV[3]  op: fail | delay | event | acquire | release | countdown
-- ARGV[4]  the task instance id
-- ARGV[5]  record JSON: {"fields": [name, json, ...] of the end-task without status,
--          output and error; "output": JSON text of the output on success}
-- ARGV[6]  per op: due time ms (delay), the event wait JSON (event), the error (fail),
--          the latch name (acquire, release, countdown)
--
-- The XACK comes first: it answers 1 only to the first caller for this entry,
-- so a start-task delivered twice (claimed from a stalled worker) takes effect
-- once. Returns 0: already taken (nothing written); 1: ended now; 2: waiting;
-- 3: failed now.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end

local function emit(record, tail)
  local args = {'XADD', KEYS[2], '*'}
  for _, value in ipairs(record['fields']) do args[#args + 1] = value end
  for _, value in ipairs(tail) do args[#args + 1] = value end
  redis.call(unpack(args))
end

local function succeed(record)
  emit(record, {'status', '"SUCCESS"', 'output', record['output']})
  return 1
end

local function fail(record, message)
  emit(record, {'status', '"FAILURE"', 'error', cjson.encode(message)})
  return 3
end

local op, id, record = ARGV[3], ARGV[4], cjson.decode(ARGV[5])

if op == 'fail' then return fail(record, ARGV[6]) end

if op == 'delay' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if tonumber(ARGV[6]) <= now then return succeed(record) end
  redis.call('HSET', KEYS[3], id, ARGV[5])
  redis.call('ZADD', KEYS[4], ARGV[6], id)
  return 2
end

if op == 'event' then
  redis.call('HSET', KEYS[3], id, ARGV[5])
  redis.call('HSET', KEYS[4], id, ARGV[6])
  return 2
end

if op == 'acquire' then
  redis.call('INCR', KEYS[4])
  return succeed(record)
end

local held = tonumber(redis.call('GET', KEYS[4]) or '0')

if op == 'countdown' then
  if held <= 0 then return succeed(record) end
  redis.call('HSET', KEYS[3], id, ARGV[5])
  redis.call('SADD', KEYS[5], id)
  return 2
end

if op == 'release' then
  if held <= 0 then
    return fail(record, 'latch ' .. cjson.encode(ARGV[6]) .. ' is not held (released more often than acquired)')
  end
  if held > 1 then
    redis.call('DECR', KEYS[4])
    return succeed(record)
  end
  -- The last release: the latch is gone and every countdown waiting on it ends,
  -- after the release itself in the stream.
  redis.call('DEL', KEYS[4])
  succeed(record)
  for _, waiter in ipairs(redis.call('SMEMBERS', KEYS[5])) do
    local raw = redis.call('HGET', KEYS[3], waiter)
    if raw then
      succeed(cjson.decode(raw))
      redis.call('HDEL', KEYS[3], waiter)
    end
  end
  redis.call('DEL', KEYS[5])
  return 1
end

return redis.error_reply('wait_register.lua: unknown op ' .. op)
