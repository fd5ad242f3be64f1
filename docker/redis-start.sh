#!/bin/sh
# Starts Redis for docker-compose.yml with the password in a config file, never on a command line
# (`--requirepass <password>` shows in `ps` and in `docker inspect`'s Args).
#
#   REDISCLI_AUTH=<password> sh redis-start.sh [extra redis-server flags]
#
# Writes $GSPO_REDIS_RUN_DIR/redis.conf (default /run/redis, a tmpfs in compose; mode 600): the
# shipped $GSPO_REDIS_CONF (default /usr/local/etc/redis/redis.conf), then `requirepass`. Then
# execs redis-server on it, through the image's entrypoint when there is one (it drops root).
# The same password reaches redis-cli (the healthcheck) as REDISCLI_AUTH, its own variable.
set -eu
umask 077
password="${REDISCLI_AUTH:-}"
case "$password" in
    ""|*[!A-Za-z0-9._~-]*)
        echo "GSPO_REDIS_PASSWORD must be non-empty and URL-safe ([A-Za-z0-9._~-]): it goes" \
             "into the servers' redis:// URL" >&2
        exit 1 ;;
esac
run_dir="${GSPO_REDIS_RUN_DIR:-/run/redis}"
conf="$run_dir/redis.conf"
mkdir -p "$run_dir"
{
    cat "${GSPO_REDIS_CONF:-/usr/local/etc/redis/redis.conf}"
    echo
    echo "# Added by redis-start.sh from REDISCLI_AUTH (docker-compose.yml: GSPO_REDIS_PASSWORD)."
    printf 'requirepass %s\n' "$password"
} > "$conf"
if command -v docker-entrypoint.sh >/dev/null 2>&1; then
    # The official image's entrypoint runs redis-server as the `redis` user: it must read the file.
    if [ "$(id -u)" = 0 ]; then chown redis "$run_dir" "$conf"; fi
    exec docker-entrypoint.sh redis-server "$conf" "$@"
fi
exec redis-server "$conf" "$@"
