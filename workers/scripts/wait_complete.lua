-- wait_complete.lua: end one registered wait:event task, exactly once.
--
-- KEYS[1]  the waits hash ({flow}:wait:tasks): task id -> record (see wait_register.lua)
-- KEYS[2]  the lifecycle stream ({flow}:lifecycle): XADD end-task (and the receipt)
-- KEYS[3]  the event waits hash it is registered in ({flow}:wait:event:<kind>)
-- ARGV[1]  the task instance id
-- ARGV[2]  the output's JSON text ('' = the record's: the task input)
-- ARGV[3]  the id of the event that ended it, for a receipt ('' = no receipt)
-- ARGV[4]  an error: end the task with FAILURE and this text instead ('' = SUCCESS)
--
-- The HDEL of the record decides: only the first caller finds it. Returns 1
-- when this call ended the task, 0 when it had already ended.

redis.call('HDEL', KEYS[3], ARGV[1])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local record = cjson.decode(raw)
local args = {'XADD', KEYS[2], '*'}
for _, value in ipairs(record['fields']) do args[#args + 1] = value end
args[#args + 1] = 'status'
if (ARGV[4] or '') ~= '' then
  args[#args + 1] = '"FAILURE"'
  args[#args + 1] = 'error'
  args[#args + 1] = cjson.encode(ARGV[4])
else
  local output = ARGV[2]
  if output == '' then output = record['output'] end
  args[#args + 1] = '"SUCCESS"'
  args[#args + 1] = 'output'
  args[#args + 1] = output
end
redis.call(unpack(args))
if ARGV[3] ~= '' then
  redis.call('XADD', KEYS[2], '*', 'kind', '"receipt"', 'apiVersion', '"v1"',
    'for', cjson.encode(ARGV[3]), 'action', '"processed"', 'target', cjson.encode(ARGV[1]))
end
return 1
