"""A Flink job's process: ``PYFLINK_PYTHON jobmain.py SETTINGS.json``, run by the lab in
PyFlink's own environment (it imports nothing of labkit's, which is not installed there).

SETTINGS.json names the job's code (a file: the lab's ``fee_job.py`` or a learner's cell
saved as one), the function in it, the parameters the lab provides, and where to write the
outcome. The function is called with the parameters it names. Its JVM is this process's
child (PyFlink's gateway) in this process's group, so the lab's SIGKILL to the group takes
both. When the job fails, the outcome file holds Flink's own error: each Java cause, the
root last (a refused transaction timeout is an InvalidTxnTimeoutException there).
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import traceback


def java_causes(exc: BaseException) -> list[str]:
    """'Class: message' of a Py4JJavaError's Java exception and each cause under it."""
    java = getattr(exc, "java_exception", None)
    causes = []
    while java is not None and len(causes) < 20:
        causes.append(f"{java.getClass().getName()}: {java.getMessage()}")
        java = java.getCause()
    return causes


def _kernel_only(node: ast.stmt) -> bool:
    """A bare expression (a cell ending with the lab's check on its job: ``check(my_job,
    ...)``), or an import of the lab's own modules, which PyFlink's environment does not
    have: both are for the notebook's kernel, not for the job's process."""
    if isinstance(node, ast.Expr):
        return not isinstance(node.value, ast.Constant)  # a docstring stays
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "labkit"
    if isinstance(node, ast.Import):
        return all(alias.name.split(".")[0] == "labkit" for alias in node.names)
    return False


def definitions(code_file: str) -> dict:
    """What the job's file (a learner's cell) defines, what is for the notebook's kernel
    left out (``_kernel_only``): its imports, functions and assignments run."""
    with open(code_file) as fh:
        tree = ast.parse(fh.read(), code_file)
    tree.body = [node for node in tree.body if not _kernel_only(node)]
    namespace: dict = {"__name__": "flink_job", "__file__": code_file}
    exec(compile(tree, code_file, "exec"), namespace)
    return namespace


def main(settings_file: str) -> int:
    with open(settings_file) as fh:
        settings = json.load(fh)
    outcome: dict = {"ok": False}
    try:
        code = definitions(settings["code_file"])
        job = code.get(settings["function"])
        if not callable(job):
            raise NameError(f"{settings['code_file']} defines no function "
                            f"{settings['function']!r}")
        wanted = inspect.signature(job).parameters
        params = settings["params"]
        missing = [n for n, p in wanted.items()
                   if n not in params and p.default is inspect.Parameter.empty]
        if missing:
            raise TypeError(f"{settings['function']} asks for {', '.join(missing)}, which the "
                            f"lab does not provide; it provides {', '.join(sorted(params))}")
        job(**{n: params[n] for n in wanted if n in params})
        outcome = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - written down for the lab, then re-raised
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000],
                   "java": java_causes(exc), "traceback": traceback.format_exc()[-8000:]}
        raise
    finally:
        with open(settings["outcome_file"], "w") as fh:
            json.dump(outcome, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
