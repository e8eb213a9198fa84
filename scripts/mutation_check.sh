#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Mutation check: each dev/mutants/*.patch puts one known bug into a temporary copy of the repository and
# runs the fast test files named in the patch's header line ("# tests: test/a.py test/b.py"); every run must
# FAIL. Prints "mutant / killed|SURVIVED" and exits non-zero when a mutant survived, a patch no longer
# applies, or the unmutated copy does not pass the same tests (then a failure would prove nothing). A mutant whose
# tests all skip here (GPU tests without a GPU) is "not-run", which does not fail the check.
#
#   ./scripts/mutation_check.sh                      # every patch, against the working tree (incl. untracked)
#   ./scripts/mutation_check.sh dev/mutants/x.patch  # only some
#   MUTATION_SOURCE=HEAD ./scripts/mutation_check.sh # against the last commit instead
#
# Not part of CI (a few minutes on a 2-core box). The live tree is never modified: the copy lives in mktemp.
# It also runs on a device machine (bench/lib.sh verify_all, for the GPU mutants): there the tree is a plain copy (no
# .git) and there is no venv (its python3 has the packages).
set -u -o pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source_ref="${MUTATION_SOURCE:-worktree}"
per_run_timeout="${MUTATION_TIMEOUT_S:-600}"
if [ "$#" -gt 0 ]; then patches=("$@"); else patches=("$root"/dev/mutants/*.patch); fi

if [ -x "${VLA_VENV:-$root/.venv}/bin/python" ]; then
    # shellcheck disable=SC1091
    . "$root/scripts/env.sh"
fi

copy_tree() {  # $1: empty destination folder
    if [ "$source_ref" = worktree ] && ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # not a git checkout (a device machine's copy): the tree as it is, less what builds and runs leave
        (cd "$root" && tar -c --exclude=./.venv --exclude=./build --exclude=./install --exclude=./log \
            --exclude=./out --exclude=./.device . | tar -x -C "$1")
    elif [ "$source_ref" = worktree ]; then
        # Tracked and untracked-but-not-ignored files, as they are now (deleted tracked files skipped).
        (cd "$root" && git ls-files -z --cached --others --exclude-standard \
            | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh \
            | xargs -0 cp --parents -t "$1")
    else
        git -C "$root" archive "$source_ref" | tar -x -C "$1"
    fi
}

tests_of() { sed -n 's/^# tests: *//p' "$1" | head -n 1; }

apply_patch() {  # $1: patch, in the current folder; git apply where patch(1) is not installed
    if command -v patch >/dev/null; then patch -p1 --forward --batch --silent <"$1" >/dev/null 2>&1
    else git apply "$1" >/dev/null 2>&1; fi
}

run_tests() {  # $1: tree, rest: test files; returns pytest's status (124 on timeout)
    local tree="$1"; shift
    (cd "$tree" && PYTHONPATH="$tree" timeout "$per_run_timeout" \
        python3 -m pytest -x -q -p no:cacheprovider -W ignore::FutureWarning "$@" >"$tree/.mutation.log" 2>&1)
}

work="$(mktemp -d "${TMPDIR:-/tmp}/vla_edge_mutants.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Baseline: the unmutated copy must pass every test file the patches name.
all_tests=()
for p in "${patches[@]}"; do
    for t in $(tests_of "$p"); do
        case " ${all_tests[*]-} " in *" $t "*) ;; *) all_tests+=("$t") ;; esac
    done
done
mkdir "$work/baseline"
copy_tree "$work/baseline"
if ! run_tests "$work/baseline" "${all_tests[@]}"; then
    echo "baseline FAILED: the unmutated copy does not pass ${all_tests[*]}" >&2
    tail -n 30 "$work/baseline/.mutation.log" >&2
    exit 2
fi
echo "baseline: passes ${all_tests[*]}"

status=0
printf '%-34s %-10s %7s  %s\n' mutant result seconds tests
for p in "${patches[@]}"; do
    p="$(realpath "$p")"
    name="$(basename "$p" .patch)"
    tests="$(tests_of "$p")"
    tree="$work/$name"
    mkdir "$tree"
    copy_tree "$tree"
    # patch(1) rather than git apply: it tolerates moved lines and small context changes (fuzz) while the
    # code around a mutant evolves; a hunk it cannot place still fails (NO-APPLY).
    if [ -z "$tests" ] || ! (cd "$tree" && apply_patch "$p"); then
        printf '%-34s %-10s %7s  %s\n' "$name" NO-APPLY - "${tests:-<no '# tests:' header>}"
        status=1
        continue
    fi
    start=$SECONDS
    # shellcheck disable=SC2086
    run_tests "$tree" $tests
    rc=$?
    secs=$((SECONDS - start))
    case "$rc" in
        0) if grep -Eq "[0-9]+ passed" "$tree/.mutation.log"; then result=SURVIVED; status=1
           else result="not-run"; fi ;;  # every named test skipped here (GPU tests on a CPU host): proves nothing
        1) result=killed ;;
        124) result="killed(timeout)" ;;
        *) result="killed(rc=$rc)" ;;  # e.g. a collection error the bug causes
    esac
    printf '%-34s %-10s %7s  %s\n' "$name" "$result" "$secs" "$tests"
    rm -rf "$tree"
done
exit "$status"
