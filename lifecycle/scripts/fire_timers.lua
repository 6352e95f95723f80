-- fire_timers.lua: turn due durable timers into lifecycle events, each exactly once.
--
-- KEYS[1]  the timers sorted set ({flow}:timers); members are JSON
--          {"kind": "retry-task"|"timeout-task", "workflow", "key", "attempt"}
-- KEYS[2]  the lifecycle stream ({flow}:lifecycle)
-- ARGV[1]  now (ms); ARGV[2] the most timers to fire in this call
--
-- Appends one event per due timer and removes it, atomically: however many
-- lifecycle workers call this, a timer fires once. Returns the number fired.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
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
