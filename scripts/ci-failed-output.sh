#!/usr/bin/env bash
# ci-failed-output.sh BUILD_DIR [LINES]: the last LINES (default 150) lines of what each test that
# failed in BUILD_DIR's latest ctest run printed, read from ctest's own log. CI prints this just
# above its summary, where a failure's output would otherwise be buried under the later steps' logs.
set -uo pipefail
build=${1:?usage: ci-failed-output.sh BUILD_DIR [LINES]}
lines=${2:-150}
failed="$build/Testing/Temporary/LastTestsFailed.log"
log="$build/Testing/Temporary/LastTest.log"
[[ -s $failed && -f $log ]] || exit 0
# LastTestsFailed.log: "NUMBER:NAME" per failed test.
while IFS=: read -r _ name; do
  [[ -n $name ]] || continue
  echo
  echo "==== ci: output of failed test $name (last $lines lines) ===="
  # A test's block in LastTest.log runs from "N/M Testing: NAME" to '"NAME" end time:'.
  awk -v name="$name" '
    $0 ~ ("^[0-9]+/[0-9]+ Testing: ") && substr($0, index($0, "Testing: ") + 9) == name { on = 1 }
    on { print }
    on && index($0, "\"" name "\" end time:") == 1 { on = 0 }
  ' "$log" | tail -n "$lines"
done < "$failed"
