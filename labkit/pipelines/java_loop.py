"""The exactly-once loop in the Java client (kafka-clients 4.4), for the judge to run as it
runs a Python loop: ``examples/java_loop/ProductionLoop.java``, the one file a learner edits,
and ``Lab.java`` beside it (its settings from the environment, the crash points of
``labkit.faults.crashpoints`` under the same names, the fee, what it raised written to the
run's history as ``labkit.faults.runner`` writes a Python loop's).

    loop = java_loop.reference()                          # ProductionLoop.java as shipped
    loop = java_loop.JavaLoop.from_file("MyLoop.java")    # a learner's edited copy
    wrong = loop.edited("AtLeastOnceLoop", {old: new})    # "this line different", as learner.edited
    experiments.run("judge", pipeline=loop, phase="schedule")

The judge compiles it once per run (``compile``: javac into the run's directory, with
``Lab.java``) and starts each instance as ``java -cp <classes>:<jars> <its class>``: a JVM
started many times in a run (every kill, every restart) compiles nothing.
"""
from __future__ import annotations

import difflib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from labkit import settings
from labkit.kafka import jvm
from labkit.paths import project_root

FOLDER = Path("examples") / "java_loop"
REFERENCE = "ProductionLoop"
HELPER = "Lab"
COMPILE_TIMEOUT_S = 120.0
PUBLIC_CLASS = re.compile(r"^public\s+(?:final\s+)?class\s+(\w+)", re.MULTILINE)
# the settings a Java loop reads (Lab.setting): the judge's, each an environment variable
SETTINGS = ("bootstrap", "input_topic", "output_topic", "group_id", "transactional_id",
            "instance_id", "group_protocol", "batch_size")


class JavaLoopError(ValueError):
    """The Java loop cannot run (no public class, javac refused it): javac's own words."""


@dataclass(frozen=True)
class JavaLoop:
    """A Java loop's source (one file) and its public class, whose ``main`` runs the loop."""

    source: str
    name: str

    @classmethod
    def from_text(cls, source: str) -> "JavaLoop":
        found = PUBLIC_CLASS.search(source)
        if found is None:
            raise JavaLoopError("the Java loop declares no public class (its main runs the loop)")
        if found.group(1) == HELPER:
            raise JavaLoopError(f"{HELPER} is the lab's helper's name: call the loop's class "
                                "something else")
        return cls(source, found.group(1))

    @classmethod
    def from_file(cls, path: str | Path) -> "JavaLoop":
        return cls.from_text(Path(path).read_text(encoding="utf-8"))

    @property
    def __name__(self) -> str:  # as a function's, where a run names its pipeline
        return self.name

    def edited(self, name: str, changes: dict[str, str]) -> "JavaLoop":
        """A copy named ``name`` with each text of ``changes`` (found exactly once) replaced."""
        source = self.source
        for old, new in changes.items():
            if source.count(old) != 1:
                raise JavaLoopError(f"{old!r} occurs {source.count(old)} times in "
                                    f"{self.name}.java, not once")
            source = source.replace(old, new)
        source = re.sub(rf"\b{self.name}\b", name, source)  # its class, and main's reference
        return JavaLoop(source, name)

    def diff(self, other: "JavaLoop") -> str:
        """The lines of ``other`` that differ from this loop's (the class name aside)."""
        new = re.sub(rf"\b{other.name}\b", self.name, other.source)
        return "\n".join(difflib.unified_diff(self.source.splitlines(), new.splitlines(),
                                              self.name, other.name, n=1, lineterm=""))

    def compile(self, into: Path) -> Path:
        """javac this loop and the helper into ``into``/classes (once per run); that folder."""
        into = Path(into)
        sources = into / "java-src"
        classes = into / "classes"
        sources.mkdir(parents=True, exist_ok=True)
        classes.mkdir(parents=True, exist_ok=True)
        (sources / f"{self.name}.java").write_text(self.source, encoding="utf-8")
        helper = (project_root() / FOLDER / f"{HELPER}.java").read_text(encoding="utf-8")
        (sources / f"{HELPER}.java").write_text(helper, encoding="utf-8")
        done = subprocess.run(
            [_javac(), "-encoding", "UTF-8", "-d", str(classes), "-cp", _jars(),
             str(sources / f"{self.name}.java"), str(sources / f"{HELPER}.java")],
            capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            raise JavaLoopError(f"javac refused {self.name}.java:\n{done.stderr.strip()}")
        return classes

    def command(self, classes: Path) -> list[str]:
        """The command line of one instance: the compiled class on the jars the lab fetched."""
        return [jvm.check_java(), "-Xmx192m", *settings.SHORT_LIVED_JVM.split(),
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", f"{classes}:{_jars()}", self.name]


def reference() -> JavaLoop:
    """``examples/java_loop/ProductionLoop.java``: the lab's loop in Java."""
    return JavaLoop.from_file(project_root() / FOLDER / f"{REFERENCE}.java")


def parents(classes: list[str]) -> dict[str, str]:
    """Each class's superclass (simple names), as the kafka-clients jar the loop runs on
    declares it (javap): how the Java client sorts its errors (KIP-1050) is its class tree."""
    jar = next(jvm.jar_dir("tools").glob("kafka-clients-*.jar"))
    done = subprocess.run([str(Path(_javac()).with_name("javap")), "-cp", str(jar), *classes],
                          capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    found = re.findall(r"class ([\w.$]+) extends ([\w.$]+)", done.stdout)
    return {name.rsplit(".", 1)[-1]: parent.rsplit(".", 1)[-1] for name, parent in found}


def as_java(pipeline: object) -> JavaLoop | None:
    """``pipeline`` as a Java loop (a JavaLoop, or the path of a .java file); None if it is
    a Python one."""
    if isinstance(pipeline, JavaLoop):
        return pipeline
    if isinstance(pipeline, (str, Path)) and str(pipeline).endswith(".java"):
        return JavaLoop.from_file(pipeline)
    return None


def _jars() -> str:
    jvm.resolve("tools")  # kafka-clients 4.4 and Jackson, fetched once
    return str(jvm.jar_dir("tools") / "*")


def _javac() -> str:
    java = Path(jvm.check_java())
    for javac in (java.with_name("javac"), java.resolve().with_name("javac")):
        if javac.exists():  # the JDK's javac beside the java the lab runs
            return str(javac)
    raise JavaLoopError(f"no javac beside {java}: a JDK (not a JRE) {jvm.MIN_JAVA}+ is needed")
