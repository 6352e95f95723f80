-- fire_schedule.lua: start what one schedule's due fire times call for, exactly once.
--
-- KEYS[1]  the schedules ({flow}:schedules): name -> next fire time (ms; +inf: paused)
-- KEYS[2]  the schedule's hash ({flow}:schedule:<name>)
-- KEYS[3]  the schedule's runs ({flow}:schedule-runs:<name>): workflow id -> fire time
-- KEYS[4]  the workflows index ({flow}:workflows)
-- KEYS[5]  the lifecycle stream ({flow}:lifecycle)
-- KEYS[6]  the compacted workflows ({flow}:compacted): each one has ended
-- ARGV[1]  the schedule's name
-- ARGV[2]  the next fire time the caller read (ms); '' for run-now, which does not move it
-- ARGV[3]  the next fire time after these (ms); '' leaves it
-- ARGV[4]  the last run id the caller read ('' none)
-- ARGV[5]  overlap policy: skip | allow | cancel-previous
-- ARGV[6]  the name of a workflow's hash without its id ({flow}:wf:), same hash tag
-- ARGV[7]  the workflow field present once it ended
-- ARGV[8]  the plan, JSON: {"now": ms, "missed": n, "stop_last": [field, value, ...],
--          "runs": [{"id", "at", "start": [field, value, ...]}, ...]}
--          ("stop_last": the terminate-workflow event for the last run, "start": a
--          run's start-workflow event)
-- ARGV[9..12]  the schedule hash's fields: next, last, fired, skipped
--
-- The compare-and-set on the next fire time (or, for run-now, on the last run) is what
-- makes N workers fire each fire time once: the first one's call moves it, the others'
-- calls then find it moved and change nothing. A run's workflow id is claimed in the
-- workflows index (ZADD NX) as start_once.lua does, so an id is never started twice.
-- Writes: XADD KEYS[5] (terminate, start), ZADD KEYS[4], ZADD/ZREM KEYS[3], ZADD KEYS[1],
-- HSET/HINCRBY KEYS[2].
-- Returns {started, skipped, last run id, the ids started...}, or {-1, 0, ''} when the schedule moved on
-- (another worker fired it), was paused or removed.

local name = ARGV[1]
if ARGV[2] ~= '' then
  local score = redis.call('ZSCORE', KEYS[1], name)
  if not score or tonumber(score) ~= tonumber(ARGV[2]) then return {-1, 0, ''} end
elseif redis.call('EXISTS', KEYS[2]) == 0 then
  return {-1, 0, ''}
end
local last = redis.call('HGET', KEYS[2], ARGV[10]) or ''
if last ~= ARGV[4] then return {-1, 0, ''} end

local plan = cjson.decode(ARGV[8])

-- Whether the workflow has not ended: running, paused, or its start still queued.
-- A start claimed a minute ago with no record yet was refused: it never ran.
local function running(id)
  if id == '' then return false end
  local claimed = redis.call('ZSCORE', KEYS[4], id)
  if not claimed or redis.call('HGET', ARGV[6] .. id, ARGV[7]) then return false end
  if redis.call('HEXISTS', KEYS[6], id) == 1 then return false end
  return redis.call('EXISTS', ARGV[6] .. id) == 1 or plan['now'] - tonumber(claimed) < 60000
end

-- The policy is about the run before this call's: the fire times one call catches up
-- start together (or are all skipped), and cancel-previous stops that run once.
local busy = running(last)
local started, skipped, ids = 0, tonumber(plan['missed']), {}
for _, run in ipairs(plan['runs']) do
  if busy and ARGV[5] == 'skip' then
    skipped = skipped + 1
  else
    if busy and ARGV[5] == 'cancel-previous' then
      redis.call('XADD', KEYS[5], '*', unpack(plan['stop_last']))
      busy = false
    end
    if redis.call('ZADD', KEYS[4], 'NX', plan['now'], run['id']) == 1 then
      redis.call('XADD', KEYS[5], '*', unpack(run['start']))
      redis.call('ZADD', KEYS[3], run['at'], run['id'])
      started = started + 1
      ids[started] = run['id']
      last = run['id']
    end
  end
end

-- The oldest runs whose workflow is gone (retention, delete) leave the index here; in
-- the steady state the oldest is still there and this costs one ZSCORE.
local oldest = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '+inf', 'LIMIT', 0, 100)
for _, id in ipairs(oldest) do
  if redis.call('ZSCORE', KEYS[4], id) then break end
  redis.call('ZREM', KEYS[3], id)
end

if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], name)
  redis.call('HSET', KEYS[2], ARGV[9], ARGV[3])
end
if last ~= '' then redis.call('HSET', KEYS[2], ARGV[10], last) end
if started > 0 then redis.call('HINCRBY', KEYS[2], ARGV[11], started) end
if skipped > 0 then redis.call('HINCRBY', KEYS[2], ARGV[12], skipped) end
return {started, skipped, last, unpack(ids)}
