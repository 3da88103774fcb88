"""05c's exercise check: the learner's consumer, killed at two points with a member joining,
judged by the payments table and the counts per account; an unchanged or broken answer is
told what is wrong before (or instead of) a run, a wrong count gets a hint that names the
cause, and the documented solution passes (its run is the solved notebook's, under nbval)."""
from __future__ import annotations

from labkit.exercises.kafka_to_database import check_counted_once
from labkit.pipelines.learner import from_text
from tests.solution_code import SOLVED, UNSOLVED, solution_code

SOLUTION = solution_code("05c_kafka_into_a_database")
# section 5's idempotent write: the row once, the count again on a replay
ROW_AND_COUNT = '''            with db.transaction():  # the row and its count: both, or neither
                new = db.execute("INSERT INTO payments (id, account, amount_cents) "
                                 "VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                                 (p["id"], p["key"], p["amount_cents"])).rowcount
                if new:  # a payment seen before was counted then
                    db.execute('''
COUNTED_AGAIN = '''            db.execute("INSERT INTO payments (id, account, amount_cents) "
                       "VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                       (p["id"], p["key"], p["amount_cents"]))
            if True:
                if True:
                    db.execute('''


def consumer(code: str, name: str = "counted_once"):
    """``code``'s consumer under ``name``, as a notebook cell defines it."""
    code = code.replace("def counted_once(", f"def {name}(")
    return from_text(code, name, f"<test {name} {abs(hash(code))}>")


def test_the_idempotent_write_unchanged_is_refused_without_a_run():
    shown = consumer(SOLUTION.replace(ROW_AND_COUNT, COUNTED_AGAIN), "idempotent_write")
    same = consumer(SOLUTION.replace(ROW_AND_COUNT, COUNTED_AGAIN))
    verdict = check_counted_once(same, shown=shown)
    assert str(verdict).startswith(UNSOLVED) and "still the idempotent write" in str(verdict)


def test_a_consumer_without_its_crash_points_is_refused_without_a_run():
    unkillable = consumer(SOLUTION.replace('crash_point("mid-batch")', "pass"))
    verdict = check_counted_once(unkillable, shown=consumer(SOLUTION, "shown"))
    assert str(verdict).startswith(UNSOLVED) and 'crash_point("mid-batch")' in str(verdict)


def test_a_count_the_replay_adds_to_again_gets_a_hint_not_the_answer(bootstrap, pg_dsn):
    again = consumer(SOLUTION.replace(ROW_AND_COUNT, COUNTED_AGAIN))
    verdict = check_counted_once(again, shown=consumer(SOLUTION, "shown"),
                                 bootstrap=bootstrap)
    text = str(verdict)
    # 10 payments of instance 0's batch and 5 of instance 1's half batch counted twice
    assert text.startswith(UNSOLVED) and "15 too high" in text
    assert "rowcount" not in text and "transaction" not in text  # a hint, not the answer
    assert SOLVED not in text
