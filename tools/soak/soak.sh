#!/usr/bin/env bash
# The whole soak, offline: dry run -> normal load -> scoreboard -> faults -> scoreboard.
#
#   bash tools/soak/soak.sh
#
# Every setting is an environment variable (defaults fit the built-in policy server and finish
# in well under two minutes on two cores):
#
#   SOAK_BUDGET_CALLS        model-call budget of the normal load         (default 3000)
#   SOAK_FAULT_BUDGET_CALLS  model-call budget of the fault batch         (default 400)
#   SOAK_CONCURRENCY         tasks running at once                        (default 4)
#   SOAK_LIMIT               tasks per scenario                           (default 40)
#   SOAK_SCENARIO            code | review | both  (default: both if the review scenario exists)
#   SOAK_WORKERS             code-scenario worker processes               (default: concurrency)
#   SOAK_SEED                seed of tasks, personas and the policy server (default 7)
#   SOAK_OUT                 artifact root                 (default soak-out/<YYYYmmdd-HHMMSS>)
#   SOAK_LOG_DIR             if set, each step's output goes to $SOAK_LOG_DIR/<step>.log
#   SOAK_SKIP_FAULTS         if non-empty, skip steps 04 and 05
#   SOAK_PYTHON              interpreter                                  (default .venv/bin/python)
#   SOAK_RAY_LIMIT           tasks per scenario of the Ray batch (step 06) (default 10)
#   SOAK_SKIP_RAY            if non-empty, skip steps 06 to 09 (the Ray steps)
#   SOAK_CLUSTER_BUDGET_CALLS  model-call budget of the cluster fault class (default 600)
#
# Steps 06-09 need Ray (the ray extra, installed by `make install`): a small batch with
# `run_soak --engine ray` on a throwaway loopback cluster (on a throwaway PostgreSQL server
# when one can be started, `--store postgres`) and its scoreboard, then the fault
# class `cluster` (a node removed and a worker SIGKILLed while runs are in flight) and its
# scoreboard. Without Ray they are skipped with one line saying so. Ray reaches for addresses
# outside the machine on every start (issue 27), so steps 06 and 08 run in a network namespace
# that has only loopback (`unshare -n`, then `ip link set lo up`; tools/netns.py): this one if
# it already is one, else a new one (needs root); where neither is possible they are skipped.
#
# SOAK_BASE_URL / SOAK_MODEL / SOAK_API_KEY (environment or .env) point the normal load at a
# real OpenAI-compatible endpoint instead of the policy server; lower the budgets then. The
# fault batch always uses the policy server (its faults are triggered through it).
#
# The script stops at the first failing step with that step's exit status; the ERR trap names
# the step. A breach in either scoreboard, an undetermined normal-load scoreboard (including a
# check that no run exercised), a breached fault criterion, or an undetermined fault class (one
# that verified nothing, e.g. skipped for budget: exit 3) therefore fails the soak. Only step 05
# accepts undetermined: crashed and cancelled runs lack sidecars by nature. No trailing pipes: a
# pipe would hide exit codes.
set -Eeuo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

STEP="setup"
trap 'rc=$?; echo "!!! step ${STEP} failed (exit code ${rc})" >&2' ERR

PY="${SOAK_PYTHON:-.venv/bin/python}"
BUDGET="${SOAK_BUDGET_CALLS:-3000}"
FAULT_BUDGET="${SOAK_FAULT_BUDGET_CALLS:-400}"
CONCURRENCY="${SOAK_CONCURRENCY:-4}"
LIMIT="${SOAK_LIMIT:-40}"
SEED="${SOAK_SEED:-7}"
WORKERS="${SOAK_WORKERS:-$CONCURRENCY}"
OUT="${SOAK_OUT:-soak-out/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # absolute: the harness's worker processes change directory
if [[ -z "${SOAK_SCENARIO:-}" ]]; then
    if [[ -f tools/soak/scenarios/review.py ]]; then SCENARIO=both; else SCENARIO=code; fi
else
    SCENARIO="$SOAK_SCENARIO"
fi

if [[ ! -x "$PY" ]]; then
    echo "soak.sh: $PY not found; run 'make install' first (or set SOAK_PYTHON)" >&2
    exit 2
fi
mkdir -p "$OUT"
if [[ -n "${SOAK_LOG_DIR:-}" ]]; then mkdir -p "$SOAK_LOG_DIR"; fi

run_step() {
    STEP="$1"
    shift
    echo "=== ${STEP}: $*"
    local began
    began=$(date +%s.%N)
    if [[ -n "${SOAK_LOG_DIR:-}" ]]; then
        env PYTHONUNBUFFERED=1 "$@" >"${SOAK_LOG_DIR}/${STEP}.log" 2>&1
    else
        env PYTHONUNBUFFERED=1 "$@"
    fi
    local ended
    ended=$(date +%s.%N)
    echo "=== ${STEP}: ok ($(awk -v a="$began" -v b="$ended" 'BEGIN { printf "%.1f", b - a }') s)"
}

SCENARIO_ARGS=(--scenario "$SCENARIO" --limit "$LIMIT" --workers "$WORKERS" --seed "$SEED")
LOAD_ARGS=(--budget-calls "$BUDGET" --concurrency "$CONCURRENCY" --runs-dir "$OUT/runs")
# The review scenario's submit_finding completes a run; the code scenario's environment reports
# completion itself. Naming a tool that no run uses is harmless.
COMPLETING=(--completing-tool submit_finding)

run_step 01-dry-run "$PY" -m tools.soak.run_soak "${SCENARIO_ARGS[@]}" "${LOAD_ARGS[@]}" \
    --report "$OUT/dry-run.md" --dry-run
run_step 02-normal-load "$PY" -m tools.soak.run_soak "${SCENARIO_ARGS[@]}" "${LOAD_ARGS[@]}" \
    --report "$OUT/normal-load.md"
run_step 03-scoreboard-normal "$PY" -m tools.soak.scoreboard --runs-dir "$OUT/runs" \
    --report "$OUT/scoreboard-normal.md" --html "$OUT/runs.html" "${COMPLETING[@]}"
if [[ -z "${SOAK_SKIP_FAULTS:-}" ]]; then
    run_step 04-faults "$PY" -m tools.soak.faults --runs-dir "$OUT/fault-runs" \
        --budget-calls "$FAULT_BUDGET" --seed "$SEED"
    run_step 05-scoreboard-faults "$PY" -m tools.soak.scoreboard --runs-dir "$OUT/fault-runs" \
        --report "$OUT/scoreboard-faults.md" --html "$OUT/fault-runs.html" "${COMPLETING[@]}" \
        --allow-undetermined
fi

if [[ -n "${SOAK_SKIP_RAY:-}" ]]; then
    echo "=== 06-09 (Ray) skipped: SOAK_SKIP_RAY is set"
elif ! "$PY" -c "import ray" >/dev/null 2>&1; then
    echo "=== 06-09 (Ray) skipped: Ray is not installed in $PY (pip install -e '.[ray]' or make install)"
elif ! "$PY" -c "from tools.netns import in_loopback_namespace as f; raise SystemExit(not f())" \
        && ! unshare -n true >/dev/null 2>&1; then
    echo "=== 06-09 (Ray) skipped: Ray runs only in a loopback-only network namespace, and 'unshare -n' is not allowed here (run the soak as root, or inside: unshare -n bash -c 'ip link set lo up && bash tools/soak/soak.sh')"
else
    # The Ray steps' prefix: nothing when this is a loopback-only namespace, else a new one.
    IN_LOOPBACK_NS=()
    if ! "$PY" -c "from tools.netns import in_loopback_namespace as f; raise SystemExit(not f())"; then
        # shellcheck disable=SC2016 # "$@" is expanded by the inner bash
        IN_LOOPBACK_NS=(unshare -n bash -c 'ip link set lo up && exec "$@"' loopback-ns)
    fi
    RAY_ARGS=(--scenario "$SCENARIO" --limit "${SOAK_RAY_LIMIT:-10}" --seed "$SEED")
    # The Ray batch's store: a throwaway PostgreSQL server when its binaries and the driver are
    # installed (the logs are copied into ray-runs for the scoreboard), else the JSONL store.
    if "$PY" -c "import psycopg_pool; from tools.pg_cluster import binaries_available as b; raise SystemExit(0 if b() else 1)" >/dev/null 2>&1; then
        RAY_ARGS+=(--store postgres)
    else
        echo "=== 06-ray-load uses the JSONL store: PostgreSQL or its driver is not installed"
    fi
    run_step 06-ray-load "${IN_LOOPBACK_NS[@]}" "$PY" -m tools.soak.run_soak "${RAY_ARGS[@]}" --engine ray \
        --budget-calls "$BUDGET" --concurrency "$CONCURRENCY" --runs-dir "$OUT/ray-runs" \
        --workspace-root "$OUT/ray-workspaces" --report "$OUT/ray-load.md"
    run_step 07-scoreboard-ray "$PY" -m tools.soak.scoreboard --runs-dir "$OUT/ray-runs" \
        --report "$OUT/scoreboard-ray.md" --html "$OUT/ray-runs.html" "${COMPLETING[@]}"
    run_step 08-cluster-faults "${IN_LOOPBACK_NS[@]}" "$PY" -m tools.soak.faults --runs-dir "$OUT/cluster-runs" \
        --workspace-root "$OUT/cluster-workspaces" \
        --budget-calls "${SOAK_CLUSTER_BUDGET_CALLS:-600}" \
        --seed "$SEED" --only cluster
    run_step 09-scoreboard-cluster "$PY" -m tools.soak.scoreboard \
        --runs-dir "$OUT/cluster-runs" --report "$OUT/scoreboard-cluster.md" \
        --html "$OUT/cluster-runs.html" "${COMPLETING[@]}" --allow-undetermined
fi

STEP="done"
echo "all steps passed; artifacts in $OUT:"
ls -1 "$OUT"
