#!/usr/bin/env bash
# The `make run` demo, end to end on one machine:
#   1. the guest image (made with `make image` if missing);
#   2. a small Python repository with a real bug and a failing test, served
#      from a local bare repository (the "remote");
#   3. `warren dev`: a single-voter cluster and a node daemon in one process,
#      with real sandboxes (microVMs when QEMU is here, else containers);
#   4. an agent task on the issue. The model is SCRIPTED (deploy/demo/model.jsonl:
#      recorded turns, no model is called) unless ANTHROPIC_API_KEY or
#      OPENAI_BASE_URL is set, then it is real (WARREN_DEMO_MODEL names it);
#   5. its events streamed here; the node runs the tests, checks the diff,
#      pushes agent/<task-id> to the local remote and records the PR.
# Settings: WARREN_DEMO_API (127.0.0.1:7480), WARREN_DEMO_DRIVER (microvm,
# container or auto), WARREN_DEMO_DEV_ARGS (more `warren dev` flags). To open
# the PR on a forge too, push deploy/demo's files to a repository there
# (main branch, .gitignore from deploy/demo/gitignore) and run with
# WARREN_DEMO_REPO=https://host/owner/calc.git, WARREN_FORGE_TOKEN=... and
# WARREN_DEMO_DEV_ARGS="--forge github|gitea|gitlab --forge-url API-URL".
set -euo pipefail
cd "$(dirname "$0")/.."
W=./bin/warren
API=${WARREN_DEMO_API:-127.0.0.1:7480}
IMAGE_DIR=${WARREN_IMAGE_DIR:-/var/lib/warren/templates}
DATA=$(mktemp -d -t warren-demo.XXXXXX)
export WARREN_SERVER=http://$API
start=$(date +%s)

cleanup() {
	[ -n "${DEV:-}" ] && kill "$DEV" 2>/dev/null && wait "$DEV" 2>/dev/null
	rm -rf "$DATA"
}
trap cleanup EXIT

if curl -fsS "http://$API/healthz" >/dev/null 2>&1 || (exec 3<>"/dev/tcp/${API%:*}/${API#*:}") 2>/dev/null; then
	echo "demo: $API is already in use; set WARREN_DEMO_API=127.0.0.1:PORT" >&2
	exit 1
fi

# The sandbox driver: microVMs when QEMU is here, else containers.
DRIVER=${WARREN_DEMO_DRIVER:-auto}
if [ "$DRIVER" = auto ]; then
	if command -v qemu-system-x86_64 >/dev/null; then
		DRIVER=microvm
	elif [ -S /run/containerd/containerd.sock ]; then
		DRIVER=container
	else
		echo "demo: needs QEMU (apt-get install qemu-system-x86 qemu-utils linux-image-amd64 debootstrap) or a running containerd" >&2
		exit 1
	fi
fi

echo "== 1. the guest image ($IMAGE_DIR)"
# A line with a version, not `default  (broken: ...)`: a broken template
# is rebuilt too.
if ! $W image list --dir "$IMAGE_DIR" 2>/dev/null | grep -Eq '^default +[0-9a-f]{16} '; then
	echo "   missing: building it (make image)"
	WARREN_IMAGE_DIR=$IMAGE_DIR make image
fi
$W image list --dir "$IMAGE_DIR"

echo
echo "== 2. the demo repository: add() drops the sign of its first argument"
SRC=$DATA/src/calc
REMOTE=$DATA/remote/demo/calc.git
mkdir -p "$SRC"
cp deploy/demo/calc.py deploy/demo/test_calc.py deploy/demo/AGENTS.md "$SRC/"
cp deploy/demo/gitignore "$SRC/.gitignore"
git -C "$SRC" init -q -b main
git -C "$SRC" add -A
git -C "$SRC" -c user.name=demo -c user.email=demo@example.com commit -qm "calc: add and sub"
git clone -q --bare "$SRC" "$REMOTE"
if [ -n "${WARREN_DEMO_REPO:-}" ]; then
	REMOTE=$WARREN_DEMO_REPO # the same files, on a forge
fi
echo "   remote: $REMOTE"
echo "   its tests fail:"
(cd "$SRC" && python3 -m unittest -q 2>&1 | sed -n '/^FAIL:/p;/^AssertionError/p;/^FAILED/p' | sed 's/^/     /') || true

echo
echo "== 3. starting warren dev, driver $DRIVER (data in $DATA, log in $DATA/dev.log)"
# shellcheck disable=SC2086 # WARREN_DEMO_DEV_ARGS is a list of flags
$W dev --data "$DATA/dev" --api "$API" --driver "$DRIVER" --image-dir "$IMAGE_DIR" ${WARREN_DEMO_DEV_ARGS:-} >"$DATA/dev.log" 2>&1 &
DEV=$!
for _ in $(seq 1 300); do
	$W cluster status -o json 2>/dev/null | grep -q '"leader_api_url"' && break
	kill -0 "$DEV" 2>/dev/null || { cat "$DATA/dev.log" >&2; exit 1; }
	sleep 0.1
done
for _ in $(seq 1 600); do
	$W nodes list 2>/dev/null | grep -q ' ready ' && break
	kill -0 "$DEV" 2>/dev/null || { cat "$DATA/dev.log" >&2; exit 1; }
	sleep 0.1
done
$W nodes list

echo
if [ -n "${ANTHROPIC_API_KEY:-}" ]; then
	MODEL=(--model "${WARREN_DEMO_MODEL:-claude-sonnet-4-5}")
	echo "== 4. the task: model ${MODEL[1]} (Anthropic, ANTHROPIC_API_KEY is set)"
elif [ -n "${OPENAI_BASE_URL:-}" ]; then
	MODEL=(--model "${WARREN_DEMO_MODEL:-gpt-4o-mini}")
	echo "== 4. the task: model ${MODEL[1]} (OpenAI-compatible server at $OPENAI_BASE_URL)"
else
	MODEL=(--model-script deploy/demo/model.jsonl)
	echo "== 4. the task: SCRIPTED model (deploy/demo/model.jsonl: recorded turns, no model is called)"
fi
ID=$($W task create --repo "$REMOTE" --base main \
	--title "add() returns the wrong sum for negative numbers" \
	--body "calc.add(-1, -2) returns 1; it should return -3. test_calc.py shows it." \
	--test-command "python3 -m unittest -q" --driver "$DRIVER" "${MODEL[@]}" -q)
$W task get "$ID"

echo
echo "== 5. its events (warren task watch $ID)"
# watch exits 1 for a failed task, 2 for a cancelled one: the state is
# checked below, with the node's log.
$W task watch "$ID" || true

echo
STATE=$($W task get "$ID" | awk '$1 == "state" {print $2}')
$W task get "$ID" | sed -n '/^usage/p'
if [ "$STATE" != succeeded ]; then
	echo "== the task ended $STATE" >&2
	tail -20 "$DATA/dev.log" >&2
	exit 1
fi
echo "== the PR record (the task's pull_request event)"
$W task watch "$ID" --after 0 -o json | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    if e.get("kind") == "pull_request":
        p = e["payload"]
        body = p.pop("body", "")
        print(json.dumps(p, indent=2))
        print("--- body ---")
        print(body)
'
if [ -z "${WARREN_DEMO_REPO:-}" ]; then
	echo "== the branch on the remote"
	git -C "$REMOTE" log --format='   %h %an: %s' "main..agent/$ID"
	git -C "$REMOTE" diff --stat "main" "agent/$ID" | sed 's/^/  /'
fi
echo
echo "== done in $(( $(date +%s) - start ))s: task $ID succeeded; branch agent/$ID is on $REMOTE"
