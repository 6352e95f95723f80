#!/bin/sh
# Writes the files deploy/compose.yaml mounts as secrets, with fresh random values:
#   secrets/redis.acl       Redis users: `default` may only PING (the health check);
#                           `flowstream` is the engine's user
#   secrets/redis-url       redis://flowstream:PASSWORD@redis:6379/0 (REDIS_URL_FILE)
#   secrets/api-tokens      the API's --token-file: one read and one operate token
#   secrets/api-read-token  the read token alone (the API's health check sends it)
# An existing file is kept, so running it again changes nothing. For one Redis user per
# component, put the lines of docs/security.md in redis.acl (`user NAME ...` in place of
# `ACL SETUSER NAME ...`) and give each service its own URL file.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets
random() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }

if [ ! -f secrets/redis.acl ]; then
    password=$(random)
    printf 'user default on nopass resetchannels -@all +ping\nuser flowstream on >%s ~* &* +@all\n' \
        "$password" >secrets/redis.acl
    printf 'redis://flowstream:%s@redis:6379/0\n' "$password" >secrets/redis-url
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
