#!/usr/bin/env bash
# The `make run` demo: start `warren dev` (a single-voter cluster and a node
# daemon in one process), create a task, steer it, and print its event
# stream until it ends. The node's sandboxes are SIMULATED (the sim driver)
# and the task runs scripted steps instead of the agent loop: microVMs and
# the agent loop come in later issues.
set -euo pipefail
cd "$(dirname "$0")/.."
W=./bin/warren
API=${WARREN_DEMO_API:-127.0.0.1:7480}
DATA=$(mktemp -d -t warren-demo.XXXXXX)
export WARREN_SERVER=http://$API

cleanup() {
	[ -n "${DEV:-}" ] && kill "$DEV" 2>/dev/null && wait "$DEV" 2>/dev/null
	rm -rf "$DATA"
}
trap cleanup EXIT

if curl -fsS "http://$API/healthz" >/dev/null 2>&1 || (exec 3<>"/dev/tcp/${API%:*}/${API#*:}") 2>/dev/null; then
	echo "demo: $API is already in use; set WARREN_DEMO_API=127.0.0.1:PORT" >&2
	exit 1
fi

echo "== starting warren dev (data in $DATA, log in $DATA/dev.log)"
$W dev --data "$DATA/dev" --api "$API" --node-driver sim >"$DATA/dev.log" 2>&1 &
DEV=$!
for i in $(seq 1 100); do
	$W cluster status -o json 2>/dev/null | grep -q '"leader_api_url"' && break
	kill -0 "$DEV" 2>/dev/null || { cat "$DATA/dev.log" >&2; exit 1; }
	sleep 0.1
done
$W cluster status
for i in $(seq 1 100); do
	$W nodes list 2>/dev/null | grep -q ' ready ' && break
	sleep 0.1
done
echo
$W nodes list

echo
echo "== creating a task: 5 scripted steps on the simulated (sim) driver"
ID=$($W task create --repo https://git.example.com/demo/calc.git --base main \
	--title "add() returns the wrong sum for negative numbers" \
	--body "calc.add(-1, -2) returns 1; it should return -3. Fix it and add a test." \
	--driver sim --script-steps 5 --script-step-millis 300 -q)
$W task get "$ID"

echo
echo "== watching its events (warren task watch $ID)"
$W task watch "$ID" &
WATCH=$!
sleep 0.5
$W task steer "$ID" "The bug is in the sign handling; keep the public API unchanged." >/dev/null
wait "$WATCH"

echo
echo "== done: task $ID is $($W task get "$ID" | awk '$1 == "state" {print $2}')"
