"""Every blocking Kafka call of the lab's code passes a timeout.

confluent-kafka's transactional calls, ``flush`` and ``committed`` wait on the network,
several of them forever by default: one unreachable broker and a lesson or an experiment
hangs with nothing to say why. The rule: no such call in notebooks/, labkit/ or examples/
without a timeout. Static (ast), no broker: the code cells of every notebook (IPython
magics stripped; a ``%%writefile x.py`` cell is the file's code), the python blocks of the
solution pages, every .py file under labkit/ and examples/, and Python source held in a
string of any of them (an app a cell writes to a file and runs).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# method -> the position of its timeout among the positional arguments
TIMEOUT_AT = {
    "send_offsets_to_transaction": 2,  # (offsets, group_metadata, timeout)
    "commit_transaction": 0,
    "abort_transaction": 0,
    "init_transactions": 0,
    "flush": 0,
    "committed": 1,  # (partitions, timeout)
    "list_topics": 1,  # (topic, timeout)
    "get_watermark_offsets": 1,  # (partition, timeout, cached)
    "consume": 1,  # (num_messages, timeout)
}
TIMEOUT_KEYWORDS = {"timeout", "timeout_s"}  # confluent-kafka's, and the lab's wrappers'
# Passed as a function (``self._call("op", producer.commit_transaction, timeout_s)``), a
# method is called with the arguments that follow it. Not ``committed``: a common name for
# data too (``len(self.committed)``).
AS_FUNCTION = set(TIMEOUT_AT) - {"committed"}
# Calls of these names that are not Kafka's: (file, call as written) -> why it is fine.
NOT_KAFKA = {
    ("labkit/spark/runner.py", "self._jobs.flush()"): "a pipe to the Spark worker process",
    ("labkit/experiments/late_write.py", "app.stdin.flush()"): "a pipe to the producer's process",
    ("labkit/experiments/late_write.py", "stderr.flush()"): "the run's log file",
}
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%writefile")


def _passes_timeout(name: str, args: list[ast.expr], keywords: list[ast.keyword]) -> bool:
    if any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in keywords):
        return True  # *args / **kwargs: cannot tell statically, assume it is there
    if any(k.arg in TIMEOUT_KEYWORDS for k in keywords):
        return True
    if name == "get_watermark_offsets" and any(
            k.arg == "cached" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in keywords):
        return True  # served from the client's cache: no request
    return len(args) > TIMEOUT_AT[name]


def _embedded_code(node: ast.AST) -> ast.Module | None:
    """A multi-line string constant that is Python code (not prose that happens to parse)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and "\n" in node.value.strip()):
        return None
    try:
        tree = ast.parse(node.value)
    except SyntaxError:
        return None
    return tree if any(not isinstance(s, ast.Expr) for s in tree.body) else None


def unbounded_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of each watched call in ``source`` that passes no timeout."""
    found = []

    def visit(tree: ast.AST, first_line: int) -> None:
        for node in ast.walk(tree):
            if (inner := _embedded_code(node)) is not None:
                visit(inner, first_line + node.lineno - 1)
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in TIMEOUT_AT:
                if not _passes_timeout(func.attr, node.args, node.keywords):
                    found.append((first_line + node.lineno - 1, ast.unparse(node)))
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Attribute) and arg.attr in AS_FUNCTION:
                    if not _passes_timeout(arg.attr, node.args[i + 1:], node.keywords):
                        found.append((first_line + node.lineno - 1, ast.unparse(node)))

    visit(ast.parse(source), 1)
    return sorted(set(found))


def cell_code(source: str) -> str | None:
    """A code cell's Python: IPython's line magics and shell lines blanked (line numbers
    stay); None for a cell magic whose body is not Python (%%bash, %%writefile x.json)."""
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):
        magic = lines[0].split()
        if magic[0] not in PYTHON_CELL_MAGICS or (
                magic[0] == "%%writefile" and not magic[-1].endswith(".py")):
            return None
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def sources() -> list[tuple[str, int, str]]:
    """(where, first line, code) of everything the rule covers."""
    found = []
    for pattern in ("labkit/**/*.py", "examples/**/*.py"):
        for path in sorted(ROOT.glob(pattern)):
            found.append((str(path.relative_to(ROOT)), 1, path.read_text(encoding="utf-8")))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        if path.stem.startswith("_"):  # a test's temporary copy
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            code = cell_code("".join(cell["source"])) if cell["cell_type"] == "code" else None
            if code is not None:
                found.append((f"{path.relative_to(ROOT)} cell {i}", 1, code))
    for path in sorted((ROOT / "notebooks" / "solutions").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start(1)) + 1,
                          m.group(1)))
    return found


def test_every_blocking_kafka_call_passes_a_timeout():
    unbounded = [f"{where}:{first + line - 1}: {call}"
                 for where, first, code in sources()
                 for line, call in unbounded_calls(code)
                 if (where, call) not in NOT_KAFKA]
    assert unbounded == [], "calls that can wait forever, give them a timeout:\n" + \
        "\n".join(unbounded)


def test_the_checker_reports_what_it_is_for():
    """Fed code without timeouts, the checker reports each call (so an empty list above
    means something), and only those."""
    snippet = "\n".join([
        "producer.init_transactions()",  # 1
        "producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())",
        "producer.send_offsets_to_transaction(offsets, meta, 60)",
        "producer.commit_transaction(timeout=60)",
        "producer.abort_transaction()",  # 5
        "consumer.committed(consumer.assignment())",
        "consumer.committed(parts, timeout=30)",
        "left = producer.flush()",
        "producer.flush(30)",
        "print(len(self.committed), shown(run.committed))",
        "txn._call('commit', txn.producer.commit_transaction)",  # 11
        "txn._call('commit', txn.producer.commit_transaction, timeout_s)",
        "consumer.get_watermark_offsets(tp, cached=True)",
        "app = '''",
        "import os",
        "producer.flush()",  # 16: in a string that is code
        "'''",
    ])
    assert [line for line, _ in unbounded_calls(snippet)] == [1, 2, 5, 6, 8, 11, 16]
    cell = "%%writefile {app_dir}/app.py\nproducer.flush()\n!ls\n%time producer.flush(5)\n"
    assert unbounded_calls(cell_code(cell)) == [(2, "producer.flush()")]
    assert cell_code("%%bash\nkafka-topics.sh --list\n") is None
    where = {w for w, _, _ in sources()}
    assert {"labkit/pipelines/txn.py", "examples/torture/exactly_once_app.py",
            "notebooks/05b_when_the_coordinator_fails.ipynb cell 5",
            "notebooks/solutions/12_your_own_pipeline.md"} <= where
