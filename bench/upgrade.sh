#!/bin/bash
# Two Weir builds as one cluster, then the older node upgraded in place: a
# check, by hand, that builds one call version apart serve each other's
# calls (bench/RESULTS.md, "A cluster upgraded node by node"), and that an
# actor's WebSocket upgrade through the new node to an actor the old node
# owns is refused 501 by name, then relayed once the old node is upgraded.
#
#   bench/upgrade.sh OLD_WEIR [NEW_WEIR]
#
# OLD_WEIR is a weir binary of the previous build (for example one built
# from an older commit); NEW_WEIR defaults to target/release/weir. Runs as
# root with Debian's PostgreSQL (initdb'd as `postgres` in a temporary
# directory) on 127.0.0.1:55432, the nodes on 127.0.0.1:1808x-1810x.
set -u
OLD=${1:?usage: bench/upgrade.sh OLD_WEIR [NEW_WEIR]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEW=${2:-$ROOT/target/release/weir}
G=$ROOT/guests/target/wasm32-wasip2/release
D=$(mktemp -d /tmp/weir-upgrade.XXXXXX)
chmod 755 $D
mkdir -p $D/pg && chown postgres: $D/pg
PGB=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PG=127.0.0.1:55432
su postgres -s /bin/sh -c "$PGB/initdb -D $D/pg/data -A trust -U weir --no-sync -E UTF8" >/dev/null
su postgres -s /bin/sh -c "$PGB/postgres -D $D/pg/data -p 55432 -k $D/pg -c listen_addresses=127.0.0.1" > $D/pg.log 2>&1 &
for _ in $(seq 100); do $PGB/pg_isready -h 127.0.0.1 -p 55432 -q && break; sleep 0.1; done
$PGB/psql -h 127.0.0.1 -p 55432 -U weir -d postgres -c "CREATE DATABASE weir" >/dev/null ||
  { echo "PostgreSQL did not start: $D/pg.log"; exit 1; }
export WEIR_CLUSTER_SECRET=weir-upgrade-check-secret-0123456789
start() { # binary node http-port admin-port internal-port
  $1 serve $G/gateway.wasm --actor probe=$G/actor_probe.wasm --actor-route probe=/direct \
    --data-dir $D/$2 --cluster postgres://weir@$PG/weir --node $2 \
    --cluster-listen 127.0.0.1:$5 --listen 127.0.0.1:$3 --admin 127.0.0.1:$4 \
    --limit cluster_lease_ms=1000 > $D/$2.log 2>&1 &
  echo $!
}
owner() {
  $PGB/psql -h 127.0.0.1 -p 55432 -U weir -d weir -At -c \
    "SELECT n.name FROM weir_objects o JOIN weir_nodes n ON n.session = o.owner
     WHERE o.key = 'actor/gateway/probe/$1' AND n.expires_at > now()"
}
calls() { # actor n: n calls through each node in turn
  for _ in $(seq "$2"); do
    echo -n "$(curl -s -XPOST 127.0.0.1:18081/probe/$1/incr) $(curl -s -XPOST 127.0.0.1:18082/probe/$1/incr) | "
  done
  echo "(owner: $(owner $1))"
}
upgrade() { # actor: a WebSocket upgrade to it through b (the probe actor answers it, accepting none)
  echo "upgrade to $1 through b (owner: $(owner $1)): $(curl -s -o /dev/null -w '%{http_code}' \
    -H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' \
    -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' 127.0.0.1:18082/direct/$1/echo)"
}
admin() { # node method path
  curl -s -w ' %{http_code}\n' -X "$2" -H "Authorization: Bearer $(cat $D/$1/admin-token)" "127.0.0.1:$([ $1 = a ] && echo 18091 || echo 18092)$3"
}
counters() {
  curl -s -H "Authorization: Bearer $(cat $D/b/admin-token)" 127.0.0.1:18092/status |
    python3 -c 'import json,sys; c=json.load(sys.stdin)["cluster"]; print(c.get("call_versions"), {k: c["counters"].get(k) for k in ("forwarded","served","sent_older")})'
}
echo "a: $($OLD --version), b: $($NEW --version)"
A=$(start $OLD a 18081 18091 18101)
B=$(start $NEW b 18082 18092 18102)
sleep 3
echo "== x and y, called through a (old) and b (new) in turn"
calls x 3
calls y 3
upgrade x; upgrade y
echo "== b's cluster status"; counters
for actor in x y; do
  echo "== inspect and delete $actor through b"
  admin b GET /actors/probe/$actor; admin b DELETE /actors/probe/$actor
done
sleep 1; echo "== a's refusals"; grep -c "call of version" $D/a.log
echo "== a upgraded: stopped, this build started on its data directory"
kill -TERM $A; sleep 2
A=$(start $NEW a 18081 18091 18101); sleep 3
calls x 2
calls y 2
upgrade x; upgrade y
for actor in x y; do
  echo "== inspect and delete $actor through b"
  admin b GET "/actors/probe/$actor"; admin b DELETE /actors/probe/$actor
done
echo "== b's cluster status"; counters
kill -TERM $A $B; sleep 2
su postgres -s /bin/sh -c "$PGB/pg_ctl -D $D/pg/data stop -m fast" >/dev/null
rm -rf $D
