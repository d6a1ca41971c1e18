"""The README and the pages under docs/ never contradict themselves or the code: a figure has one
home, with its machine, date and command, and other places link to it; the guide holds current
facts, not history; the 'I want to…' table runs the commands its sections give."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.test_docs import FENCE, PAGES, ROOT, heading_anchors

README = ROOT / "README.md"
SPEED = ROOT / "docs" / "speed.md"
DATE = re.compile(r"20\d\d-\d\d-\d\d")
TIME_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?: to \d[\d,]*(?:\.\d+)?)? ?(?:ms|s|min|tokens/s)\b")


def prose(page: Path) -> str:
    """A page without its code blocks."""
    return FENCE.sub("", page.read_text())


def undated_time_figures(text: str) -> list[str]:
    """Lines that give a time (12 ms, 6 to 20 s, 2 min, 12,970 tokens/s) with no date beside it: in a
    table, the date may stand in the row or in the table's header row; prose has none."""
    problems, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = line
        if TIME_FIGURE.search(line) and not DATE.search(line) and not (header and DATE.search(header)):
            problems.append(line.strip()[:120])
    return problems


def test_the_readme_gives_a_time_only_in_a_table_row_that_dates_it():
    assert undated_time_figures(prose(README)) == []


def test_an_undated_time_in_the_readme_is_caught():
    text = ("The tab answers in 10 to 25 ms ([speed](docs/speed.md)).\n"
            "| run | time | date |\n| --- | --- | --- |\n| `make train` | 2 min 59 s | 2026-11-26 |\n"
            "| what | figure | machine, date |\n| --- | --- | --- |\n| sampling | 893 tokens/s | Intel VM, 2026-11-24 |\n"
            "| what | figure |\n| --- | --- |\n| compiling | 6 to 20 s |\n")
    assert undated_time_figures(text) == ["The tab answers in 10 to 25 ms ([speed](docs/speed.md)).",
                                          "| compiling | 6 to 20 s |"]


@pytest.mark.parametrize("page", [page for page in PAGES if page != SPEED], ids=lambda page: page.name)
def test_the_tabs_answer_time_and_the_compile_time_are_stated_in_speed_md_alone(page: Path):
    # A time in ms, or a compile time, outside docs/speed.md only in a dated row of a page's own figures table.
    assert timings_outside_speed_md(prose(page).splitlines()) == []


def timings_outside_speed_md(lines: list[str]) -> list[str]:
    """Lines that give a time in ms, or a compile time in seconds, with no date beside them."""
    in_ms = [line for line in lines if re.search(r"\d ?ms\b", line) and not DATE.search(line)]
    compiling = [line for line in lines if re.search(r"compil", line, re.IGNORECASE)
                 and re.search(r"\d(?: to \d+)? ?s\b", line) and not DATE.search(line)]
    return in_ms + compiling


def test_no_code_or_config_states_the_tabs_answer_time_or_the_compile_time():
    # What --help points to (configs/), what the scripts print and what the code's comments say:
    # they link to docs/speed.md, as the pages do, rather than keep a copy of its figures.
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.yaml", "*.js"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    found = [f"{name}: {line.strip()}" for name in tracked if not name.startswith("tests/")
             for line in timings_outside_speed_md((ROOT / name).read_text().splitlines())]
    assert found == []
    assert timings_outside_speed_md(["compile: false  # compile the one-token step first (6 to 20 s)"]) != []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_claims_a_machine_nobody_measured(page: Path):
    assert "laptop" not in page.read_text().lower(), "every figure here comes from 2-core VMs: say a CPU, and link it"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_claims_a_test_for_every_claim(page: Path):
    # The tour lists the kinds of sentence that no test checks (advice, one run's measurement, other models').
    assert not re.search(r"(each|every) claim[^.]*\btest", " ".join(prose(page).split()))


HISTORY = ("previous default", "before the switch", "the goal", "used to", "no longer", "was tried", "tried and",
           "until it took")


def test_the_readme_holds_current_facts_not_history():
    # What was tried and dropped, and what the default used to be, live in git log and the pages under docs/.
    text = " ".join(prose(README).split()).lower()
    assert [marker for marker in HISTORY if marker in text] == []


def linked_text(target: str, page: Path) -> str:
    """The text a link of page points to: a section of a page (to the next heading of its level) or a page."""
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    text = file.read_text()
    if not anchor:
        return text
    assert anchor in heading_anchors(file), target
    for match in re.finditer(r"^(#+)\s+(.*)$", text, re.MULTILINE):
        if re.sub(r"[^\w\- ]", "", match[2].strip().lower()).replace(" ", "-") == anchor:
            end = re.search(rf"^#{{1,{len(match[1])}}}\s", text[match.end():], re.MULTILINE)
            return text[match.start(): match.end() + end.start() if end else len(text)]
    raise AssertionError(target)


def table_commands_missing_from_their_links(readme: Path) -> list[str]:
    """The 'I want to…' rows whose commands (`make ...`, `.venv/bin/...`) none of the row's own links
    gives whole (a command, not the start of a longer one); a <placeholder> stands for any word."""
    missing = []
    for row in re.findall(r"^\| [^|]+ \| (.*) \|$", readme.read_text().split("| I want to… |")[1].split("\n\n")[0],
                          re.MULTILINE):
        targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", row) if t.startswith(("#", "docs/"))]  # not notebooks
        if not targets:
            continue
        texts = "\n".join(linked_text(t, readme) for t in targets)
        for command in re.findall(r"`((?:make |\.venv/bin/)[^`]+)`", row):
            pattern = r"\S+".join(re.escape(part) for part in re.split(r"<\w+>", command))
            if not re.search(rf"(?<![\w./-]){pattern}(?=`|\s+#|[ \t]*$)", texts, re.MULTILINE):
                missing.append(command)
    return missing


def test_the_i_want_to_table_gives_the_commands_of_the_sections_it_links():
    # The table once trained on 2 processes with the default batch where its section halved it.
    assert table_commands_missing_from_their_links(README) == []


def test_a_command_the_linked_section_does_not_give_is_caught(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "| I want to… | command |\n| --- | --- |\n"
        "| train on 2 processes | `.venv/bin/torchrun --standalone --nproc_per_node=2 train.py` ([More](#more-compute)) |\n"
        "| resume | `.venv/bin/python train.py resume=outputs/<date>/<time>` ([Stop](#stop)) |\n\n"
        "## More compute\n\n```bash\n.venv/bin/torchrun --standalone --nproc_per_node=2 train.py train.batch_size=8\n```\n\n"
        "## Stop\n\nResume with: .venv/bin/python train.py resume=outputs/2026-11-23/10-00-00\n")
    assert table_commands_missing_from_their_links(readme) == [".venv/bin/torchrun --standalone --nproc_per_node=2 train.py"]


def test_the_readme_names_no_logdir_that_make_tensorboard_already_reads():
    target = re.search(r"^tensorboard:.*\n(?:\t.*\n)*?\t(.*--logdir_spec.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)[1]
    read = set(re.findall(r"(\w+):\1", target))  # --logdir_spec outputs:outputs,multirun:multirun
    assert read == {"outputs", "multirun"}
    text = README.read_text()  # its code blocks too
    named = [folder for folder in read if re.search(rf"--logdir {folder}(?![\w/])", text)]  # not a run's outputs/<date>
    assert named == [], "make tensorboard reads it already"


def test_what_the_pages_say_auto_picks_is_what_the_code_picks():
    from runtime.devices import Machine
    from runtime.precision import choose_dtype
    from training.optimizer import ns_dtype_for

    cpu, mps, cuda = torch.device("cpu"), torch.device("mps"), torch.device("cuda")
    assert choose_dtype("auto", cpu, Machine())[0] == choose_dtype("auto", mps, Machine())[0] == "fp32"
    assert choose_dtype("auto", cuda, Machine(cuda_bf16=True, cuda_name="a GPU"))[0] == "bf16"
    assert choose_dtype("auto", cuda, Machine(cuda_bf16=False, cuda_name="a GPU"))[0] == "fp16"
    readme = " ".join(prose(README).split())
    assert ("`train.dtype=auto` picks `bf16` on a GPU with native bf16, `fp16` on an older GPU, and `fp32` on a CPU "
            "and on a Mac's `mps`") in readme
    devices = " ".join((ROOT / "docs" / "devices.md").read_text().split())
    assert "`fp32` on a CPU and on MPS" in devices
    # Muon's ns_dtype=auto: float32 on a CPU; bfloat16 only where a GPU computes in bf16 natively.
    a100, t4 = Machine(cuda_count=1, cuda_bf16=True), Machine(cuda_count=1, cuda_bf16=False)
    assert ns_dtype_for("auto", cpu, a100) == ns_dtype_for("auto", cuda, t4) == torch.float32
    assert ns_dtype_for("auto", cuda, a100) == torch.bfloat16
    said = "bfloat16 on a GPU with native bf16"
    assert said in readme and said in " ".join(SPEED.read_text().split())
