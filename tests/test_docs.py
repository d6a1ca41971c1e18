"""The README and the pages under docs/: every relative link resolves, every code name they quote
exists, and the README stays a guide."""

import functools
import importlib
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350
# Pages another change adds; a link to one of them may go ahead of it.
COMING = {ROOT / "docs" / "resume.md"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def links(page: Path) -> list[str]:
    """The targets of a page's Markdown links, leaving out code blocks."""
    return LINK.findall(FENCE.sub("", page.read_text()))


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+\s+(.*)$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if file in COMING:
            continue
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading) [gone](missing.md) ![gone](missing.png) "
                    "[bad anchor](there.md#nowhere) [web](https://example.com/x)\n```\n[in code](ignored.md)\n```\n")
    assert broken_links(page) == ["missing.md (no such file)", "missing.png (no such file)",
                                  "there.md#nowhere (no heading with that anchor)"]


def test_the_readme_is_at_most_350_lines() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move depth into a page under docs/"


# Every code name the pages quote must exist. Each span `...` outside code blocks is read as
# one kind of thing, and each kind is checked where it lives:
#   a path (has a file suffix, ends in /, or starts with a folder of the project): it exists,
#       or the code writes it (train.log); paths under what a run or setup makes (.venv/,
#       outputs/, ...) and paths with <placeholders> are not checked;
#   a command (make ..., python ..., a script): its make target, script and config keys exist;
#   an override or config key (train.max_steps=800, model.pos, data=stories): a key of
#       configs/, or a choice of a config group; hydra.* is Hydra's own;
#   a Python name (attend_manual, GPT._init_weights, F.scaled_dot_product_attention,
#       contiguous()): torch/nn/F/np/math names resolve by import, others are identifiers of
#       the project's code (tests included), a head_{metric}-style name of a template there,
#       or an importable module;
#   a TensorBoard tag (loss/val, attention/layer_<l>/head_<h>): written in the code;
#   anything else (math, shapes, numbers, prose): the dotted and snake_case names inside it,
#       as above. Single letters and subscripts (q_i, W_q, sum_j) are maths.
# Lines of ```python blocks are quotes: each is a line of a .py file of the project.
GENERATED = {".venv", ".cache", "outputs", "multirun", "bench_results", ".hydra", "..", "/tmp"}
SUFFIXES = {".py", ".md", ".yaml", ".txt", ".toml", ".json", ".png", ".pt", ".js", ".html", ".log", ".gz", ".jsonl",
            ".safetensors", ".bin"}
TORCH_ROOTS = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy", "math": "math"}
SHELL = {"make", "python", "python3", ".venv/bin/python", "time", "torchrun", ".venv/bin/torchrun", "tensorboard",
         ".venv/bin/tensorboard", "pip", "kill"}
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@functools.cache
def project_code() -> tuple[str, frozenset[str], tuple[str, ...]]:
    """The project's code and config as one text (but this file), its identifiers, and its name templates
    (the part before {...} in f"head_{name}/...": "head_")."""
    files = [path for folder in ("model", "model_io", "cli", "data", "training", "inspection", "attention_tab", "bench",
                                 "configs", "docs", "tests", ".ci")
             for path in (ROOT / folder).rglob("*")
             if path.is_file() and path.suffix in {".py", ".yaml", ".js", ".html", ".css", ""}
             and "__pycache__" not in path.parts and path != Path(__file__)]  # this file names what is gone
    files += [path for path in ROOT.iterdir() if path.is_file() and path.suffix in {".py", ".toml", ".txt", ""}]
    text = "\n".join(path.read_text(errors="replace") for path in files)
    templates = tuple(set(re.findall(r"([A-Za-z][\w/]*_)\{\w+\}", text)))
    return text, frozenset(re.findall(r"[A-Za-z_]\w*", text)), templates


@functools.cache
def config_keys() -> frozenset[str]:
    """train.max_steps, model.pos, ...: every key of configs/, with its group; seed, prompt, ...:
    the top-level keys of configs/train.yaml and configs/sample.yaml; and the groups."""
    keys = set()
    for path in (ROOT / "configs").rglob("*.yaml"):
        parts = path.relative_to(ROOT / "configs").parts
        group = f"{parts[0]}." if len(parts) > 1 else ""
        keys |= {f"{group}{key}" for key in (yaml.safe_load(path.read_text()) or {})}
        if len(parts) > 1:
            keys.add(parts[0])
    return frozenset(keys)


def resolves(dotted: str) -> bool:
    """torch.bmm, F.scaled_dot_product_attention, nn.MultiheadAttention, Optimizer.add_param_group
    (a torch class), cProfile: an importable module, or attributes of one."""
    first, *rest = dotted.split(".")
    roots = [TORCH_ROOTS[first]] if first in TORCH_ROOTS else [first, "torch", "torch.nn", "torch.optim"]
    for root in roots:
        try:
            obj = importlib.import_module(root)
            if root != first and first not in TORCH_ROOTS:
                obj = getattr(obj, first)
            for part in rest:
                obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(f"{obj.__name__}.{part}")
            return True
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
    return False


def is_maths(name: str) -> bool:
    return len(name) == 1 or bool(re.fullmatch(r"[A-Za-z]+_[A-Za-z0-9]", name))


def name_problem(name: str, in_code: bool = False) -> str | None:
    """Why a Python name (maybe dotted, maybe self.x, maybe with ()) does not exist, or None.
    model.pos alone is a config key; in_code (inside an expression) it may be an attribute."""
    name = name.removesuffix("()").removeprefix("self.")
    _, identifiers, templates = project_code()
    first = name.split(".")[0]
    if is_maths(name) or name.startswith("hydra."):
        return None
    if first in TORCH_ROOTS:
        return None if resolves(name) else f"{name}: no such name in {TORCH_ROOTS[first]}"
    if "." in name and first in config_keys() and (name in config_keys() or not in_code):
        return None if name in config_keys() else f"{name}: no such config key in configs/"
    unknown = [part for part in name.split(".") if part not in identifiers
               and not any(part.startswith(t) and part[len(t):] in identifiers for t in templates)]
    if unknown and not resolves(name):
        return f"{name}: {', '.join(unknown)} is nowhere in the code"
    return None


def path_problem(path: str) -> str | None:
    text, _, _ = project_code()
    if "<" in path or path.split("/")[0] in GENERATED or path.startswith("/"):
        return None
    if (ROOT / path).exists() or path.rstrip("/") in text:
        return None
    return f"{path}: no such file or folder, and the code does not write it"


def is_path(span: str) -> bool:
    first = span.split("/")[0]
    return (Path(span).suffix in SUFFIXES and not span.startswith("-")) or span.endswith("/") or (
        "/" in span and ((ROOT / first).is_dir() or first in GENERATED or first.startswith(".")))


def command_problems(span: str) -> list[str]:
    words = span.split()
    problems = []
    if words[0] == "make" and len(words) > 1 and "=" not in words[1]:
        targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
        if words[1] not in targets:
            problems.append(f"make {words[1]}: no such target in the Makefile")
    for word in words[1:]:
        if word.startswith("-") or "<" in word or word in ("-m",):
            continue
        if word.endswith(".py") or (is_path(word) and "=" not in word):
            problems.append(path_problem(word))
        elif re.fullmatch(r"[a-z_]+(\.[a-z_]+)*=.*", word):
            problems.append(override_problem(word))
    return [p for p in problems if p]


def override_problem(override: str) -> str | None:
    key, _, value = override.partition("=")
    if key.startswith("hydra.") or key.isupper():  # Hydra's settings; make's and the shell's variables
        return None
    if "." not in key and key not in config_keys():  # a keyword argument: causal=False
        return name_problem(key)
    if (ROOT / "configs" / key).is_dir() and re.fullmatch(r"[\w,]+", value):
        missing = [v for v in value.split(",") if not (ROOT / "configs" / key / f"{v}.yaml").is_file()]
        return f"{override}: no configs/{key}/{missing[0]}.yaml" if missing else None
    return None if key in config_keys() else f"{override}: no such config key in configs/"


def span_problems(span: str) -> list[str]:
    """What in one code span names something that does not exist."""
    span = span.strip().rstrip(":")
    if not span or re.fullmatch(r"--?[\w-]+.*|\.\w+|[\d.,eE+-]+", span):  # a flag, a file suffix, a number
        return []
    if span.split()[0] in SHELL or span.split()[0].endswith(".py") and " " in span:
        return command_problems(span)
    if re.fullmatch(r"[a-z_]+(\.[a-z_]+)*=\S*", span):
        return [p for p in [override_problem(span)] if p]
    if " " not in span and is_path(span):
        return [p for p in [path_problem(span)] if p]
    if re.fullmatch(r"[\w.]+(\(\))?", span):
        return [p for p in [name_problem(span)] if p]
    if re.fullmatch(r"[\w/<>.]+", span) and "/" in span:  # a TensorBoard tag, maybe with <placeholders>
        text = project_code()[0]
        pattern = re.escape(span.strip("./")).replace(r"\.\.\.", "")
        pattern = re.sub(r"<\w+>", r"[{<]\\w+[}>]", pattern)
        return [] if re.search(pattern, text) else [f"{span}: no such tag in the code"]
    # An expression: its dotted names (torch.ones, model.run_with_cache) and snake_case names.
    names = re.findall(r"(?<![\w./])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|(?<![\w./])[A-Za-z]\w*_\w+", span)
    return [p for p in (name_problem(name, in_code=True) for name in names) if p]


def stale_code_names(page: Path) -> list[str]:
    text = page.read_text()
    problems = [p for span in CODE_SPAN.findall(FENCE.sub("", text)) for p in span_problems(span)]
    code_lines = {line.strip() for path in ROOT.glob("[!.]*/**/*.py") for line in path.read_text().splitlines()}
    for block in PYTHON_BLOCK.findall(text):
        problems += [f"quoted line not in the code: {line.strip()}" for line in block.splitlines()
                     if line.strip() and line.strip() not in code_lines]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_code_name_a_page_quotes_exists(page: Path) -> None:
    assert stale_code_names(page) == []


def test_a_renamed_or_missing_code_name_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Real: `attend_manual`, `CausalSelfAttention.qk_norm_and_rope`, `F.scaled_dot_product_attention`, "
        "`model/attention.py`, `make docs`, `python train.py train.max_steps=10 data=stories`, "
        "`model.pos`, `head_entropy`, `attention/layer_<l>/head_<h>`, `contiguous()`, `q_i . q_j`, `train.log`, "
        "`outputs/<date>/`, `with model.hooks(model.knock_out({(0, 1)})):`.\n"
        "Gone: `_manual`, `GPT.init_weights_gpt2`, `F.scaled_dot_attention`, `model/attn.py`, `make doc`, "
        "`python train.py train.max_step=10`, `data=novels`, `model.position`, `loss/vall`, "
        "`model.knock_heads_out({(0, 1)})`.\n"
        "```python\nq, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=2)  # (B, T, H*D), 2 x (B, T, K*D)\n"
        "q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)\n```\n")
    assert stale_code_names(page) == [
        "_manual: _manual is nowhere in the code",
        "GPT.init_weights_gpt2: init_weights_gpt2 is nowhere in the code",
        "F.scaled_dot_attention: no such name in torch.nn.functional",
        "model/attn.py: no such file or folder, and the code does not write it",
        "make doc: no such target in the Makefile",
        "train.max_step=10: no such config key in configs/",
        "data=novels: no configs/data/novels.yaml",
        "model.position: no such config key in configs/",
        "loss/vall: no such tag in the code",
        "model.knock_heads_out: knock_heads_out is nowhere in the code",
        "quoted line not in the code: q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)",  # the line before K
    ]
