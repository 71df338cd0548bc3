"""What a script's own command line takes, read from its source and never run.

perfrun reads its options after the script as well as before it, except an
option the script defines itself, which stays the script's (cli.py). To know
that before the script starts, this module reads the script's source with
`ast`: the option strings its argparse parsers and click commands define.
Nothing is imported or run: the script may need a GPU, a data set or an
hour, and importing it could start the training. The files beside the
script that it imports are read too (training repositories often keep the
parser in `options.py` or `utils/args.py`), up to MAX_FILES.

A reading is only as good as the source is plain, so it also says when the
names it found may not be all the script reads (`ScriptOptions.unsure`): the
script reads `sys.argv` itself, keeps options it does not define
(`parse_known_args`), builds option names at run time, hands its parser to
a library that adds options (DeepSpeed's `add_config_arguments`), or parses
its command line with a framework whose options come from functions,
dataclasses or config files (fire, Hydra, HfArgumentParser, ...). perfrun
then still takes its own options, and says so, since the script might have
wanted them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

#: The most files of the script's own code read for one script: beyond it
#: the script is `unsure` (a whole repository imported is no longer a script
#: whose options one can list).
MAX_FILES = 64
#: A source file larger than this is not read (nobody writes an argument
#: parser into 4 MB of Python; a generated file may be that large).
MAX_FILE_BYTES = 4 << 20

#: Command-line frameworks whose options are made from function signatures,
#: dataclasses, class attributes or config files, which a reading of the
#: source cannot list. A script that imports one is `unsure`.
FRAMEWORK_MODULES = frozenset({
    "absl", "argh", "clize", "configargparse", "cyclopts", "defopt", "docopt", "fire",
    "hydra", "jsonargparse", "plac", "simple_parsing", "tap", "typer", "tyro",
})
#: The same, where the framework is one name in a larger library
#: (transformers' HfArgumentParser, Lightning's LightningCLI, OmegaConf's
#: from_cli).
FRAMEWORK_NAMES = frozenset({"HfArgumentParser", "LightningCLI", "from_cli"})
#: Values that make an argument take whatever follows it, options included.
TAKE_ANYTHING = {"UNPROCESSED": "click.UNPROCESSED", "REMAINDER": "argparse.REMAINDER"}
#: click's option makers, and the names each adds when given none.
CLICK_MAKERS = {
    "option": (),
    "argument": (),
    "command": ("--help",),
    "group": ("--help",),
    "help_option": ("--help",),
    "version_option": ("--version",),
    "password_option": ("--password",),
    "confirmation_option": ("--yes",),
}
#: argparse methods whose receiver is a parser (or a group of one).
PARSER_METHODS = frozenset({
    "add_argument", "add_argument_group", "add_mutually_exclusive_group", "add_subparsers",
    "parse_args", "parse_intermixed_args", "set_defaults",
})
#: What makes a parser: a variable assigned one of these is a parser.
PARSER_MAKERS = frozenset({"ArgumentParser", "add_parser", "add_argument_group",
                           "add_mutually_exclusive_group"})
#: Calls that take a parser and add nothing to it.
HARMLESS_CALLS = frozenset({"print", "vars", "isinstance", "type", "id", "repr", "str",
                            "getattr", "hasattr", "len"})
#: Keys of click's context_settings that let a command take options it does
#: not define, to hand them on.
PASS_ON_SETTINGS = frozenset({"ignore_unknown_options", "allow_extra_args"})


@dataclass(frozen=True)
class ScriptOptions:
    """The options a script defines, as read from its source."""

    #: Every option string its parsers define, e.g. "--scheduler", "-o",
    #: "--help" (argparse and click add help themselves).
    names: frozenset[str] = frozenset()
    #: Whether an argparse parser of the script takes a unique prefix of a
    #: long option for the option (argparse's allow_abbrev, on by default).
    abbreviates: bool = False
    #: Why `names` may not be all the script reads from its command line, as
    #: a phrase after the script's name ("reads sys.argv itself"); "" when
    #: they are.
    unsure: str = ""

    def defines(self, name: str) -> bool:
        return name in self.names

    def expansions(self, name: str) -> tuple[str, ...]:
        """The script's long options that `name` abbreviates, where its
        parser takes abbreviations: argparse would give it those (one) or
        refuse it as ambiguous (several), so the script may have meant it."""
        if not self.abbreviates or not name.startswith("--") or name in self.names:
            return ()
        return tuple(sorted(n for n in self.names if n.startswith(name) and n.startswith("--")))


#: What is known of a script that takes no options at all (or does not
#: exist: python will say so, and nothing after it needs sorting out).
NOTHING = ScriptOptions()


def unsure(reason: str) -> ScriptOptions:
    return ScriptOptions(unsure=reason)


# -- one file ----------------------------------------------------------------------


@dataclass
class SourceFacts:
    """What one source file says about the command line."""

    names: set[str] = field(default_factory=set)
    abbreviates: bool = False
    #: Reasons the names may be incomplete, in the order met.
    unsure: list[str] = field(default_factory=list)
    #: (level, module, names imported from it): where to look next.
    imports: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    #: Functions and classes defined here: a parser handed to one of them is
    #: read here or in another file read, so it is not handed away.
    defined: set[str] = field(default_factory=set)
    #: (callee's name, callee as written, the variable names it was given).
    calls: list[tuple[str, str, frozenset[str]]] = field(default_factory=list)
    #: Variables that hold a parser.
    parsers: set[str] = field(default_factory=set)


def _callee_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_false(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _is_true(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)
                and isinstance(e.value, str)]
    return []


def _is_option_string(text: str) -> bool:
    # argparse and click options start with a prefix character; a
    # positional's name is an identifier.
    return len(text) > 1 and text[0] in "-+" and not text[1:].isdigit()


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.facts = SourceFacts()
        self.click_modules: set[str] = set()
        self.click_names: dict[str, str] = {}
        self.sys_modules: set[str] = set()
        self.argv_names: set[str] = set()
        #: sys.argv nodes that only read the program's name, or hand the
        #: arguments to the parser as parse_args() would read them itself.
        self.harmless_argv: set[int] = set()

    def unsure(self, reason: str) -> None:
        if reason not in self.facts.unsure:
            self.facts.unsure.append(reason)

    # imports

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in FRAMEWORK_MODULES:
                self.unsure(f"parses its command line with {top}")
            if alias.name == "click":
                self.click_modules.add(alias.asname or "click")
            if alias.name == "sys":
                self.sys_modules.add(alias.asname or "sys")
            self.facts.imports.append((0, alias.name, ()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] in FRAMEWORK_MODULES:
            self.unsure(f"parses its command line with {module.split('.')[0]}")
        for alias in node.names:
            local = alias.asname or alias.name
            if alias.name in FRAMEWORK_NAMES:
                self.unsure(f"parses its command line with {alias.name}")
            if node.level == 0 and module == "click":
                self.click_names[local] = alias.name
            if node.level == 0 and module == "sys" and alias.name == "argv":
                self.argv_names.add(local)
        self.facts.imports.append((node.level, module, tuple(a.name for a in node.names)))

    # definitions

    def visit_FunctionDef(self, node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> None:
        self.facts.defined.add(node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.facts.defined.add(node.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _callee_name(node.value.func) in PARSER_MAKERS:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.facts.parsers.add(target.id)
        self.generic_visit(node)

    # sys.argv

    def _is_argv(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return (node.attr == "argv" and isinstance(node.value, ast.Name)
                    and node.value.id in self.sys_modules)
        return isinstance(node, ast.Name) and node.id in self.argv_names

    def visit_Subscript(self, node: ast.Subscript) -> None:
        index = node.slice
        if self._is_argv(node.value) and isinstance(index, ast.Constant) and index.value == 0:
            self.harmless_argv.add(id(node.value))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_argv(node) and id(node) not in self.harmless_argv:
            self.unsure("reads sys.argv itself")
        self._name_use(node.attr)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.argv_names and id(node) not in self.harmless_argv:
            self.unsure("reads sys.argv itself")
        self._name_use(node.id)

    def _name_use(self, name: str) -> None:
        if name in TAKE_ANYTHING:
            self.unsure(f"takes any arguments ({TAKE_ANYTHING[name]})")
        elif name in FRAMEWORK_NAMES:
            self.unsure(f"parses its command line with {name}")

    # dicts of click's context_settings, wherever they are written

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant):
                self._setting(key.value, value)
        self.generic_visit(node)

    def _setting(self, key: object, value: ast.expr) -> None:
        if key == "help_option_names":
            self.facts.names.update(_strings(value))
        elif key in PASS_ON_SETTINGS and _is_true(value):
            self.unsure("passes on options it does not define")

    # calls

    def _click_maker(self, func: ast.expr) -> Optional[str]:
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id in self.click_modules and func.attr in CLICK_MAKERS):
            return func.attr
        if isinstance(func, ast.Name) and self.click_names.get(func.id) in CLICK_MAKERS:
            return self.click_names[func.id]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        name = _callee_name(node.func)
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        for key, value in keywords.items():
            self._setting(key, value)
        if name in PARSER_METHODS and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            self.facts.parsers.add(node.func.value.id)
        if name == "add_argument" and isinstance(node.func, ast.Attribute):
            self._declared(node.args)
        elif name in ("ArgumentParser", "add_parser"):
            prefix = keywords.get("prefix_chars")
            if prefix is not None and not (isinstance(prefix, ast.Constant)
                                           and "-" in str(prefix.value)):
                self.unsure("uses option prefixes other than -")
            if not _is_false(keywords.get("add_help")):
                self.facts.names.update(("-h", "--help"))
            if not _is_false(keywords.get("allow_abbrev")):
                self.facts.abbreviates = True
        elif name in ("parse_known_args", "parse_known_intermixed_args"):
            self.unsure(f"keeps the options it does not define ({name})")
        elif name in ("parse_args", "parse_intermixed_args"):
            given = node.args[:1] or [v for k, v in keywords.items() if k == "args"]
            for arg in given:
                if (isinstance(arg, ast.Subscript) and self._is_argv(arg.value)
                        and isinstance(arg.slice, ast.Slice) and arg.slice.upper is None
                        and arg.slice.step is None and isinstance(arg.slice.lower, ast.Constant)
                        and arg.slice.lower.value == 1):
                    self.harmless_argv.add(id(arg.value))
        maker = self._click_maker(node.func)
        if maker is not None:
            given_names = self._declared(node.args, click=True, strict=maker == "option")
            if not given_names:
                self.facts.names.update(CLICK_MAKERS[maker])
        given = frozenset(
            a.id for a in [*node.args, *keywords.values()] if isinstance(a, ast.Name)
        )
        if given and name and name not in HARMLESS_CALLS:
            self.facts.calls.append((name, ast.unparse(node.func), given))
        self.generic_visit(node)

    def _declared(self, args: Sequence[ast.expr], click: bool = False,
                  strict: bool = True) -> list[str]:
        """The option strings among a maker's positional arguments. Where
        they name options (argparse's add_argument, click's option), one
        that is not a plain string is only known when the script runs."""
        found = []
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                # click: "--shout/--no-shout" declares both spellings.
                for part in arg.value.split("/") if click else [arg.value]:
                    if _is_option_string(part.strip()):
                        found.append(part.strip())
            elif strict:
                self.unsure("builds option names at run time")
        self.facts.names.update(found)
        return found


def read_source(source: Union[str, bytes], filename: str = "<script>") -> SourceFacts:
    """What one file's source says about the command line. Raises
    SyntaxError (or ValueError, for a null byte) where python could not
    compile it either."""
    tree = ast.parse(source, filename=filename)
    reader = _Reader()
    reader.visit(tree)
    return reader.facts


# -- a script and the files it imports --------------------------------------------


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(root == path or root in path.parents for root in roots)


def _module_files(base: Path, parts: Sequence[str]) -> Iterator[Path]:
    """The files `import a.b.c` runs from `base`: each package's __init__ on
    the way, then the module (a file, or a package's __init__)."""
    here = base
    for i, part in enumerate(parts):
        here = here / part
        if i == len(parts) - 1 and here.with_suffix(".py").is_file():
            yield here.with_suffix(".py")
        elif (here / "__init__.py").is_file():
            yield here / "__init__.py"
        else:
            return


def _imported_files(path: Path, level: int, module: str, names: tuple[str, ...],
                    roots: Sequence[Path]) -> Iterator[Path]:
    parts = [p for p in module.split(".") if p]
    if level:
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
        bases = [base] if _within(base, roots) else []
    else:
        bases = list(roots)
    for base in bases:
        found = list(_module_files(base, parts))
        if parts and not found:
            continue
        yield from found
        # `from pkg import sub`: sub may be a module of the package.
        for name in names:
            yield from _module_files(base, [*parts, name]) if name != "*" else ()
        return


def read_files(main: Path, roots: Sequence[Path]) -> ScriptOptions:
    """Read `main` and, transitively, the files under `roots` it imports."""
    names: set[str] = set()
    abbreviates = False
    reasons: list[str] = []
    defined: set[str] = set()
    calls: list[tuple[str, str, frozenset[str]]] = []
    parsers: set[str] = set()
    todo, seen = [main], set()
    while todo:
        path = todo.pop(0)
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > MAX_FILES:
            return unsure(f"imports more of its own code than perfrun reads ({MAX_FILES} files)")
        which = "" if path == main else f"{path.name}: "
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                return unsure(f"is too large to read ({which}over {MAX_FILE_BYTES >> 20} MB)")
            facts = read_source(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return unsure(f"could not be read ({which}{type(exc).__name__})")
        names |= facts.names
        abbreviates = abbreviates or facts.abbreviates
        reasons.extend(r for r in facts.unsure if r not in reasons)
        defined |= facts.defined
        calls.extend(facts.calls)
        parsers |= facts.parsers
        for level, module, imported in facts.imports:
            todo.extend(_imported_files(path, level, module, imported, roots))
    for name, written, given in calls:
        held = {g for g in given if g in parsers or g.endswith("parser")}
        if held and name not in defined and name not in PARSER_MAKERS | PARSER_METHODS:
            reasons.append(f"hands its parser to {written}")
            break
    return ScriptOptions(frozenset(names), abbreviates, reasons[0] if reasons else "")


def read_script(script: str, cwd: Optional[Path] = None) -> ScriptOptions:
    """The options of `python SCRIPT` (a file, or a folder with a
    __main__.py); NOTHING where there is no such script, which python
    refuses before any argument matters."""
    if script == "-":
        return unsure("is read from standard input")
    try:
        path = Path(cwd or ".") / script
        if path.is_dir():
            path, root = path / "__main__.py", path
        else:
            root = path.parent
        if not path.exists():
            return NOTHING
        if not path.is_file():
            return unsure("is not a Python source file")
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                return unsure("is a zip archive")
        return read_files(path, [root.resolve()])
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        return unsure(f"could not be read ({type(exc).__name__})")


def read_module(module: str, search: Sequence[str], cwd: Optional[Path] = None) -> ScriptOptions:
    """The options of `python -m MODULE`, looked up as python would on
    `search` (its sys.path: the current folder first), without importing a
    package on the way."""
    parts = module.split(".")
    try:
        for entry in search:
            base = Path(cwd or ".") / (entry or ".")
            if not base.is_dir():
                continue
            here = base.joinpath(*parts)
            for candidate in (here.with_suffix(".py"), here / "__main__.py"):
                if candidate.is_file():
                    return read_files(candidate, [base.resolve()])
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        return unsure(f"could not be read ({type(exc).__name__})")
    return unsure("has a source perfrun did not find")
