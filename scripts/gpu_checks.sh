#!/usr/bin/env bash
# GPU checks for a machine lent with a CUDA GPU (made for one H200; runs in <= 8 minutes).
#
#   bash scripts/gpu_checks.sh            # everything under ./gpu_out
#   OUT=/some/dir bash scripts/gpu_checks.sh
#   bash scripts/gpu_checks.sh authors    # env, install, then only the authors' experiment
#
# The argument picks the steps: `all` (default: the steps below but authors) or `authors`
# (env, install, authors; about 5 minutes on one H200, docs/authors.md).
#
# Steps, each under its own `timeout`, each timed; a failed step does not stop the others:
#   env      python, torch, CUDA device, nvidia-smi          (the machine, in words)
#   install  pip install -e . without dependencies and without build isolation (the GPU
#            machine has torch preinstalled and no network); falls back to PYTHONPATH
#   bench            python -m numerics.bench --device cuda         -> bench.json, bench.log
#   pytest-gpu       python -m pytest --device cuda -m gpu        -> pytest.log
#   report           python -m reports.build --profile paper --device cuda
#                                                                 -> report.tar.gz, report.log
#   pytest-thorough  python -m pytest --thorough --device cuda -m "thorough and not gpu"
#                    (with the time left; appended to pytest.log)
#   authors          (mode `authors` only) python -m reports.build --only authors-replica
#                    --profile authors --device cuda: the authors' released experiment at
#                    their sizes (8 runs, 15,000 of their SGD steps), trained and audited
#                    -> authors.tar.gz, authors.log (its time, per run and in total)
# and a summary (summary.txt, summary.json): per step the exit status, seconds, verdict.
# Together the two pytest steps are `pytest --thorough --device cuda -m "thorough or gpu"`,
# split so that the short GPU cases and the report run before the long thorough cases.
#
# Everything is written under $OUT (default ./gpu_out), at most 8 files and no deeper than
# $OUT/report (the device tool returns only that much): the report folder is packed into
# report.tar.gz and removed, unless KEEP_REPORT_DIR=1.
#
# Precision: TF32 is off everywhere (NVIDIA_TF32_OVERRIDE=0 for cuBLAS/cuDNN; the Python
# code also sets fp32_precision = "ieee"), so float32 checks are true float32.
#
# Knobs (environment): OUT, PYTHON (default python3, else python), TOTAL_BUDGET (seconds,
# default 465: every step is cut short so the script ends within it), BENCH_TIMEOUT (100),
# PYTEST_GPU_TIMEOUT (60), REPORT_TIMEOUT (200), PYTEST_TIMEOUT (240, the thorough step),
# PYTEST_ARGS (thorough step; default: --thorough --device cuda -m "thorough and not gpu" -q -rfE),
# BENCH_ARGS (extra flags for numerics.bench), REPORT_ARGS (extra flags for reports.build,
# e.g. "--only block-structure,task-allocation" when the whole paper profile does not fit
# in REPORT_TIMEOUT), AUTHORS_TIMEOUT (330; mode authors: TOTAL_BUDGET defaults to 420),
# AUTHORS_ARGS (extra flags for that reports.build), KEEP_REPORT_DIR, SKIP_INSTALL=1 (use
# PYTHONPATH instead of pip: for trying the script out on a machine you share).
set -u

MODE=${1:-all}
case $MODE in
    all|authors) ;;
    *) echo "usage: bash scripts/gpu_checks.sh [all|authors]   (got '$MODE')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -z "${PYTHON:-}" ]; then
    if command -v python3 >/dev/null 2>&1; then PYTHON=python3; else PYTHON=python; fi
fi
if [ "$MODE" = authors ]; then TOTAL_BUDGET=${TOTAL_BUDGET:-420}; else TOTAL_BUDGET=${TOTAL_BUDGET:-465}; fi
AUTHORS_TIMEOUT=${AUTHORS_TIMEOUT:-330}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-100}
PYTEST_GPU_TIMEOUT=${PYTEST_GPU_TIMEOUT:-60}
REPORT_TIMEOUT=${REPORT_TIMEOUT:-200}
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-240}
export NVIDIA_TF32_OVERRIDE=0
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
START=$(date +%s)
STEPS=()

# run_step NAME TIMEOUT LOG CMD...: run CMD under `timeout`, never past TOTAL_BUDGET.
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local now left t0 rc ms secs verdict
    now=$(date +%s)
    left=$((TOTAL_BUDGET - (now - START)))
    if [ "$left" -lt 15 ]; then
        STEPS+=("$name|-|0|skipped: no time left in the ${TOTAL_BUDGET}s budget")
        echo "== $name: skipped, ${left}s left of the budget" | tee -a "$log"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit}s): $*" | tee -a "$log"
    local first
    first=$(($(wc -l <"$log") + 1))
    t0=$(date +%s%N)
    timeout --signal=TERM --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    secs="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    case $rc in
        0) verdict=ok ;;
        124|137) verdict="TIMED OUT after ${limit}s" ;;
        *) verdict="FAILED (exit $rc)" ;;
    esac
    STEPS+=("$name|$rc|$secs|$verdict")
    tail -n +"$first" "$log" | tail -n 25
    echo "== $name: $verdict in ${secs}s" | tee -a "$log"
    return 0
}

# --- env -------------------------------------------------------------------------------
ENVLOG=$OUT/env.txt
: >"$ENVLOG"
{
    echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -a)"; echo "python: $(command -v "$PYTHON")"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 || true
} >>"$ENVLOG"
run_step env 30 "$ENVLOG" "$PYTHON" -c "
import sys, torch
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)
assert torch.cuda.is_available(), 'torch sees no CUDA device'
print('device', torch.cuda.get_device_name(0), 'count', torch.cuda.device_count())"
if ! "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    echo "torch is not importable with $PYTHON: nothing can run (set PYTHON=...)" | tee -a "$ENVLOG"
fi

# --- install (no torch from the network: it is preinstalled; no build isolation: offline) --
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    run_step install 60 "$ENVLOG" "$PYTHON" -m pip install --no-deps --no-build-isolation -e "$ROOT"
fi
if ! (cd /tmp && "$PYTHON" -c 'import numerics, claims, numerics.sweep' >/dev/null 2>&1); then
    echo "package not importable after install: using PYTHONPATH=$ROOT" | tee -a "$ENVLOG"
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi

# --- the authors' experiment (mode authors): only where the env step found a CUDA device;
# without one the profile would run its reduced CPU version, which is not what this step is for --
authors_step() {
    local env_ok=1 s
    for s in ${STEPS[@]+"${STEPS[@]}"}; do case $s in "env|"*"|ok") env_ok=0 ;; esac; done
    if [ "$env_ok" != 0 ]; then
        STEPS+=("authors|-|0|skipped: no CUDA device (the env step failed; see env.txt)")
        echo "== authors: skipped, no CUDA device" | tee -a "$OUT/authors.log"
        return 0
    fi
    rm -rf "$OUT/authors" "$OUT/authors.tar.gz"
    # shellcheck disable=SC2086  # AUTHORS_ARGS is a list of flags
    run_step authors "$AUTHORS_TIMEOUT" "$OUT/authors.log" \
        "$PYTHON" -m reports.build --only authors-replica --profile authors --device cuda --no-progress \
        --out "$OUT/authors" ${AUTHORS_ARGS:-}
    # its time: the claim's, each run's training (their steps, our t) and the verdict, from claims.json
    "$PYTHON" - "$OUT/authors/claims.json" <<'PY' 2>&1 | tee -a "$OUT/authors.log" || true
import json, sys
c = next(c for c in json.load(open(sys.argv[1]))["claims"] if c["id"] == "authors-replica")
d = c["details"]
print(f"authors-replica: {c['verdict']} in {c['seconds']:.1f} s on {d.get('device')}; {d['steps']} of their steps"
      + (f"; NOTE {d['note']}" if d.get("note") else ""))
for r in d["runs"]:
    m = r.get("model", {}).get("held_out_loss", {})
    print(f"  {r['label']:28s} t = {r['t_end']:.4g}  train {r['train_seconds']:.1f} s ({r['batched_runs']} run(s) a "
          f"program)  held-out loss {m.get('mean', float('nan')):.4g} +- {m.get('se', float('nan')):.2g}"
          + (f"  ERROR {r['error']}" if r.get("error") else ""))
PY
    if [ -d "$OUT/authors" ] && tar -czf "$OUT/authors.tar.gz" -C "$OUT" authors; then
        [ "${KEEP_REPORT_DIR:-0}" = 1 ] || rm -rf "$OUT/authors"
    fi
}

if [ "$MODE" = authors ]; then
    authors_step
else
# --- bench -----------------------------------------------------------------------------
rm -f "$OUT/bench.json"     # the summary reads it: never a stale one
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
run_step bench "$BENCH_TIMEOUT" "$OUT/bench.log" \
    "$PYTHON" -m numerics.bench --device cuda --no-progress --out "$OUT/bench.json" ${BENCH_ARGS:-}

# --- the GPU test cases (short), then the paper-profile report, then the thorough tests
# with whatever time is left (the report matters more than the thorough CPU-scale cases) --
PLIMIT=()
# a per-test limit where pytest-timeout is installed, so one stuck test cannot eat the rest
if "$PYTHON" -c 'import pytest_timeout' >/dev/null 2>&1; then PLIMIT=(--timeout=90); fi
run_step pytest-gpu "$PYTEST_GPU_TIMEOUT" "$OUT/pytest.log" \
    "$PYTHON" -m pytest -p no:cacheprovider --device cuda -m gpu -q -rfEs ${PLIMIT[@]+"${PLIMIT[@]}"}

# shellcheck disable=SC2086  # REPORT_ARGS is a list of flags (e.g. --only ID,ID)
run_step report "$REPORT_TIMEOUT" "$OUT/report.log" \
    "$PYTHON" -m reports.build --profile paper --device cuda --no-progress --out "$OUT/report" \
    ${REPORT_ARGS:-}
if [ -d "$OUT/report" ] && tar -czf "$OUT/report.tar.gz" -C "$OUT" report; then
    [ "${KEEP_REPORT_DIR:-0}" = 1 ] || rm -rf "$OUT/report"
fi

if [ -n "${PYTEST_ARGS:-}" ]; then
    # shellcheck disable=SC2206
    PARGS=($PYTEST_ARGS)
else
    PARGS=(--thorough --device cuda -m "thorough and not gpu" -q -rfE)
fi
run_step pytest-thorough "$PYTEST_TIMEOUT" "$OUT/pytest.log" \
    "$PYTHON" -m pytest -p no:cacheprovider "${PARGS[@]}" ${PLIMIT[@]+"${PLIMIT[@]}"}

fi

# --- summary ---------------------------------------------------------------------------
TOTAL=$(($(date +%s) - START))
{
    echo "gpu_checks.sh summary ($(date -u +%FT%TZ)), total ${TOTAL}s of a ${TOTAL_BUDGET}s budget"
    printf '%-16s %-6s %-10s %s\n' step exit seconds verdict
    for s in ${STEPS[@]+"${STEPS[@]}"}; do
        IFS='|' read -r n rc secs v <<<"$s"
        printf '%-16s %-6s %-10s %s\n' "$n" "$rc" "$secs" "$v"
    done
    # the bench contract's ratios from bench.json, one line each (nothing if the bench wrote none)
    "$PYTHON" - "$OUT/bench.json" <<'PY' 2>/dev/null || true
import json, sys
d = json.load(open(sys.argv[1]))
print("bench (" + d["meta"]["device"] + ", " + str(d["meta"].get("gpu", "")) + "): median ratios, target met?")
for k in ("ratio_full_step", "ratio_model_step", "ratio_reduced_flow", "ratio_expansion_flow"):
    if k in d:
        print(f"  {k:21s}" + "   ".join(f"{dt} {v:.1f}x ({'met' if d['targets_met'][k][dt] else 'NOT met'})"
                                        for dt, v in d[k].items()))
for k in ("sampling_ms", "model_ms"):
    if k in d:
        print(f"  {k:21s}" + "   ".join(f"{dt} {v:.2f}" for dt, v in d[k].items()))
PY
} | tee "$OUT/summary.txt"
"$PYTHON" - "$OUT/summary.json" "$TOTAL" ${STEPS[@]+"${STEPS[@]}"} <<'EOF' || true
import json, sys
path, total, *steps = sys.argv[1:]
rows = []
for s in steps:
    name, rc, secs, verdict = s.split("|", 3)
    rows.append({"step": name, "exit": None if rc == "-" else int(rc),
                 "seconds": float(secs) if secs.replace(".", "", 1).isdigit() else None,
                 "verdict": verdict})
json.dump({"total_seconds": int(total), "steps": rows}, open(path, "w"), indent=1)
EOF
ls -la "$OUT"
# exit status: 0 only if every step passed
for s in ${STEPS[@]+"${STEPS[@]}"}; do
    case $s in *"|ok") ;; *) exit 1 ;; esac
done
exit 0
