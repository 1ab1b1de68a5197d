"""Every command and code block in the README and the docs stays runnable or parseable.

Each fenced block names its language. YAML blocks parse, and every host spec among them
(or an inventory's `hotcache_caches`) passes the published JSON Schema and the spec
model; Python blocks compile; JSON blocks parse; shell blocks pass `bash -n`, and each
command in them names a program this project knows: `hotcache` commands (in blocks and
in inline code) name real subcommands and options, read from the same command tree
`hotcache --help` prints; scripts, playbooks, test paths and pip extras exist. Links
between the pages lead to files and headings that exist.
"""

from __future__ import annotations

import codecs
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import typer.main
import yaml

from hotcache.provision.cli.app import app
from hotcache.provision.engine.spec import _structural, json_schema

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "BENCHMARKS.md",
         ROOT / "ARCHITECTURE.md", ROOT / "tests" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"sh", "text", "yaml", "python", "json"}
# Programs a shell block may run without a check of its own: the system's and the
# cluster's tools, whose arguments are the user's.
PLAIN = {"cd", "apt-get", "kubectl", "docker", "sha256sum", "journalctl", "ansible-lint",
         "hostname", "tr", "lvrename", "sbatch", "exec"}
USER_FILES = {"train.py"}      # the user's own training script in the examples
CLI = typer.main.get_command(app)


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def code_blocks(page: Path) -> list[tuple[str, int, str]]:
    """(language, line number, code) of each fenced block, its indentation removed."""
    out, lines = [], page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2), i + 1
        i += 1
        body = []
        while not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        out.append((lang, start, "\n".join(body) + "\n"))
        i += 1
    return out


def all_blocks(language: str) -> list[tuple[str, str]]:
    return [(f"{rel(page)}:{line}", code) for page in PAGES
            for lang, line, code in code_blocks(page) if lang == language]


def test_every_block_names_a_known_language():
    found = [(f"{rel(page)}:{line}", lang) for page in PAGES
             for lang, line, _ in code_blocks(page)]
    assert len(found) > 50
    assert not [f for f in found if f[1] not in LANGUAGES], \
        f"give each block one of {sorted(LANGUAGES)}"


def host_specs(doc) -> list[dict]:
    """A host spec, or the caches of an Ansible inventory made into one."""
    if isinstance(doc, dict) and "caches" in doc:
        return [doc]
    if isinstance(doc, dict) and isinstance(doc.get("hotcache"), dict):
        hosts = doc["hotcache"].get("hosts") or {}
        return [{"version": 1, "caches": h["hotcache_caches"]} for h in hosts.values()
                if "hotcache_caches" in h]
    return []


def test_yaml_blocks_parse_and_their_specs_validate():
    checked = []
    for where, code in all_blocks("yaml"):
        for doc in yaml.safe_load_all(code):
            for spec in host_specs(doc):
                jsonschema.validate(spec, json_schema())
                _structural(spec, where)        # the spec model: exit 2 with YAML paths
                checked.append(where)
    # the README's tour, the spec reference, the Ansible inventory
    assert {w.split(":")[0] for w in checked} >= {
        "README.md", "docs/provisioning-and-specs.md", "docs/fleets-and-observability.md"}


def test_a_bad_spec_in_a_block_would_fail():
    """The check above is not vacuous: a mistyped key in a README spec is caught."""
    (where, code), = [(w, c) for w, c in all_blocks("yaml") if w.startswith("README.md")]
    spec = yaml.safe_load(code)
    spec["caches"][0]["filesystem"]["mountpont"] = "/mnt/x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, json_schema())


def test_python_blocks_compile():
    blocks = all_blocks("python")
    assert len(blocks) >= 4
    for where, code in blocks:
        compile(code, where, "exec")


def test_json_blocks_parse():
    for where, code in all_blocks("json"):
        json.loads(code)


def test_shell_blocks_parse():
    for where, code in all_blocks("sh"):
        proc = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, f"{where}: {proc.stderr}"


# --- commands ---------------------------------------------------------------------------

def commands(code: str) -> list[list[str]]:
    """Each simple command of a shell block as its words: lines joined at a trailing
    backslash, comments dropped, split at pipes, `&&`, `||` and `;`."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words: list[str] = []
        for word in lex:
            if word in ("|", "||", "&&", ";", "&"):
                out.append(words)
                words = []
            else:
                words.append(word)
        out.append(words)
    return [c for c in out if c]


def hotcache_problems(words: list[str]) -> list[str]:
    """What is wrong with `hotcache WORDS...`: a subcommand or an option that does not
    exist. Placeholders (NAME, SPEC, [--json], --fast|--full) are read as the docs
    write them."""
    command, problems, value_next = CLI, [], False
    tokens = [t for w in words for t in w.replace("\\|", "|").strip("[]").split("|") if t]
    for token in tokens:
        if value_next:              # the value of the option before it
            value_next = False
        elif token.startswith("-"):
            name = token.split("=")[0].rstrip(".,")
            params = {o: p for p in command.params for o in (*p.opts, *p.secondary_opts)}
            if name not in {*params, "-h", "--help"}:
                problems.append(f"`{command.name}` has no option {name}")
            elif name in params and "=" not in token:
                option = params[name]
                # typer's completion options take the shell's name as an optional value
                value_next = (not getattr(option, "is_flag", True) and not option.count
                              or name in ("--install-completion", "--show-completion"))
        elif hasattr(command, "commands"):
            sub = command.commands.get(token)
            if sub is None:
                problems.append(f"`{command.name}` has no subcommand {token}")
                break
            command = sub
    return problems


def script_problems(path: Path, options: list[str]) -> list[str]:
    if not path.is_file():
        return [f"{rel(path) if path.is_relative_to(ROOT) else path} does not exist"]
    source = path.read_text()
    return [f"{rel(path)} has no option {o}" for o in options
            if not re.search(rf"['\"]{re.escape(o)}['\"]", source)]


def python_problems(words: list[str], cwd: Path) -> list[str]:
    args = words[1:]
    options = [a.split("=")[0] for a in args if a.startswith("--")]
    if args[:2] == ["-m", "pytest"]:
        paths = [a for i, a in enumerate(args[2:], 2)
                 if not a.startswith("-") and args[i - 1] != "-k"]
        return [f"pytest path {p} matches nothing" for p in paths
                if not list(ROOT.glob(p.split("::")[0]))]
    if args[:1] == ["-m"]:
        spec = importlib.util.find_spec(args[1])
        if spec is None:
            return [f"no module {args[1]}"]
        return script_problems(Path(spec.origin), options)
    if args[:1] == ["-c"]:      # the code compiles; bash's $'...' arrives as $ and escapes
        code = args[1]
        if code.startswith("$"):
            code = codecs.decode(code[1:], "unicode_escape")
        try:
            compile(code, "-c", "exec")
        except SyntaxError as e:
            return [f"python -c code does not compile: {e}"]
        return []
    if args and args[0] in USER_FILES:
        return []
    return script_problems(cwd / args[0], options)


def command_problems(words: list[str], cwd: Path) -> tuple[list[str], Path]:
    while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in ("sudo", "time")):
        words = words[1:]
    if not words:
        return [], cwd
    program = words[0]
    if program == "cd":
        target = cwd / words[1] if len(words) > 1 else cwd
        return [], target if target.is_dir() and target.is_relative_to(ROOT) else cwd
    if program == "hotcache":
        return hotcache_problems(words[1:]), cwd
    if Path(program).name in ("python", "python3"):
        return python_problems(words, cwd), cwd
    if program == "bash":
        script = cwd / words[1]
        options = [w for w in words[2:] if w.startswith("--")]
        if not script.is_file():
            return [f"{words[1]} does not exist"], cwd
        return [f"{words[1]} has no option {o}" for o in options
                if o not in script.read_text()], cwd
    if program == "pip":        # extras exist; a wheel named carries pyproject's version
        pyproject = (ROOT / "pyproject.toml").read_text()
        extras = set(re.findall(r'^(\w+) = \[', pyproject, re.M))
        version = re.search(r'^version = "(.+)"', pyproject, re.M).group(1)
        return [f"no extra [{e}]" for w in words[2:] for e in re.findall(
                    r"^(?:\S*/)?hotcache(?:-[\w.]+-py3-none-any\.whl)?\[([\w,]+)\]$", w)
                for e in e.split(",") if e not in extras] + [
                f"{w}: the wheel is hotcache-{version}" for w in words[2:]
                for v in re.findall(r"hotcache-([\w.]+)-py3-none-any\.whl", w) if v != version], cwd
    if program == "ansible-playbook":
        books = [w for i, w in enumerate(words[1:], 1) if w.endswith(".yml")
                 and words[i - 1] not in ("-i", "-e")]
        return [f"no playbook {b}" for b in books if not (cwd / b).is_file()], cwd
    if program == "promtool":
        return [f"no file {w}" for w in words[3:] if not (cwd / w).is_file()], cwd
    if Path(program).name in ("ruff", "mypy"):     # the folders `ruff check` is given exist
        paths = words[2:] if words[1:2] == ["check"] else []
        return [f"no folder {p}" for p in paths if not (cwd / p).is_dir()], cwd
    if program in PLAIN:
        return [], cwd
    return [f"unknown program {program!r}: check it here or add it to PLAIN"], cwd


def test_shell_commands_name_real_programs_subcommands_and_options():
    seen, problems = 0, []
    for where, code in all_blocks("sh"):
        cwd = ROOT
        for words in commands(code):
            found, cwd = command_problems(words, cwd)
            problems += [f"{where}: {' '.join(words)}: {p}" for p in found]
            seen += 1
    assert seen > 60
    assert not problems, "\n".join(problems)


def test_inline_hotcache_commands_name_real_subcommands_and_options():
    spans = [(rel(page), span) for page in PAGES
             for span in re.findall(r"`(hotcache [^`\n]+)`", page.read_text())]
    assert len(spans) > 50
    problems = [f"{where}: `{span}`: {p}" for where, span in spans
                for p in hotcache_problems(span.split()[1:])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("words, problem", [
    (["coppy", "a", "b"], "no subcommand coppy"),
    (["copy", "a", "b", "--verfy"], "no option --verfy"),
    (["kube", "label"], "no subcommand label"),
    (["teardown", "NAME", "[--cache-failed]", "[--json]", "[--wipes]"], "no option --wipes"),
])
def test_a_wrong_command_is_caught(words, problem):
    assert any(problem in p for p in hotcache_problems(words))


def test_a_missing_script_or_option_is_caught():
    assert command_problems(["bash", "examples/nodemo.sh"], ROOT)[0]
    assert command_problems([".venv/bin/python", "bench/bench_copy.py", "--repeet", "3"],
                            ROOT)[0]
    assert command_problems(["pip", "install", "hotcache[torhc]"], ROOT)[0]
    assert command_problems(["pip", "install", "./hotcache-0.1.0-py3-none-any.whl[torhc]"],
                            ROOT)[0]
    assert command_problems(["pip", "install", "./hotcache-0.0.9-py3-none-any.whl"], ROOT)[0]
    assert command_problems(["frobnicate"], ROOT)[0]


# --- links ------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_links_between_pages_lead_to_files_and_headings():
    problems, links = [], 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            links += 1
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{rel(page)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel(page)}: {target}: no such heading")
    assert links > 40
    assert not problems, "\n".join(problems)


# --- what the pages name ----------------------------------------------------------------

# The pages whose names of files, modules and variables must exist: BENCHMARKS.md quotes
# runs of the past, with the paths they had then.
NAMING = [p for p in PAGES if p.name != "BENCHMARKS.md"]
TOP = ("tests", "provision", "adapters", "docs", "bench", "examples", "playbooks", ".ci")
# A path from the repository's root (tests/unit/x.py, .ci/run, docs/cli.md), or the tail
# of one as ARCHITECTURE.md and docs/testing.md write them (hotcopy/format.py,
# guest/powercut.py, backends/parts/); `engine/apply.Env` names Env in engine/apply.py.
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.*-]*)")
MODULE = re.compile(r"\bhotcache\.(?:provision|adapters)(?:\.\w+)*")
VARIABLE = re.compile(r"\bHOTCACHE_[A-Z0-9_]*[A-Z0-9]\b")
FILE_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".json", ".txt", ".j2",
                 ".service", ".timer", ".cfg", ".ini", ".rules"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
             "hotcache.egg-info"}


def _tree() -> list[str]:
    """Every file and folder of the checkout, relative to its root, folders ending in /."""
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        here = os.path.relpath(top, ROOT)
        prefix = "" if here == "." else here + "/"
        out += [prefix + d + "/" for d in dirs] + [prefix + f for f in files]
    return out


TREE = _tree()


def _is_placeholder(path: str) -> bool:
    """NAME.py, <subsystem>/, OUT/..., x/../y: a pattern the reader fills in, not a file."""
    return bool(re.search(r"[<>]|(?:^|/)[A-Z][A-Z_]*(?:[./]|$)|\.\.", path))


def _defines(source: str, name: str) -> bool:
    return bool(re.search(rf"^\s*(?:async def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|"
                          rf"^(?:from|import) .*\b{name}\b", source, re.M))


def path_problem(path: str) -> str | None:
    """Why `path`, as a page names it, leads to no file or folder of this repository
    (None when it does); globs must match something."""
    path = path.rstrip(".,:;)")
    if _is_placeholder(path):
        return None
    from_root = path.split("/")[0] in TOP
    suffix = Path(path.rstrip("/")).suffix
    attribute = None
    if suffix and suffix not in FILE_SUFFIXES and re.fullmatch(r"(?:\w+/)+\w+\.[A-Za-z_]\w*", path):
        path, attribute = path[:-len(suffix)] + ".py", suffix[1:]
    elif not from_root and suffix not in FILE_SUFFIXES \
            and not (path.endswith("/") and path.count("/") > 1):
        return None       # not a path: read/write, GiB/s, a label's domain, one folder's name
    pattern = path if from_root else "*/" + path
    found = [t for t in TREE if fnmatch.fnmatchcase(t if path.endswith("/") else t.rstrip("/"),
                                                    pattern)]
    if not found:
        return f"{path} does not exist"
    if attribute and not any(_defines((ROOT / f).read_text(), attribute) for f in found):
        return f"{path} has no {attribute}"
    return None


def module_problem(name: str) -> str | None:
    """Why `hotcache.x.y` names no module of this repository, or no name in one."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:i]))
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            continue
        rest = parts[i:]
        if not rest:
            return None
        if _defines(Path(spec.origin).read_text(), rest[0]):
            return None
        return f"{name}: {'.'.join(parts[:i])} has no {rest[0]}"
    return f"{name}: no such module"


def _code_text() -> str:
    """Every file of the repository's code (not its pages), as one text."""
    files = [ROOT / t for t in TREE if t.split("/")[0] in TOP and t.split("/")[0] != "docs"
             and not t.endswith(("/", ".md")) and "." + t.rpartition(".")[2] in FILE_SUFFIXES]
    return "\n".join(p.read_text(errors="replace") for p in files)


def names_in(text: str) -> tuple[set[str], set[str], set[str]]:
    """The paths (in inline code or plain words), modules and HOTCACHE_ variables a page
    names. Links are checked by the test above; URLs are not paths here."""
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\b[a-z]+://\S+", "", text)
    paths = set(PATH.findall(text))
    return paths, set(MODULE.findall(text)), set(VARIABLE.findall(text))


def stale_names(text: str, code: str) -> list[str]:
    paths, modules, variables = names_in(text)
    return ([p for p in map(path_problem, sorted(paths)) if p]
            + [m for m in map(module_problem, sorted(modules)) if m]
            + [f"{v} appears nowhere in the code" for v in sorted(variables)
               if not re.search(rf"\b{v}\b", code)])


def test_paths_modules_and_variables_named_in_the_pages_exist():
    code, problems = _code_text(), []
    for page in NAMING:
        problems += [f"{rel(page)}: {p}" for p in stale_names(page.read_text(), code)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text, problem", [
    ("run `tests/unit/test_adapters_*.py`", "tests/unit/test_adapters_*.py does not exist"),
    ("see provision/hotcopy/formats.py", "provision/hotcopy/formats.py does not exist"),
    ("(`hotcopy/selections.py`)", "hotcopy/selections.py does not exist"),
    ("the docs in docs/tseting.md", "docs/tseting.md does not exist"),
    ("`hotcache.provision.hotcopy.formt`", "hotcache.provision.hotcopy has no formt"),
    ("`engine/apply.Evn`", "engine/apply.py has no Evn"),
    ("`guest/guest_reboots.py`", "guest/guest_reboots.py does not exist"),
    ("`hotcache.provision.hotcopy.format.read_metadta`", "has no read_metadta"),
    ("set HOTCACHE_NO_SUCH_THING=1", "HOTCACHE_NO_SUCH_THING appears nowhere in the code"),
])
def test_a_stale_path_module_or_variable_is_caught(text, problem):
    assert any(problem in p for p in stale_names(text, "HOTCACHE_VM_K = 1"))


def test_real_names_pass():
    text = ("`tests/unit/project/test_docs.py`, provision/system/beneath.py, "
            "`hotcopy/format.py`, `backends/parts/`, docs/cli.md, `tests/unit/<subsystem>/`, "
            "`provision/backends/NAME.py`, `hotcache.provision.hotcopy.format.read_metadata`, "
            "`hotcache.adapters`, HOTCACHE_VM_K, read/write, `engine/apply.Env`, "
            "guest/powercut.py, `.ci/run`, 12 GiB/140.2 s, x/../a.img")
    assert stale_names(text, "HOTCACHE_VM_K = 1") == []
