#!/usr/bin/env bash
# The sanitizer step of .ci/run (bash tests/sanitize.sh; needs gcc's libasan, libubsan and
# libtsan): csrc/test_kernels.c under ASan + UBSan with leak checks, at -O3 with the baseline
# x86-64 conversions alone (an AVX2 host's load-time dispatch never runs them), its threaded tests
# (adds against GIL-free gathers; parallel.c's workers, decoding a copy's parts) under TSan;
# then the core tests and the fuzzer against the extension rebuilt with ASan + UBSan in a
# scratch copy (libasan preloaded; CPython's exit leaks unchecked), and the threaded tests
# against one rebuilt with TSan (CPython's GIL is a pthread mutex TSan sees; not the fork
# test: TSan does not support threads made after a threaded fork). Any sanitizer report
# fails the step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TESTS=(tests/core/test_core.py tests/core/test_compress.py tests/core/test_module.py tests/core/test_sumtree.py
       tests/core/test_parallel.py
       tests/hardening/test_misuse.py tests/hardening/test_fuzz.py tests/replay/test_model_fuzz.py tests/replay/test_buffer.py
       tests/replay/test_sampler.py tests/replay/test_serve.py)
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
REPORT='ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer'

command -v gcc >/dev/null || { echo "sanitize.sh: needs gcc (and libasan, libubsan)" >&2; exit 1; }
LIBASAN="$(gcc -print-file-name=libasan.so)"
[[ "$LIBASAN" = /* ]] || { echo "sanitize.sh: gcc has no libasan.so" >&2; exit 1; }
BLOSC2="$(python -c 'import blosc2, os; print(os.path.dirname(blosc2.__file__))')"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/lazyframes-asan.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
copy() {  # the checkout, without what a build makes, into the new folder $1
    mkdir "$1" && tar -C "$ROOT" -cf - --exclude=.git --exclude=build --exclude='*.egg-info' \
        --exclude=__pycache__ --exclude='.*_cache' --exclude=.hypothesis --exclude='*.so' \
        --exclude=csrc/_core.c . | tar -C "$1" -xf -
}

echo "-- csrc/test_kernels.c"
gcc -std=c11 -O1 -Wall -Wextra $FLAGS -I"$ROOT/csrc" -I"$BLOSC2/include" \
    "$ROOT"/csrc/{test_kernels,kernels,pool,codec,sumtree,parallel,handoff}.c "$BLOSC2/lib/libblosc2.a" \
    -o "$SCRATCH/test_kernels" -lpthread -ldl -lm
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$SCRATCH/test_kernels" \
    > "$SCRATCH/kernels.log" 2>&1 || { cat "$SCRATCH/kernels.log"; exit 1; }
tail -n 1 "$SCRATCH/kernels.log"
if grep -Eq "$REPORT|FAIL" "$SCRATCH/kernels.log"; then cat "$SCRATCH/kernels.log"; exit 1; fi

echo "-- csrc/test_kernels.c at -O3, the baseline x86-64 conversions alone (LF_NO_CLONES)"
gcc -std=c11 -O3 -DLF_NO_CLONES -Wall -Wextra -I"$ROOT/csrc" -I"$BLOSC2/include" \
    "$ROOT"/csrc/{test_kernels,kernels,pool,codec,sumtree,parallel,handoff}.c "$BLOSC2/lib/libblosc2.a" \
    -o "$SCRATCH/test_baseline" -lpthread -ldl -lm
"$SCRATCH/test_baseline" > "$SCRATCH/baseline.log" 2>&1 || { cat "$SCRATCH/baseline.log"; exit 1; }
tail -n 1 "$SCRATCH/baseline.log"
if grep -q FAIL "$SCRATCH/baseline.log"; then cat "$SCRATCH/baseline.log"; exit 1; fi

echo "-- csrc/test_kernels.c threads, under ThreadSanitizer"
gcc -std=c11 -O1 -Wall -Wextra -fsanitize=thread -fno-omit-frame-pointer -g -I"$ROOT/csrc" \
    -I"$BLOSC2/include" "$ROOT"/csrc/{test_kernels,kernels,pool,codec,sumtree,parallel,handoff}.c \
    "$BLOSC2/lib/libblosc2.a" -o "$SCRATCH/test_threads" -lpthread -ldl -lm
TSAN_OPTIONS=halt_on_error=1 "$SCRATCH/test_threads" threads > "$SCRATCH/threads.log" 2>&1 \
    || { cat "$SCRATCH/threads.log"; exit 1; }
tail -n 1 "$SCRATCH/threads.log"
if grep -Eq 'WARNING: ThreadSanitizer|FAIL' "$SCRATCH/threads.log"; then cat "$SCRATCH/threads.log"; exit 1; fi

echo "-- the extension, built with the sanitizers in $SCRATCH/src"
copy "$SCRATCH/src"
cd "$SCRATCH/src"
LAZYFRAMES_OPT=-O1 CFLAGS="$FLAGS" LDFLAGS="-fsanitize=address,undefined" \
    python setup.py -q build_ext --inplace > "$SCRATCH/build.log" 2>&1 \
    || { cat "$SCRATCH/build.log"; exit 1; }
export LD_PRELOAD="$LIBASAN" PYTHONDONTWRITEBYTECODE=1
# handle_segv=0: a segfault stays a signal, as the tests that provoke one expect
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:handle_segv=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
SO="$(python -c 'import lazyframes._core as c; print(c.__file__)' | tail -n 1)"
[[ "$SO" = "$SCRATCH/src/"* ]] || { echo "sanitize.sh: the tests would import $SO" >&2; exit 1; }
grep -q __asan_init "$SO" || { echo "sanitize.sh: $SO is not instrumented" >&2; exit 1; }

echo "-- ${TESTS[*]} against it"
status=0
python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal "${TESTS[@]}" 2>&1 | tee "$SCRATCH/tests.log" || status=$?
if grep -Eq "$REPORT" "$SCRATCH/tests.log"; then echo "sanitize.sh: a sanitizer report" >&2; exit 1; fi
unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS

echo "-- the extension, built with ThreadSanitizer in $SCRATCH/tsan"
LIBTSAN="$(gcc -print-file-name=libtsan.so)"
[[ "$LIBTSAN" = /* ]] || { echo "sanitize.sh: gcc has no libtsan.so" >&2; exit 1; }
# the interpreter itself: a launcher script (pyenv's shim) would run under libtsan too
PY="$(python -c 'import sys; print(sys.executable)')"
copy "$SCRATCH/tsan"
cd "$SCRATCH/tsan"
LAZYFRAMES_OPT=-O1 CFLAGS="-fsanitize=thread -fno-omit-frame-pointer -g" \
    LDFLAGS="-fsanitize=thread" "$PY" setup.py -q build_ext --inplace \
    > "$SCRATCH/tsan-build.log" 2>&1 || { cat "$SCRATCH/tsan-build.log"; exit 1; }
grep -q __tsan_init lazyframes/_core*.so \
    || { echo "sanitize.sh: the extension is not instrumented" >&2; exit 1; }
THREADED=(tests/replay/test_sampler.py tests/core/test_compress.py tests/core/test_parallel.py)
# the threaded tests: not fork (TSan does not follow threads made after one), not the import
# tests of the thread setting (subprocesses), and the split copies in one layout ("stack"):
# the layout changes the kernel's geometry, not what the threads share
echo "-- ${THREADED[*]} (threaded tests) against it"
tstatus=0
LD_PRELOAD="$LIBTSAN" TSAN_OPTIONS="log_path=$SCRATCH/tsan-report" PYTHONDONTWRITEBYTECODE=1 \
    "$PY" -m pytest -q -p no:cacheprovider -n 2 --dist worksteal "${THREADED[@]}" \
    -k "(sampler or threads or grows or parallel) and not (fork or environment or last or first)" \
    || tstatus=$?
if compgen -G "$SCRATCH/tsan-report.*" > /dev/null; then
    cat "$SCRATCH"/tsan-report.*
    echo "sanitize.sh: a ThreadSanitizer report" >&2
    exit 1
fi
[[ "$status" = 0 ]] || exit "$status"
exit "$tstatus"
