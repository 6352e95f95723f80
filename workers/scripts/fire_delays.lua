-- fire_delays.lua: end the wait:delay tasks that are due, each exactly once.
--
-- KEYS[1]  the delays sorted set ({flow}:wait:delays): task id scored by due ms
-- KEYS[2]  the waits hash ({flow}:wait:tasks): task id -> record (see wait_register.lua)
-- KEYS[3]  the lifecycle stream ({flow}:lifecycle)
-- ARGV[1]  now in ms ('' = Redis TIME: the clock the start-task ids were stamped with)
-- ARGV[2]  the most delays to end in this call
--
-- Appends each due task's end-task and removes its wait in one script, so
-- however many WaitWorkers poll, a delay ends once. Returns {ended, next due
-- ms or -1}.

if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local ended = 0
for _, id in ipairs(due) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local record = cjson.decode(raw)
    local args = {'XADD', KEYS[3], '*'}
    for _, value in ipairs(record['fields']) do args[#args + 1] = value end
    args[#args + 1] = 'status'
    args[#args + 1] = '"SUCCESS"'
    args[#args + 1] = 'output'
    args[#args + 1] = record['output']
    redis.call(unpack(args))
    redis.call('HDEL', KEYS[2], id)
    ended = ended + 1
  end
  redis.call('ZREM', KEYS[1], id)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {ended, tonumber(first[2] or '-1')}
