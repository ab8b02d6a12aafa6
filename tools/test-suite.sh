#!/usr/bin/env bash
# make test: the molecule scenarios (pytest tests/test_molecule.py, in lanes) and, beside them at the priority of the
# lanes' background steps, the checks that need no container (make checks: yamllint, ansible-lint, the unit and
# inventory tests). The suite is CPU-bound and its cores are busy until its last lanes wind down: run one after the
# other, the checks added about 3 minutes to it; beside the scenarios they take the cores those leave.
# Their output is kept in .cache/checks.log (tail -f it to follow them) and printed after the scenarios' summary.
# Exit status: 0 when both passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
log=.cache/checks.log
mkdir -p .cache
# A session of its own (an autogroup the kernel schedules as one), lowered as the lanes' background steps are.
setsid bash -c 'echo 10 > /proc/self/autogroup 2>/dev/null; exec nice -n 10 make --no-print-directory checks' \
  > "$log" 2>&1 < /dev/null &
checks=$!
rm -f .cache/scenarios-failed.txt
# Every verify test's CPU (this machine + containers), for a closer look at where the suite's time goes.
export LLAMA_CPU_REPORT="$PWD/.cache/cpu-per-test.txt"
rm -f "$LLAMA_CPU_REPORT"
# Every playbook run of the verify tests (molecule/shared/cluster_helpers.py run_playbook): scenario, wall s, this
# machine's CPU s, the containers' CPU s, exit status, playbook, arguments.
export LLAMA_RUN_REPORT="$PWD/.cache/playbook-runs.txt"
rm -f "$LLAMA_RUN_REPORT"
trap 'kill -TERM -- "-$checks" 2>/dev/null' INT TERM
pytest -v -p no:cacheprovider tests/test_molecule.py
scenarios=$?
wait "$checks"
checked=$?
trap - INT TERM
if [ -s "$LLAMA_RUN_REPORT" ]; then
  echo
  echo "=============== the verify tests' playbook runs (CPU: this machine + containers) ==============="
  awk '{n[$1]++; c[$1] += $3 + $4; t += $3 + $4; r++}
       END {for (s in n) printf "%-10s %4d runs %8.0f cpu-s\n", s, n[s], c[s];
            printf "%-10s %4d runs %8.0f cpu-s\n", "all", r, t}' "$LLAMA_RUN_REPORT"
fi
echo
echo "=============== make checks (beside the scenarios; log: $log) ==============="
cat "$log"
echo
# What failed in the scenarios (tests/conftest.py writes it), again: the last lines of the output are often all
# that is kept of a failed run.
if [ -s .cache/scenarios-failed.txt ]; then
  echo "=============== what failed in the scenarios (repeated from their summary) ==============="
  cat .cache/scenarios-failed.txt
  echo
fi
echo "make test: scenarios $([ "$scenarios" -eq 0 ] && echo passed || echo "FAILED ($scenarios)"), checks" \
     "$([ "$checked" -eq 0 ] && echo passed || echo "FAILED ($checked)")"
[ "$scenarios" -eq 0 ] && [ "$checked" -eq 0 ]
