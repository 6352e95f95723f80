#!/bin/sh
# Writes the files deploy/compose.yaml mounts as secrets, with fresh random values:
#   secrets/redis.acl            Redis users, one per component (docs/security.md); the
#                                `default` user may only PING (Redis's health check)
#   secrets/redis-url-NAME       each user's URL, redis://USER:PASSWORD@redis:6379/0,
#                                for lifecycle, receipts, resource, shop, reader, admin
#   secrets/redis-password-reader  the reader's password alone (KEDA's scaler)
#   secrets/api-tokens           the API's --token-file: one read and one operate token
#   secrets/api-read-token       the read token alone (the API's health check sends it)
# An existing file is kept, so running it again changes nothing; delete secrets/ to
# start over (then recreate the Redis container: it reads the ACL file at start).
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets
random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

# The rules of docs/security.md (tests/deploy/test_compose.py checks they still
# are): the lifecycle worker's with the add-on for serving wait: tasks, the task
# user's for kind `shop` with the add-on for Task.cancelled() (the example calls it).
# `admin` is for the API and for operators' commands (run, recover, ...), which need
# more than one component's rights.
LIFECYCLE='-@all +info +ping +hello +client|setinfo +client|id +client|unblock +select +xreadgroup +xack +xautoclaim +xclaim +xpending +xgroup|create +xadd +hget +hmget +hgetall +hset +hdel +del +hincrby +set +zadd +zrem +zrangebyscore +time +get +smembers +exists +watch +unwatch +multi +exec +discard +evalsha +eval +script|load +script|exists ~{flow}:lifecycle ~{flow}:wf:* ~{flow}:workflows ~{flow}:outcomes ~{flow}:timers ~{flow}:expiring ~{flow}:stopped ~{flow}:retention ~{flow}:limits %W~{flow}:lifecycle:dead %W~{flow}:tasks:* %R~{flow}:graph:* ~{flow}:tasks:*:dead %R~{flow}:kinds %R~{flow}:priorities +zscore ~{flow}:schedules ~{flow}:schedule:* ~{flow}:schedule-runs:* +sadd +srem +scard +zrange ~{flow}:running:* ~{flow}:run-queue:* ~{flow}:partitions +hkeys +hexists +rpush +lindex +lpop ~{flow}:compacted ~{flow}:expiring-compacted ~{flow}:expiring-compacted-last ~{flow}:graph-refs +xinfo|groups +xrange +time +hgetall +hdel +zrange +incr +decr +del +sadd +srem +smembers ~{flow}:tasks:wait ~{flow}:wait:* ~{flow}:latch:* ~{flow}:latch-waiting:* %W~{flow}:tasks:wait:dead ~{flow}:tasks:wait:p*'
RECEIPTS='-@all +info +ping +hello +client|setinfo +client|id +client|unblock +select +xread +xreadgroup +xack +xautoclaim +xpending +xrange +xlen +xtrim +xinfo|groups +xinfo|stream +xgroup|create +xgroup|setid +exists +smembers +get +set +evalsha +eval +script|load +script|exists ~{flow}:lifecycle ~{flow}:lifecycle:dead ~{flow}:tasks:* %R~{flow}:kinds %R~{flow}:priorities %R~{flow}:graph:* %W~{flow}:archive %R~{flow}:partitions'
RESOURCE='-@all +info +ping +hello +client|setinfo +client|id +client|unblock +select +xreadgroup +xack +xautoclaim +xclaim +xpending +xgroup|create +xadd +multi +exec +discard +evalsha +eval +script|load +script|exists +hmget +exists +smembers ~{flow}:tasks:resource %W~{flow}:tasks:resource:dead ~{flow}:tasks:resource:p* %W~{flow}:lifecycle %R~{flow}:stopped %R~{flow}:priorities +hget +time +zadd +zrem +zscore +zrank +zcard +zrange +zrangebyscore +zremrangebyscore +lpush +pexpire +del +blpop %R~{flow}:kind-limits ~{flow}:slots:resource ~{flow}:slot-queue:resource ~{flow}:slot-waiting:resource ~{flow}:slot-wake:resource:* ~{flow}:slot-batches:resource +get %R~{flow}:partitions'
SHOP='-@all +info +ping +hello +client|setinfo +client|id +client|unblock +select +xreadgroup +xack +xautoclaim +xclaim +xpending +xgroup|create +xadd +multi +exec +discard +evalsha +eval +script|load +script|exists +hmget +exists +smembers ~{flow}:tasks:shop %W~{flow}:tasks:shop:dead ~{flow}:tasks:shop:p* %W~{flow}:lifecycle %R~{flow}:stopped %R~{flow}:priorities +hget +time +zadd +zrem +zscore +zrank +zcard +zrange +zrangebyscore +zremrangebyscore +lpush +pexpire +del +blpop %R~{flow}:kind-limits ~{flow}:slots:shop ~{flow}:slot-queue:shop ~{flow}:slot-waiting:shop ~{flow}:slot-wake:shop:* ~{flow}:slot-batches:shop +get %R~{flow}:partitions ~{flow}:wf:* +hget'
READER='-@all +ping +hello +client|setinfo +client|id +select +get +hget +hmget +hgetall +hkeys +smembers +exists +zrange +zrevrange +zrangebyscore +zcard +llen +lindex +xrange +xrevrange +xread +xinfo|stream +xinfo|groups +xinfo|consumers +xlen +info %R~{flow}:*'
ADMIN='~* &* +@all'

if [ ! -f secrets/redis.acl ]; then
    printf 'user default on nopass resetchannels -@all +ping\n' >secrets/redis.acl.new
    for entry in lifecycle:LIFECYCLE receipts:RECEIPTS resource:RESOURCE shop:SHOP \
        reader:READER admin:ADMIN; do
        name=${entry%%:*}
        eval "rules=\$${entry#*:}"
        password=$(random)
        printf 'user flowstream-%s on >%s %s\n' "$name" "$password" "$rules" \
            >>secrets/redis.acl.new
        printf 'redis://flowstream-%s:%s@redis:6379/0\n' "$name" "$password" \
            >"secrets/redis-url-$name"
        # KEDA's scaler takes the reader's password apart from its URL.
        if [ "$name" = reader ]; then printf '%s' "$password" >secrets/redis-password-reader; fi
    done
    mv secrets/redis.acl.new secrets/redis.acl
fi
if [ ! -f secrets/api-tokens ]; then
    read_token=$(random)
    printf 'read:%s\noperate:%s\n' "$read_token" "$(random)" >secrets/api-tokens
    printf '%s\n' "$read_token" >secrets/api-read-token
fi
# The containers run as other users (redis, uid 10001) and bind-mount each file as it
# is: the files are readable to them, the directory (0700) to nobody else on the host.
chmod 644 secrets/*
echo "secrets in $(pwd)/secrets"
