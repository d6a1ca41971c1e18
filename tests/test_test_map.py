"""docs/code.md's map of where each module's tests are stays true: every module of the project has
tests/test_<its name>.py or a row in the map, a name two modules share has a row for each, every
file and module a row names exists, and a row that says there is nothing to test is a docstring."""

import ast
import re
from collections import Counter
from pathlib import Path

from tests.helpers import PACKAGES, ROOT

SCRIPTS = ("train.py", "sample.py", "export.py", "user_error.py")
SECTION = "## Where each module's tests are"
ROW = re.compile(r"^\| `([\w/]+\.py)` \| (.+) \|$", re.MULTILINE)
TEST_FILE = re.compile(r"`(tests/test_\w+\.py)`")
NOTHING_TO_TEST = "none: a docstring only"


def project_modules() -> list[str]:
    """Every module of the project as a path: "training/step.py", "train.py"."""
    return sorted([str(path.relative_to(ROOT)) for folder in PACKAGES for path in (ROOT / folder).glob("*.py")]
                  + list(SCRIPTS))


def name_of(module: str) -> str:
    """The name tests/test_<name>.py is named after: "step" for training/step.py, "model" for model/__init__.py."""
    path = Path(module)
    return path.parent.name if path.stem == "__init__" else path.stem


def map_rows() -> dict[str, str]:
    """The map's rows: module -> the cell that says where its tests are."""
    text = (ROOT / "docs" / "code.md").read_text()
    section = text[text.index(SECTION):].split("\n## ")[0]
    return dict(ROW.findall(section))


def map_problems(modules: list[str], rows: dict[str, str]) -> list[str]:
    """What in the map is missing or untrue, one line each."""
    problems = []
    names = Counter(name_of(module) for module in modules)
    for module in modules:
        name = name_of(module)
        if module in rows:
            continue
        if names[name] > 1:
            problems.append(f"{module}: another module is named {name} too; give it a row in docs/code.md's map of tests")
        elif not (ROOT / "tests" / f"test_{name}.py").is_file():
            problems.append(f"{module}: no tests/test_{name}.py and no row in docs/code.md's map of tests")
    for module, cell in rows.items():
        if module not in modules:
            problems.append(f"{module}: in docs/code.md's map of tests, but no such module")
        elif cell == NOTHING_TO_TEST:
            body = ast.parse((ROOT / module).read_text()).body
            if not (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
                problems.append(f"{module}: the map says a docstring only, but it holds code")
            continue
        tests = TEST_FILE.findall(cell)
        if not tests:
            problems.append(f"{module}: its row names no tests/test_*.py")
        problems += [f"{module}: its row names {test}, which does not exist" for test in tests
                     if not (ROOT / test).is_file()]
    return problems


def test_every_module_has_tests_named_after_it_or_a_row_in_the_map():
    rows = map_rows()
    assert len(rows) > 40  # the table was read
    assert map_problems(project_modules(), rows) == []


def test_a_module_without_tests_or_a_row_and_a_stale_row_are_caught():
    modules, rows = project_modules(), map_rows()
    assert map_problems(modules + ["training/new_role.py"], rows) == [
        "training/new_role.py: no tests/test_new_role.py and no row in docs/code.md's map of tests"]
    assert map_problems(sorted(modules + ["bench/model.py"]), rows) == [  # tests/test_model.py is model/'s
        "bench/model.py: another module is named model too; give it a row in docs/code.md's map of tests",
        "model/__init__.py: another module is named model too; give it a row in docs/code.md's map of tests"]
    stale = {**rows, "training/gone.py": "`tests/test_gone.py`", "model/gpt.py": "`tests/test_gpt_whole.py`",
             "training/build.py": NOTHING_TO_TEST}
    assert map_problems(modules, stale) == [
        "model/gpt.py: its row names tests/test_gpt_whole.py, which does not exist",
        "training/build.py: the map says a docstring only, but it holds code",
        "training/gone.py: in docs/code.md's map of tests, but no such module",
        "training/gone.py: its row names tests/test_gone.py, which does not exist"]
