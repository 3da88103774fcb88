"""The runner's common options are declared once (labkit.experiments.options), each with one
meaning in every experiment; torture's harness declares none of torture's options again."""
import ast
import inspect
from pathlib import Path

from labkit.experiments import options as common
from labkit.experiments.registry import catalog
from labkit.torture import harness

ROOT = Path(__file__).parents[1]
COMMON = {"records": common.records(1), "seed": common.seed(), "keep_topics":
          common.keep_topics(False), "timeout": common.timeout(1.0),
          "stall_s": common.stall_s(1.0)}


def _option_calls(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each ``Option("name", ...)`` written in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Option"
                and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
    return found


def test_no_module_declares_a_common_option_again():
    again = [f"{path.relative_to(ROOT)}:{line} {name}"
             for path in sorted((ROOT / "labkit").rglob("*.py"))
             if path != ROOT / "labkit/experiments/options.py"
             for line, name in _option_calls(path) if name in COMMON or name == "input"]
    assert not again, again


def test_each_common_option_means_the_same_in_every_experiment():
    seen = 0
    for name, experiment in catalog().items():
        for option in experiment.options:
            assert option.flag != "--stall-after", (name, "the watchdog's flag is the run's")
            assert "stall" not in option.name or option.name == "stall_s", (name, option.name)
            mine = COMMON.get(option.name)
            if mine is None:
                continue
            seen += 1
            assert (option.kind, option.flag, option.short) == \
                (mine.kind, mine.flag, mine.short), (name, option.name)
            assert option.help.split()[:2] == mine.help.split()[:2], (name, option.help)
    assert seen >= 30  # records alone is in 19 experiments


def test_the_harness_declares_none_of_tortures_options():
    params = inspect.signature(harness.torture).parameters
    assert list(params) == ["command", "cluster", "options"]
    torture_names = {o.name for o in catalog()["torture"].options}
    assert "records" in torture_names and not torture_names & {"input", "timeout_s",
                                                                "kill_after_s"}
