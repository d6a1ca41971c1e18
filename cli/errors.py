"""Mistakes a user can make get one clear line, a non-zero exit and no traceback: a UserError
(user_error.py) for what the project refuses, and the wording of what Hydra and OmegaConf refuse."""

import argparse
import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from hydra._internal.utils import get_args_parser  # the command line @hydra.main reads, flags and overrides
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import BooleanNode, EnumNode, FloatNode, IntegerNode, ListConfig, OmegaConf, UnionNode
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigIndexError,
    ConfigKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from runtime.ranks import leave_it_to_local_rank_zero, said_once_per_machine
from user_error import UserError, as_typed


@contextmanager
def exit_on_user_error(full_errors_asked: bool = False, writes: bool = True) -> Iterator[None]:
    """Wraps a command's work: a UserError, or a config Hydra or OmegaConf refused, prints
    "error: <message>" and exits 2; Ctrl-C exits 130, saying that the files saved are whole
    (or, for a command that writes none, writes=False, that nothing was written); a reader of the
    output that left (`sample.py | head`) ends it quietly, exit 1. full_errors_asked
    (HYDRA_FULL_ERROR=1): Hydra's and OmegaConf's own errors go on with their tracebacks."""
    try:
        yield
        sys.stdout.flush()  # here, not at the exit, where a pipe's reader that left would be a traceback
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        sys.exit(1)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:
        if full_errors_asked:
            raise
        leave_it_to_local_rank_zero(config_error_line(err))  # every process read the same config
        print(f"error: {config_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except OSError as err:  # a path given (hydra.run.dir, data.cache_dir, ...) that the command cannot make or use
        if err.filename is None and err.errno in (errno.ENOSPC, errno.EDQUOT) and not full_errors_asked:
            # `sample.py > out.txt` on a full disk, or a file the command writes there (a token cache): which
            # one, the error does not say. What the output still holds goes out if it can, then nowhere.
            with suppress(OSError):
                sys.stdout.flush()
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            line = (f"writing failed: {err.strerror} (the output, or a file the command writes); free some space, or "
                    "send the output elsewhere, and run it again")
            leave_it_to_local_rank_zero(line)
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(2)
        if err.filename is None or full_errors_asked:
            raise
        print(f"error: {path_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop's own handling
        said = "files already saved are whole" if writes else "nothing was written"
        print(f"stopped: interrupted ({said})", file=sys.stderr, flush=True)
        sys.exit(130)


def compile_failure(error: BaseException) -> str | None:
    """The first line of what torch.compile said, if error is its failure to build (Inductor's
    C++ compiler refused, say); None for any other error. torch._dynamo is looked up, not imported:
    only a compile loads it, and an error of a run that compiled nothing is said without its second
    of import."""
    dynamo_errors = sys.modules.get("torch._dynamo.exc")
    if dynamo_errors is None or not isinstance(error, dynamo_errors.BackendCompilerFailed):
        return None
    return str(error).strip().splitlines()[0]


def path_error_line(err: OSError) -> str:
    """One line for a file or folder the command could not make, read or write."""
    if isinstance(err.filename, bytes):  # as TensorBoard's file writer names it
        err.filename = os.fsdecode(err.filename)
    if isinstance(err, FileExistsError | NotADirectoryError):
        return f"{err.filename} cannot be made a folder: a file is in the way; give another path"
    if isinstance(err, PermissionError):
        return f"{err.filename}: permission denied; give a path this user may use, or change its permissions"  # read or write
    return f"{err.filename}: {err.strerror or err}; give another path"


CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # the scripts' config folder

# The command-line flags Hydra itself reads (besides key=value overrides).
HYDRA_FLAGS = {
    "--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--run", "-r",
    "--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn",
    "--config-dir", "-cd", "--info", "-i",
}
# Flags that only change what another flag does: with neither of those, Hydra stops with a traceback
# (--resolve) or ignores them and trains (--package).
NEEDS_FLAG = {"--resolve": ("--cfg", "--help"), "--package": ("--cfg",)}
SHORT_FLAGS = {"-h": "--help", "-c": "--cfg", "-p": "--package", "-sc": "--shell-completion"}
SHELL_COMPLETION_ACTIONS = ("install", "uninstall", "query")


def run_cli(hydra_main: Callable[[], object]) -> None:
    """Runs a @hydra.main function inside exit_on_user_error, with Hydra raising its own
    complaints (a misspelt key, an unknown option, an override it cannot parse) to be worded
    as one line too, instead of printing its several. The function wraps its own work in
    exit_on_user_error as well: an error Hydra catches from a job, it reports in lines of its own."""
    asked = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises every error, the job's own ones too
    try:
        with exit_on_user_error(full_errors_asked=asked == "1"):
            sys.argv[1:] = overrides_together(sys.argv[1:])
            with said_once_per_machine():
                check_flags(sys.argv[1:])
                check_keys_under_values(sys.argv[1:])
                check_sweeps(sys.argv[1:])
            hydra_main()
    finally:  # as it was, for whatever runs next in this process
        if asked is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = asked


def overrides_together(args: list[str]) -> list[str]:
    """args with the key=value arguments after the flags, in their own order, where flags split them
    (`model.n_layer=2 -m model.n_head=1,2`): Hydra's argparse takes them in one run only, and would
    answer the second, or a flag's value it refuses (--cfg nope), with its usage text."""
    parser = get_args_parser()
    parser.exit_on_error = False  # raise, rather than print the usage text and exit
    try:
        if not parser.parse_known_args(args)[1]:
            return args  # together already
        overrides = parser.parse_known_intermixed_args(args)[0].overrides
    except argparse.ArgumentError as err:  # "argument --cfg/-c: invalid choice: 'nope' (choose from ...)"
        raise UserError(str(err)) from None
    flags = list(args)
    for override in overrides:
        flags.remove(override)
    return flags + overrides


# Hydra's modes: one at a time (it would stop with a traceback).
MODE_FLAGS = {"--multirun": "-m", "--cfg": "-c", "--info": "-i", "--run": "-r", "--shell-completion": "-sc"}


def check_flags(args: list[str]) -> None:
    """Refuses what Hydra would answer with argparse's usage text or a message about its internals."""
    long_name = {short: long for long, short in MODE_FLAGS.items()} | {long: long for long in MODE_FLAGS}
    modes = sorted({long_name[flag] for arg in args if (flag := arg.split("=", 1)[0]) in long_name})
    if len(modes) > 1:
        raise UserError(f"{' and '.join(modes)} together: give one of {', '.join(MODE_FLAGS)} at a time")
    flags = {SHORT_FLAGS.get(flag, flag) for arg in args if arg.startswith("-") and (flag := arg.split("=", 1)[0])}
    for flag, needs in NEEDS_FLAG.items():
        if flag in flags and not flags & set(needs):
            raise UserError(f"{flag} only works with {' or '.join(needs)}, e.g. `python {os.path.basename(sys.argv[0])} "
                            f"--cfg job {flag}{' <group>' if flag == '--package' else ''}`")
    if "--shell-completion" in flags and not any(arg.split("=", 1)[0] in SHELL_COMPLETION_ACTIONS for arg in args):
        raise UserError(f"--shell-completion needs what to do: {', '.join(a + '=bash' for a in SHELL_COMPLETION_ACTIONS)} "
                        f"(or zsh, fish), e.g. `python {os.path.basename(sys.argv[0])} --shell-completion install=bash`")
    for arg in args:
        if arg.startswith("-") and arg.split("=", 1)[0] not in HYDRA_FLAGS:
            raise UserError(f"{arg} is not a flag of this command; {options_hint()}")
        if arg.startswith("+") and not arg.lstrip("+").startswith("hydra"):  # ++ too: it would add a misspelt key
            raise UserError(f"{arg}: a + adds a key or a group the config lacks, and this command takes only the options "
                            f"it has; give {arg.lstrip('+')} without it ({options_hint()})")
    groups = command_groups()
    for arg in args:
        key = arg.split("=", 1)[0]
        group = key.removeprefix("~")
        if group not in groups:
            continue
        if key == group and not names_options(arg):
            none = f" (or leave out {group}=, for none)" if groups[group] else ""
            raise UserError(f"{arg}: {group} is a group of configs; give one of its options by name, one of: "
                            f"{', '.join(group_options(group))}{none}")
        if key != group and not groups[group]:  # ~experiment is no preset, as without it
            raise UserError(f"~{group}: ~ removes the {group} group, which a run needs; give {group}=<option> instead, "
                            f"one of: {', '.join(group_options(group))}")


def names_options(arg: str) -> bool:
    """Whether group=value gives options by name: one, or a sweep's (a,b, choice(a,b), glob(*)); not a
    number, a list, null or nothing, at which Hydra stops with a traceback (model=1, data=null)."""
    try:
        value = OverridesParser.create().parse_override(arg).value()
    except HydraException:
        return True  # not Hydra's syntax: Hydra says so, in config_error_line's words
    if isinstance(value, Glob):
        return True
    names = value.list if isinstance(value, ChoiceSweep) else [value]
    return all(isinstance(name, str) and name for name in names)


def command_groups() -> dict[str, bool]:
    """The config groups this command's primary config (configs/<script>.yaml) chooses from, each with
    whether it may be null (experiment: no preset). Hydra stops with a traceback at a value that is
    no option's name, such as model=1 or data=null."""
    primary = CONFIGS / f"{Path(sys.argv[0]).stem}.yaml"
    defaults = OmegaConf.load(primary).get("defaults", []) if primary.is_file() else []
    return {group: option is None for entry in defaults if not isinstance(entry, str)
            for group, option in entry.items() if not group.startswith("override ")}


def group_options(group: str) -> list[str]:
    """The options of a config group: the names of configs/<group>/*.yaml."""
    return [path.stem for path in sorted((CONFIGS / group).glob("*.yaml"))]


def options_hint() -> str:
    return f"`python {os.path.basename(sys.argv[0])} --help` lists every option"


def config_error_line(err: Exception) -> str:
    """One line for an error Hydra or OmegaConf raised while building or reading the config."""
    inner = err
    while inner is not None:  # a UserError raised by a resolver, e.g. for a resume= that does not exist
        if isinstance(inner, UserError):
            return str(inner)
        inner = inner.__cause__ or inner.__context__
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    full_key = getattr(cause, "full_key", None)
    if full_key and isinstance(cause, ConfigAttributeError | ConfigKeyError):  # a key no schema has
        if owners := group_options_with(full_key):  # tokenizer.vocab_size with tokenizer=char
            # With resume=, the group chosen here is the default's: the run's own is read later.
            resuming = any(arg.startswith("resume=") for arg in sys.argv[1:])
            also = f" (with resume=, give the run's group as well, e.g. {owners[0]})" if resuming else ""
            return (f"{full_key} is not an option of the {full_key.split('.')[0]} chosen; "
                    f"{' and '.join(owners)} {'has' if len(owners) == 1 else 'have'} it{also}")
        return f"{full_key} is not an option; check its spelling ({options_hint()})"
    if isinstance(cause, ValidationError) and (refused := refused_value_line(cause)):
        return refused
    if isinstance(cause, ConfigIndexError) and isinstance(cause.parent_node, ListConfig) and full_key:  # optim.betas.5=0.9
        n, key = len(cause.parent_node), full_key.rsplit("[", 1)[0]
        indices = f"give an index from 0 to {n - 1} ({key}.0=a), or" if n else "give"
        return f"{key}.{cause.key}: {key} holds {n} item{'s' if n != 1 else ''}; {indices} the whole list ({key}=[a,b])"
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, option = (err.missing_cfg_file or "").rpartition("/")
        return f"{group}={option} is not an option of {group}; choose one of: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):  # the shell split a value, or Hydra's syntax claimed a character
        return unread_argument_line(err)
    if str(err).startswith("Ambiguous value for argument"):  # key=a,b: Hydra reads the comma as a sweep
        first_line = str(err).splitlines()[0]  # Ambiguous value for argument '<argument>'
        argument = first_line.removeprefix("Ambiguous value for argument '").removesuffix("'")
        key = argument.split("=", 1)[0].lstrip("+~")
        kind = value_kind(key)
        other_way = {"list": f", or write a list in brackets ('{key}=[a,b]')", "plain": "",
                     "text": f", or quote the value to keep it whole ('{key}=\"a, b\"')"}[kind]
        return f"{argument}: a comma here means a sweep; add -m for one run per value{other_way}"
    said = str(cause)
    if full_key and (converted := re.search(r"Cannot convert '(list|dict)' to string", said)):  # prompt=[a]
        marks, example = ("[ ]", "[a]") if converted[1] == "list" else ("{ }", "{a}")
        return (f"{full_key}: {marks} make a {converted[1]} of a value; to keep them as text, quote the value inside "
                f"the shell's quotes, e.g. '{full_key}=\"{example}\"'")
    if full_key and isinstance(cause, InterpolationResolutionError) and value_kind(full_key) == "text":  # prompt=${x}
        return (f"{full_key}: {said.splitlines()[0]}; a value's ${{...}} names another key, and \\${{ keeps it as text, "
                f"e.g. '{full_key}=\\${{x}}'")
    if full_key and "does not support deletion" in said:  # ~model.n_layer
        return f"~{full_key}: ~ removes a key, and every option here keeps a value; set it instead ({full_key}=<value>)"
    if deleted := re.match(r"Could not delete from config\. '(.+)' does not exist", said):  # ~data.path: null, or no key
        key = deleted[1]
        return (f"~{key}: ~ removes a key, and none can be removed here: {key} is an option that holds null (leave "
                f"it out) or no option at all (check its spelling; {options_hint()})")
    lines = dict.fromkeys(str(e).strip().splitlines()[0] for e in (err, cause) if str(e).strip())
    where = f"{full_key}: " if full_key else ""
    return where + "; ".join(lines) + f" ({options_hint()})"


def unread_argument_line(err: OverrideParseException) -> str:
    """config_error_line's line for an argument Hydra's syntax could not read."""
    key, equals, value = err.override.partition("=")
    if equals and "~" in value and '"' not in value:  # a home folder: the shell leaves ~ after = as it is
        return (f"could not read the argument {err.override!r}: Hydra's syntax claims ~; quote the value inside the "
                f"shell's quotes, e.g. '{key}=\"{value}\"' (a path given so still starts at your home folder)")
    reason = (err.message.strip().splitlines() or [""])[0]
    shown = reason and not reason.startswith("LexerNoViableAltException")  # that one only repeats the argument
    reason = f" ({reason})" if shown else ""
    return (f"could not read the argument {err.override!r}{reason}: each argument is key=value, and a value with spaces, "
            f"non-ASCII letters or any of : , = ' \" [ ] {{ }} ( ) needs quotes inside the shell's, e.g. 'prompt=\"Once upon a time, a\"'")


def value_kind(full_key: str) -> str:
    """What a value of full_key is, by its type in the schemas this process stored (schema_types):
    "list", "plain" (a number, true or false, one of a key's choices) or "text" (a prompt, a path,
    and any key no schema here has)."""
    for annotation in schema_types(full_key):
        return leaf_kind(annotation) or "text"
    return "text"


def leaf_kind(annotation: Any) -> str | None:
    """"list", "plain" or "text" for a type that holds one value; None for a dataclass, a group of
    options, and for Any (data and tokenizer, whose options each have a schema of their own)."""
    if is_dataclass(annotation) or annotation is Any:
        return None
    union = get_origin(annotation) in (Union, UnionType)
    types = [t for t in (get_args(annotation) if union else (annotation,)) if t is not type(None)]  # None aside
    if any(get_origin(t) is list or t is list for t in types):
        return "list"
    if all(t in (int, float, bool) or isinstance(t, type) and issubclass(t, Enum) for t in types):
        return "plain"
    return "text"


def schema_types(full_key: str) -> Iterator[Any]:
    """full_key's type in the running command's schema, stored in Hydra's ConfigStore (train.py's
    cli/schema.py, sample.py's and export.py's cli/checkpoint_commands.py): for a key of data or
    tokenizer, in the schema of the option chosen on the command line (data=text), or of each option."""
    group, _, rest = full_key.partition(".")
    stored = ConfigStore.instance().list("")
    command = f"{Path(sys.argv[0]).stem}_schema.yaml"
    places = [(command, full_key)]
    if command == "train_schema.yaml" and rest:
        chosen = [arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith(f"{group}=")][-1:]
        places += [(name, rest) for name in stored
                   if name in [f"{group}_{option}_schema.yaml" for option in chosen]
                   or not chosen and name.startswith(f"{group}_") and name.endswith("_schema.yaml")]
    for name, key in places:
        if name not in stored:
            continue
        annotation: Any = stored_schema(name)
        for part in key.split("."):
            hints = get_type_hints(annotation) if is_dataclass(annotation) else {}
            annotation = hints.get(part)
        if annotation is not None:
            yield annotation


@functools.cache
def stored_schema(name: str) -> Any:
    """The dataclass of a schema stored in Hydra's ConfigStore, once per process: a load copies
    the whole config (some milliseconds, for each key of each override)."""
    return OmegaConf.get_type(ConfigStore.instance().load(name).node)


def check_keys_under_values(args: list[str]) -> None:
    """Refuses key.part=value where key holds one value rather than options (model.n_head.x=1,
    prompt.x=a), or a list and part is no index (optim.betas.x=1): OmegaConf answers the first with
    a line about braces nobody typed, and stops at the last with a traceback."""
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if arg.startswith("-") or "=" not in arg or key.startswith("hydra."):
            continue
        parts = key.split(".")
        for end in range(1, len(parts)):
            above, below = ".".join(parts[:end]), parts[end:]
            annotations = list(schema_types(above))
            kinds = [leaf_kind(annotation) for annotation in annotations]
            if annotations and all(annotation is Any for annotation in annotations):  # train.keep_checkpoints: [] or log
                kinds = [configured_kind(above)]
            if not kinds or None in kinds:  # no such key (Hydra names it), or a group of options
                continue
            if kinds[0] == "list" and len(below) == 1 and below[0].isdigit():
                break  # optim.betas.0=0.95: one item of the list, by its index
            if kinds[0] == "list":
                raise UserError(f"{arg}: {above} is a list, with no options under it; give the whole list "
                                f"({above}=[a,b]) or one item by its index ({above}.0=a)")
            raise UserError(f"{arg}: {above} holds one value, with no options under it; give {above}=<value> "
                            f"({options_hint()})")


def check_sweeps(args: list[str]) -> None:
    """Refuses a sweep that Hydra cannot make (range() with a step of 0: its traceback; an empty
    choice(): its quoting hint) or that gives no value (range(5,1), a glob() that matches no option,
    a glob() of a key that is no config group: no job, and exit 0 as if the sweep had run)."""
    parser = OverridesParser.create()
    for arg in args:
        key, equals, text = arg.partition("=")
        if arg.startswith("-") or not equals or not any(word in text for word in ("range(", "glob(", "choice(")):
            continue
        if re.fullmatch(r"\s*choice\(\s*\)\s*", text):
            raise UserError(f"{arg}: choice() gives no value, so no run would start; list the values, e.g. "
                            f"{key}=choice(a,b)")
        try:
            override = parser.parse_override(arg)
            value = override.value()
            if isinstance(value, Glob):
                check_glob(arg, override.get_key_element().lstrip("+~"), value)
                continue
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [value]
        except ValueError as error:  # range(1,5,0)
            raise UserError(f"{arg}: {error}; give range(start, stop, step) a step that is not 0") from None
        except HydraException:
            continue  # not Hydra's syntax: config_error_line says so
        if not values:
            raise UserError(f"{arg}: the sweep gives no value, so no run would start; give range(start, stop) with start "
                            "before stop (or a negative step)")


def check_glob(arg: str, key: str, glob: Glob) -> None:
    """glob() picks among the options of a config group by their names: Hydra makes no job of one
    that matches none, or of a key that holds a value."""
    groups = command_groups()
    if key not in groups:
        which = f" ({', '.join(groups)})" if groups else ", and this command has none"
        raise UserError(f"{arg}: glob() picks options of a config group by name{which}; {key} is no group, so no run "
                        f"would start: give the values themselves, e.g. {key}=a,b")
    if any(given.startswith("hydra.searchpath") for given in sys.argv[1:]):
        return  # options from elsewhere too: Hydra lists them as it sweeps
    config_dir = get_args_parser().parse_known_args(sys.argv[1:])[0].config_dir  # its files join the group
    added = [path.stem for path in (Path(config_dir) / key).glob("*.yaml")] if config_dir else []
    options = sorted({*group_options(key), *added})
    if not glob.filter(options):
        raise UserError(f"{arg}: the glob matches none of {key}'s options, so no run would start; {key}'s options are: "
                        f"{', '.join(options)}")


def configured_kind(full_key: str) -> str | None:
    """"list" where full_key holds a list in its group's config file (configs/train/default.yaml for
    train.keep_checkpoints, or the option given on the command line), for a key whose schema type is
    Any; None for anything else."""
    group, _, rest = full_key.partition(".")
    primary = CONFIGS / f"{Path(sys.argv[0]).stem}.yaml"
    if not rest or not primary.is_file():
        return None
    defaults = {name: chosen for entry in OmegaConf.load(primary).get("defaults", []) if not isinstance(entry, str)
                for name, chosen in entry.items()}
    option = [arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith(f"{group}=")][-1:] or [defaults.get(group)]
    path = CONFIGS / group / f"{option[0]}.yaml"
    if option[0] is None or not path.is_file():
        return None
    return "list" if isinstance(OmegaConf.select(OmegaConf.load(path), rest), ListConfig) else None


def group_options_with(full_key: str) -> list[str]:
    """The options of full_key's config group whose schema has its key ("tokenizer=bpe" for
    tokenizer.vocab_size); [] where its first part is no group with options of their own."""
    group, _, rest = full_key.partition(".")
    if not rest or group not in ("data", "tokenizer"):
        return []  # (sample.py's and export.py's configs have no groups: a key there has no rest)
    # train.py's schemas, imported here alone: sample.py and export.py share this module and
    # import no training code (tests/test_package_boundaries.py).
    from cli.schema import DATA_SCHEMAS, TOKENIZER_SCHEMAS

    option_schemas = {"data": DATA_SCHEMAS, "tokenizer": TOKENIZER_SCHEMAS}[group]  # the groups whose options differ in keys
    return [f"{group}={option}" for option, schema in option_schemas.items()
            if rest in {field.name for field in fields(schema)} and (CONFIGS / group / f"{option}.yaml").is_file()]


# What a value must be, by the kind of node OmegaConf refused it for while Hydra composed the
# config (the key's type in cli/schema.py; a Union there is int | float). Written against
# omegaconf 2.3 and hydra-core 1.3: tests/test_config.py pins the versions it was checked with.
MUST_BE = {IntegerNode: "a whole number", FloatNode: "a number", UnionNode: "a number", BooleanNode: "true or false",
           ListConfig: "a list"}


def configured_value(key: str, node: Any) -> str:
    """' (the config has optim.lr=0.003)': what the refused key held as composed so far, the form
    to copy; '' where it held null. The node is the one the override failed to change."""
    held = OmegaConf.to_container(node) if isinstance(node, ListConfig) else node._value()
    return "" if held is None else f" (the config has {key}={as_typed(held)})"


def refused_value_line(refusal: ValidationError) -> str | None:
    """'train.max_steps=abc must be a whole number (the config has train.max_steps=800)' for a
    value its key's type refused; None for another ValidationError."""
    node, key, value = refusal.child_node, refusal.full_key, refusal.value
    shown = as_typed(value)  # null, true and false as they were typed, not Python's None, True and False
    if isinstance(node, EnumNode):  # a cli.schema.Choice, or one of Hydra's own (hydra.mode=...)
        enum = node.enum_type
        if hasattr(enum, "refusal"):
            return enum.refusal(key, shown)
        return f"{key}={shown} must be one of {', '.join(enum.__members__)}"
    must_be = MUST_BE.get(type(node))
    if must_be:
        return f"{key}={shown} must be {must_be}{configured_value(key, node)}"
    if "is not Optional" in str(refusal):  # null given to a key that has no null
        return f"{key}=null: {key} cannot be null; give it a value ({options_hint()})"
    return None
