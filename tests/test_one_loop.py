"""One loop, taught once (issue 49): the exactly-once loop is
``labkit.pipelines.production_loop.fee_service``; notebook 05 shows it whole in section 7,
line for line; its section 6 is the named step before it (only ``rewind``, the exercise
between them, differs); the capstone's solution is the same loop under the service's name,
and the capstone points the learner at 05's section 7. A lesson that drifts from the
reference fails here, with the diff.

That copying section 7 into the capstone gets "Well done" is the solved capstone's run
(test_exercise_solutions): its solution is this same text."""
from __future__ import annotations

import ast
import difflib
import inspect

from labkit.pipelines import learner, production_loop
from tests.notebook_cells import as_cell, read
from tests.solution_code import solution_code

HEADING = "## 7. The production loop"


def reference_code() -> str:
    """The module's code, its docstring left out: what a lesson shows."""
    source = inspect.getsource(production_loop)
    tree = ast.parse(source)
    first = tree.body[1]  # after the docstring
    return "".join(source.splitlines(keepends=True)[first.lineno - 1:])


def cell_after(notebook: str, heading: str, offset: int = 1) -> str:
    nb = read(notebook)
    (index,) = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "markdown" and c.source.startswith(heading)]
    return nb.cells[index + offset].source


def differences(old: str, new: str) -> str:
    return "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm=""))


def test_05_shows_the_reference_loop_line_for_line():
    """Under a name of its own: section 1's step is fee_service."""
    shown = cell_after("05_consume_transform_produce", HEADING)
    reference = reference_code().replace("def fee_service(", "def production_fee_service(", 1)
    assert shown.strip() == reference.strip(), differences(reference, shown)


def test_05_section_6_is_the_step_before_it_only_rewind_differs():
    """Section 6's loop is the reference with the one-partition rewind (the exercise between
    them makes it general) and without OFFSET_BEGINNING, which only that rewind uses."""
    nb = read("05_consume_transform_produce")
    (general,) = [c.source for c in nb.cells if c.cell_type == "code"
                  and "def general_fee_service(" in c.source]
    step = as_cell(general, "general_fee_service")
    step_rewind = ast.get_source_segment(general, _def(general, "rewind"))
    reference = reference_code()
    expected = reference.replace(ast.get_source_segment(reference, _def(reference, "rewind")),
                                 step_rewind)
    expected = expected.replace("(OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, "
                                "Producer,\n                             TopicPartition)",
                                "Consumer, KafkaError, KafkaException, Producer, TopicPartition")
    expected = expected.replace("def fee_service(", "def general_fee_service(", 1)
    assert general.strip() == expected.strip(), differences(expected, general)
    assert "batch[0]" in step_rewind  # the shortcut the exercise takes away
    assert learner.crash_points_in(step) == learner.crash_points_in(production_loop.fee_service)


def _def(code: str, name: str) -> ast.FunctionDef:
    (found,) = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)
                and n.name == name]
    return found


def test_the_capstones_solution_is_the_reference_under_the_services_name():
    solution = solution_code("10_capstone")
    service = as_cell(solution, "ledger_service")
    assert ast.dump(_def(solution, "ledger_service").args) == \
        ast.dump(_def(reference_code(), "fee_service").args)
    body = ast.parse(solution).body
    reference = ast.parse(reference_code()).body
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == "ledger_service":
            node.name = "fee_service"
    code_only = [n for n in body if not (isinstance(n, ast.Assign)
                                         and n.targets[0].id == "accounting_reads")]
    assert [ast.dump(n) for n in code_only] == [ast.dump(n) for n in reference], \
        learner.diff(production_loop.fee_service, service, cell=True)


def test_the_capstone_points_at_that_section():
    nb = read("10_capstone")
    pointers = [c.source for c in nb.cells if c.cell_type == "markdown" and "Notebook 05" in c.source]
    assert any("section 7" in text for text in pointers), pointers


def test_05b_runs_06s_copy_fees_line_for_line():
    """The coordinator's failover and the zombies put the same loop under their faults:
    05's error rule, produce() inside the try (issue 49: 05b's was a loop of its own)."""
    def copy_fees_cell(notebook: str) -> str:
        (cell,) = [c.source for c in read(notebook).cells
                   if c.cell_type == "code" and "def copy_fees(" in c.source]
        return cell

    zombies, failover = copy_fees_cell("06_zombies"), copy_fees_cell("05b_when_the_coordinator_fails")
    assert failover == zombies, differences(zombies, failover)
    assert "if exc.args[0].fatal():" in zombies and "KafkaError._FATAL" in zombies


def _rule_breaks(function: ast.FunctionDef) -> list[str]:
    """How a transactional loop's def departs from the production loop's error rule."""
    tries = [t for t in ast.walk(function) if isinstance(t, ast.Try) and any(
        isinstance(n, ast.Attribute) and n.attr == "send_offsets_to_transaction"
        for n in ast.walk(ast.Module(body=t.body, type_ignores=[])))]
    if not tries:
        return ["send_offsets_to_transaction() outside a try"]
    (loop_try,) = tries[:1]
    inside = ast.Module(body=loop_try.body, type_ignores=[])
    breaks = []
    if not any(isinstance(n, ast.Attribute) and n.attr == "produce" for n in ast.walk(inside)):
        breaks.append("produce() outside the try")
    handlers = ast.Module(body=[s for h in loop_try.handlers for s in h.body], type_ignores=[])
    if not any(isinstance(n, ast.If) and "fatal()" in ast.unparse(n.test)
               and any(isinstance(s, ast.Raise) for s in n.body) for n in ast.walk(handlers)):
        breaks.append("no `if ...fatal(): raise` in its except")
    if "KafkaError._FATAL" not in ast.unparse(function):
        breaks.append("a consumer's _FATAL event not raised")
    return breaks


def test_every_transactional_loop_on_screen_follows_the_one_rule():
    """Every def in a notebook or a solution that sends offsets to a transaction keeps 05's
    error rule: produce() to commit inside the try, fatal() raises, a consumer's _FATAL event
    raises (06 section 7 shows why both tests are needed)."""
    import glob
    import re
    from pathlib import Path
    from tests.solution_code import SOLUTIONS
    cells = [(f"{Path(p).stem}[{i}]", c.source) for p in sorted(glob.glob("notebooks/*.ipynb"))
             for i, c in enumerate(read(Path(p).stem).cells) if c.cell_type == "code"]
    cells += [(f"solutions/{p.name}", code) for p in sorted(SOLUTIONS.glob("*.md"))
              for code in re.findall(r"```python\n(.*?)```", p.read_text(), re.S)]
    found, broken = 0, []
    left_out = {"count_on_disk"}  # 07's exercise: its text says the error handling is left out
    for where, source in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            if "send_offsets_to_transaction" not in ast.unparse(function):
                continue
            found += 1
            breaks = _rule_breaks(function)
            if function.name in left_out:  # still: a consumer's _FATAL event raises
                breaks = [b for b in breaks if "_FATAL" in b]
            broken += [f"{where} {function.name}: {b}" for b in breaks]
    assert found >= 6, found
    assert broken == [], "\n".join(broken)


def test_08d_screens_in_the_reference_loop_and_changes_nothing_else():
    """08d's Kafka replay runs the production loop with the threshold screening added: the
    lookup as each batch is taken, the payments above it held back, the others tagged. Any
    other line that drifts from the reference fails here."""
    (shown,) = [c.source for c in read("08d_spark_replay_that_computes_something_else").cells
                if c.cell_type == "code" and "def review_service(" in c.source]
    expected = reference_code()
    for old, new in {
        "from labkit.pipelines.ctp import transform  # the card fee: 2.9 % + 30 cents\n":
        "from labkit.pipelines.ctp import transform  # the card fee: 2.9 % + 30 cents\n"
        "from labkit.pipelines.lookup import current_threshold\n",
        "def fee_service(\n        bootstrap, input_topic, output_topic, group_id, "
        "transactional_id, instance_id,\n        group_protocol=\"classic\"):":
        "def review_service(\n        bootstrap, input_topic, output_topic, group_id, "
        "transactional_id, instance_id,\n        threshold_table, group_protocol=\"classic\"):",
        "        producer.begin_transaction()\n":
        "        version, cents = current_threshold(threshold_table)  # now, e.g. (\"v1\", 50000)\n"
        "        producer.begin_transaction()\n",
        "                producer.produce(output_topic, key=msg.key(), value=json.dumps(payment))\n":
        "                if payment[\"amount_cents\"] <= cents:  # above it: held back for review\n"
        "                    producer.produce(output_topic, key=msg.key(), value=json.dumps(\n"
        "                        {**payment, \"threshold_version\": version}))\n",
    }.items():
        assert expected.count(old) == 1, old
        expected = expected.replace(old, new)
    assert shown.strip() == expected.strip(), differences(expected, shown)
