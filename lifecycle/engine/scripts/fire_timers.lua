-- fire_timers.lua: turn due durable timers into lifecycle events, each exactly once.
--
-- KEYS[1]  the timers sorted set ({flow}:timers); members are JSON
--          {"kind": "retry-task"|"timeout-task", "workflow", "key", "attempt"}
-- KEYS[2]  the lifecycle stream ({flow}:lifecycle)
-- ARGV[1]  now in ms ('' = Redis TIME, the clock every worker shares)
-- ARGV[2]  the most timers to fire in this call
--
-- Appends one event per due timer and removes it, atomically: however many
-- lifecycle workers call this, a timer fires once. Returns the number fired.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local timer = cjson.decode(member)
  redis.call('XADD', KEYS[2], '*',
    'kind', cjson.encode(timer['kind']),
    'workflow', cjson.encode(timer['workflow']),
    'key', cjson.encode(timer['key']),
    'attempt', cjson.encode(timer['attempt']))
  redis.call('ZREM', KEYS[1], member)
end
return #due
