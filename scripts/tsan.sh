#!/usr/bin/env bash
# ThreadSanitizer over pydist's C code, run once by hand (issue 45), not by make test: the thread stress
# (tests/threads_stress.py, 8 threads on 4 groups, every path, --slots both --timeline) at 2 and 3 ranks,
# and the world-size-1 thread tests (tests/unit/test_threads.py, test_gil.py), against a build with
# PYDIST_TSAN=1 in build/tsan (the working tree's pydist/ is left alone). About 7 minutes on 2 cores.
#
#   scripts/tsan.sh                       CALLS=2000 RANKS="2 3" by default
#   CALLS=20000 RANKS=2 scripts/tsan.sh   a longer soak
#
# Only pydist._C is instrumented; Python, MPICH, NumPy and OpenBLAS are not, so libtsan is preloaded. TSan
# still sees their pthread mutexes and condition variables (intercepted), so a GIL handoff orders what
# the two threads did before and after it, and MPICH's own locks likewise; it sees their memcpy/memset
# too, but none of their other loads and stores: a race between pydist's code and MPI writing a request
# or buffer inside libmpich shows only pydist's side, and is not reported. Memory another process writes
# (the shared-memory segments) is invisible to it, and never a thread race. The first step below checks
# the set-up itself: a plain C counter bumped by 4 threads is a race when ctypes releases the GIL around
# it, and none when the GIL is held.
#
# Reading the output: each process writes its reports to build/tsan-logs/<what>.rank<R>.<pid> (files
# exist only where there were reports). The summary groups them by the pair of top pydist frames
# (csrc/...) of the two accesses; a report with a pydist frame is ours to triage (and fails the
# script), one with none lies in the libraries (listed, not failing). No suppressions are used: these
# runs gave no report at all from the uninstrumented libraries. The build prints one expected warning
# (-Wtsan: TSan does not model csrc/observe/stall.c's atomic_thread_fence, the stall board's seqlock
# read, which only a call stalled past PYDIST_STALL_WARN reaches).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CALLS=${CALLS:-2000}
RANKS=${RANKS:-2 3}
LOGS=$PWD/build/tsan-logs
TSAN_LIB=$(gcc -print-file-name=libtsan.so)
# libucm (UCX's memory hooks, loaded with MPICH's ch4:ucx) patches madvise, which glibc calls as each
# thread exits, after TSan has torn down that thread's state: every exiting thread then dies of SIGSEGV
# in TSan's rwlock interceptor. Without the mmap hooks UCX gives up only its registration cache.
export UCX_MEM_MMAP_HOOK_MODE=none
# exitcode=0: a process with reports exits as it would have (TSan's default is 66), and the summary
# below decides; history_size=7: the earlier access's stack is kept to be printed, not "failed to restore"
export TSAN_BASE="exitcode=0 history_size=7"
rm -rf build/tsan "$LOGS" && mkdir -p build/tsan/pydist "$LOGS"
cp pydist/*.py build/tsan/pydist/
start=$SECONDS
PYDIST_TSAN=1 $PY setup.py -q build_ext --build-lib build/tsan --build-temp build/tsan-tmp 2>&1 | { grep -iE "warning|error" || true; }
echo "tsan: built in $((SECONDS - start)) s"

# run WHAT CMD...: CMD with libtsan preloaded, its reports to $LOGS/WHAT.rank<R>.<pid>
run() {
  local what=$1; shift
  TSAN_OPTIONS="$TSAN_BASE log_path=$LOGS/$what.rank${PMI_RANK:-0}" LD_PRELOAD=$TSAN_LIB PYTHONPATH=$PWD/build/tsan "$@"
}
export -f run
export LOGS TSAN_LIB

# The set-up sees a race where there is one, and the GIL as synchronisation.
probe=build/tsan-probe && mkdir -p $probe
echo 'static volatile long counter; void bump(long n) { for (long i = 0; i < n; i++) counter++; }' > $probe/probe.c
gcc -shared -fPIC -fsanitize=thread -g -O1 $probe/probe.c -o $probe/probe.so
cat > $probe/probe.py <<'EOF'
import ctypes, sys, threading
lib = (ctypes.PyDLL if sys.argv[2] == "gil" else ctypes.CDLL)(sys.argv[1])   # PyDLL keeps the GIL
threads = [threading.Thread(target=lambda: [lib.bump(300000) for _ in range(5)]) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
EOF
for mode in gil nogil; do
  run probe-$mode $PY -P $probe/probe.py $PWD/$probe/probe.so $mode
done
if ls "$LOGS"/probe-gil.* >/dev/null 2>&1 || ! ls "$LOGS"/probe-nogil.* >/dev/null 2>&1; then
  echo "tsan: the probe's race was not seen (or the GIL was not seen as synchronisation): no finding below would mean anything"
  exit 1
fi
rm -f "$LOGS"/probe-*
echo "tsan: the set-up sees a race without the GIL, and none with it"

run check $PY -P -c "import pydist._C as c; assert '/build/tsan/' in c.__file__, c.__file__"
for n in $RANKS; do
  t=$SECONDS
  mpiexec.mpich -n "$n" bash -c 'run "$@"' _ stress-n$n $PY -P tests/threads_stress.py --calls "$CALLS" --slots both --timeline
  echo "tsan: the stress at $n ranks, $CALLS calls, slots on and off: passed in $((SECONDS - t)) s"
done
t=$SECONDS
run unit $PY -P -m pytest -q -p no:cacheprovider tests/unit/test_threads.py tests/unit/test_gil.py
echo "tsan: the world-size-1 thread tests in $((SECONDS - t)) s; $((SECONDS - start)) s in all"

$PY - "$LOGS" <<'EOF'
"""The reports, one line per distinct pair of top pydist frames (csrc/...) of the two accesses."""
import collections, glob, os, re, sys

def top(stack):
    """A stack's first frame in pydist's code, else its first frame marked as the libraries'."""
    frames = re.findall(r"^\s+#\d+ (\S+) (\S+)", stack, re.M)
    ours = [f"{fn} {where.split('csrc/', 1)[1]}" for fn, where in frames if "csrc/" in where]
    return (ours[0], True) if ours else (f"{frames[0][0]} (not pydist's)" if frames else "(no stack)", False)

logs = sorted(glob.glob(os.path.join(sys.argv[1], "*")))
distinct, total = collections.OrderedDict(), 0
for path in logs:
    for report in re.findall(r"WARNING: ThreadSanitizer: (.*?)\n(.*?)\nSUMMARY", open(path).read(), re.S):
        kind, body = report[0].split(" (pid=")[0], report[1]
        total += 1
        # the accesses' stacks: the paragraphs before "Location is", "Mutex", "Thread T..."
        accesses = [p for p in body.split("\n\n") if re.match(r"\s+(Previous |Atomic )?(read|write|Read|Write)", p)]
        frames = [top(p) for p in accesses[:2]] or [top(body)]
        key = (kind, " <-> ".join(sorted(f for f, _ in frames)), any(o for _, o in frames))
        distinct.setdefault(key, [0, path])[0] += 1
print(f"tsan: {total} reports in {len(logs)} logs, {len(distinct)} distinct")
for (kind, pair, ours), (count, path) in distinct.items():
    print(f"  {count:5d}  {'ours' if ours else 'libs'}  {kind}: {pair}   (e.g. {os.path.relpath(path)})")
sys.exit(1 if any(ours for _, _, ours in distinct) else 0)
EOF
