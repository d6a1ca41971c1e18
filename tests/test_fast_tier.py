"""make test-fast runs the tests not marked slow, browser, distributed or compile (the Makefile's
FAST_TESTS; the markers are registered in pyproject.toml). It must still run every module of the
project: for each one, some test file with a test in the tier imports it, or runs it (train.py,
sample.py, export.py, a script that imports it). What a test file imports counts with what that
brings in of the project, module by module; tests/helpers.py and conftest.py do not count, since
every file uses them. Which tests are in the tier is pytest's own answer (--collect-only -m)."""

import ast
import functools
import re
import sys

import pytest

from tests.helpers import PACKAGES, ROOT

# Besides the project's packages (tests/helpers.py), its top-level modules.
SCRIPTS = ("train", "sample", "export")
MODULES = ("user_error",)
# An import statement inside a string: the code a test runs in a new Python process.
IMPORT_IN_CODE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ]+)|import\s+([\w., ]+))", re.MULTILINE)


def fast_tests() -> str:
    """The marker expression make test-fast gives pytest -m."""
    return re.search(r"^FAST_TESTS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)[1]


def project_modules() -> set[str]:
    """Every module of the project: "model.gpt", the package "model" for model/__init__.py, "train".
    A package's __main__ (bench's) is left out: it only calls its cli module's main."""
    modules = {f"{package}.{path.stem}" for package in PACKAGES for path in (ROOT / package).glob("*.py")
               if path.stem != "__main__"}
    return {module.removesuffix(".__init__") for module in modules} | set(SCRIPTS) | set(MODULES)


def named(source: str) -> set[str]:
    """The modules a file's source imports (anywhere in it, a function's body too) or runs (a script's
    name, an import in a string of code), as dotted names; `from a import b` names a and a.b."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in {f"{script}.py" for script in SCRIPTS}:
                names.add(node.value.removesuffix(".py"))
            for module, imported, modules in IMPORT_IN_CODE.findall(node.value):
                names |= ({module} | {f"{module}.{name.strip()}" for name in imported.split(",")} if module
                          else {name.strip() for name in modules.split(",")})
    return names


@functools.cache
def imports_of(module: str) -> frozenset[str]:
    """What a module of the project imports."""
    return frozenset(named((ROOT / (module.replace(".", "/") + ("/__init__.py" if module in PACKAGES else ".py"))).read_text()))


def reached(names: set[str], modules: set[str]) -> set[str]:
    """The project's modules that importing (or running) names brings in: each one and its parent
    packages, then what they import in turn."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        parts = todo.pop().split(".")
        for module in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if module in modules and module not in seen:
                seen.add(module)
                todo.extend(imports_of(module))
    return seen


class Collected:
    """A pytest plugin that keeps the node ids of the tests a session selected."""

    def __init__(self) -> None:
        self.nodeids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.nodeids = [item.nodeid for item in session.items]


def tier_files(expression: str, ignored: list[str]) -> set[str]:
    """The test files that hold at least one test the expression selects, as pytest collects them
    (--collect-only -m), the ignored ones (--ignore) aside. pytest runs in this process: the test
    files a session of the whole suite has imported already are not imported again, where a new
    process would spend seconds importing torch, transformers and every test file."""
    collected, saved_path = Collected(), sys.path[:]
    try:
        status = pytest.main(["--collect-only", "-qq", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                              "-o", "addopts=--strict-markers", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "-m", expression, *(f"--ignore={path}" for path in ignored), str(ROOT / "tests")],
                             plugins=[collected])
    finally:
        sys.path[:] = saved_path
    assert status == pytest.ExitCode.OK, f"pytest --collect-only -m {expression!r} ended with {status!r}"
    return {nodeid.split("::")[0] for nodeid in collected.nodeids}


@functools.cache
def reaches_by_file() -> dict[str, set[str]]:
    """{test file: the project's modules it reaches}, for every test file."""
    modules = project_modules()
    return {path.relative_to(ROOT).as_posix(): reached(named(path.read_text()), modules)
            for path in sorted((ROOT / "tests").glob("test_*.py"))}


def uncovered(files: set[str], modules: set[str]) -> dict[str, list[str]]:
    """Each module no file of files reaches, with the test files (any) that do reach it."""
    reaches = reaches_by_file()
    covered = set().union(*(reaches[file] for file in files))
    return {module: [file for file, found in reaches.items() if module in found]
            for module in sorted(modules - covered)}


@pytest.mark.slow  # pytest's collection of the whole suite (alone, this file imports torch, transformers and every test file)
def test_the_fast_tier_runs_every_module_of_the_project(pytestconfig):
    modules = project_modules()
    assert {"model.gpt", "model", "data.stories", "attention_tab.plugin", "cli.schema", "runtime.ranks", "bench.cli",
            "user_error", "train", "export"} <= modules
    # The files this session ignores stay out of the count too: a machine without a package one of
    # them imports (selenium, nbformat) ignores it, and pytest could not collect it there.
    ignored = [str(pytestconfig.invocation_params.dir / path) for path in pytestconfig.getoption("ignore") or []]
    files = tier_files(fast_tests(), ignored)
    assert "tests/test_model.py" in files and "tests/test_distributed.py" not in files  # the expression selects
    missing = uncovered(files, modules)
    assert missing == {}, "modules no test of make test-fast imports or runs (module: the files that do): " + str(missing)


def test_the_check_sees_a_module_that_only_marked_tests_reach():
    # Without the test files that reach attention_tab/plugin.py, it is uncovered and they are named:
    # the check above can fail, and says which files would cover what it misses.
    modules = project_modules()
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")}
    everything = uncovered(files, modules)
    assert everything == {}
    reaching_plugin = {file for file, found in reaches_by_file().items() if "attention_tab.plugin" in found}
    assert reaching_plugin  # some test reaches it
    missing = uncovered(files - reaching_plugin, modules)
    assert "attention_tab.plugin" in missing and set(missing["attention_tab.plugin"]) == reaching_plugin
