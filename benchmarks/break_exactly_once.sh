#!/bin/bash
# Does CI catch a broken exactly-once? Breaks the lab's exactly_once on purpose in a separate
# clone (never in the checkout others run tests in), runs nbval on notebooks 05, 06 and 07,
# then breaks notebook 04's exercise check and runs its solved-notebook test; restores each
# file after its run. Results: docs/measurements-nbval.md.
#
#   bash benchmarks/break_exactly_once.sh [REPO]     (REPO: a checkout with .venv and .cache)
#
# The clone gets its own lab home and its own jar cache (a copy of REPO's jars, stamped with
# the clone's pom): a clone whose pom differs would otherwise re-resolve the jars inside
# REPO's shared cache and pull them from under brokers that other runs are starting.
set -u
REPO=$(cd "${1:-$(dirname "$0")/..}" && pwd)
WORK=${WORK:-/tmp/labkit-break}
PY=$REPO/.venv/bin
rm -rf "$WORK" && mkdir -p "$WORK/cache/jars" "$WORK/logs"
git clone -q "$REPO" "$WORK/repo"
cd "$WORK/repo"
for set in kafka tools; do
  cp -r "$REPO/.cache/jars/$set" "$WORK/cache/jars/"
  cp jvm/pom.xml "$WORK/cache/jars/$set/.resolved"
done
# The clone's labkit, not REPO's (REPO's .venv has REPO installed in editable mode).
export PYTHONPATH=$WORK/repo LABKIT_HOME=$WORK/lab LABKIT_CACHE=$WORK/cache

nbval() {  # notebook, label: print the result line and the failed cells
  "$PY/pytest" "notebooks/$1.ipynb" --nbval --nbval-sanitize-with notebooks/sanitize.cfg \
    -p no:cacheprovider -q -rf > "$WORK/logs/$2_$1.log" 2>&1
  echo "$2 $1: exit $?, $(grep -E '(passed|failed)' "$WORK/logs/$2_$1.log" | tail -1)"
  grep '^FAILED' "$WORK/logs/$2_$1.log" | sed 's/ - .*//'
}

break_file() {  # file, old text, new text (python does the exact replacement)
  python3 - "$@" <<'EOF'
import pathlib, sys
path, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = path.read_text()
assert text.count(old) == 1, f"{path}: the text to break is not there exactly once"
path.write_text(text.replace(old, new))
EOF
}

for nb in 05_consume_transform_produce 06_zombies 07_stateful_exactly_once; do nbval $nb clean; done

# A: ExactlyOnce commits the offsets with the consumer, outside the transaction (the class's
#    source changes, and notebook 05 prints that source).
break_file labkit/pipelines/guarantee.py \
  "        out.send_offsets(consumer, offsets, group_metadata)" \
  "        commit(consumer, offsets)  # BROKEN ON PURPOSE: outside the transaction"
for nb in 05_consume_transform_produce 06_zombies 07_stateful_exactly_once; do nbval $nb A; done
git checkout -q labkit/pipelines/guarantee.py

# B: the same mistake one layer down, in Transactions.send_offsets (ExactlyOnce's source, the
#    one notebook 05 shows, stays as it is).
break_file labkit/pipelines/txn.py \
  '        self._call("send_offsets_to_transaction", self.producer.send_offsets_to_transaction,
                   offsets, group_metadata)' \
  "        consumer.commit(offsets=offsets, asynchronous=False)  # BROKEN ON PURPOSE"
for nb in 05_consume_transform_produce 06_zombies 07_stateful_exactly_once; do nbval $nb B; done
git checkout -q labkit/pipelines/txn.py

# An exercise check that no longer accepts the right answer (04: the high watermark + 1).
break_file labkit/exercises/transactions.py \
  "    if (high_watermark, last_offset) == (hw, last):" \
  "    if (high_watermark, last_offset) == (hw + 1, last):  # BROKEN ON PURPOSE"
"$PY/pytest" tests/test_exercise_solutions.py -p no:cacheprovider -q -rf -k 04_transactions \
  > "$WORK/logs/exercise.log" 2>&1
echo "exercise check broken: exit $?, $(grep -E '(passed|failed)' "$WORK/logs/exercise.log" | tail -1)"
grep '^FAILED' "$WORK/logs/exercise.log" | sed 's/ - .*//'
git checkout -q labkit/exercises/transactions.py

git status --short labkit  # empty: every broken file restored
"$PY/labkit" down >/dev/null 2>&1 || true
echo "logs: $WORK/logs"
