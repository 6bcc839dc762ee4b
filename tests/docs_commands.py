"""The shell commands the README and docs/*.md show a user, read out of the markdown as a user would copy them.

A command is found in three places:

- a fenced block tagged `bash`, `sh`, `shell`, `console` or `zsh`: every line that is not blank or a comment;
- a fenced block without a language, or a block indented by four spaces: the lines that start with a program
  a user runs (`python`, `mlflow`, `pip`, `bash`, ...), so that diagrams, layouts and printed output are not
  commands;
- an inline code span in the prose that starts with such a program (`python -m electra_ablate.bench ...`).

Lines continued with a trailing backslash are joined, a `$ ` prompt is dropped, and a `#` comment (outside
quotes, at the start of a word, as the shell reads it) is cut off. Environment assignments in front of the
program (`OMP_NUM_THREADS=1 python ...`) stay in the text; `split_env` takes them apart. Placeholders
(`<run id>`) are left as written: the caller substitutes them before the text is split into words.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# First words that make a line of an untagged or indented block, or an inline span, a command.
PROGRAMS = {
    "python", "python3", "pytest", "mlflow", "pip", "pip3", "bash", "sh", "apt-get", "apt", "git", "make",
    "for", "export", "cd", "torchrun", "srun", "sbatch", "uv", "conda", "docker",
    "electra-pretrain", "electra-finetune", "electra-report", "electra-export", "electra-bench", "electra-sweep",
}
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


@dataclass(frozen=True)
class DocCommand:
    file: str  # relative to the checkout, e.g. "README.md", "docs/scaling.md"
    line: int  # 1-based line where the command starts
    text: str  # one line: continuations joined, prompt and comment removed, spaces collapsed
    where: str  # "fenced", "indented" or "inline"

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def strip_comment(line: str) -> str:
    """`line` without a trailing shell comment: a `#` outside quotes at the start of a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def normalize(text: str) -> str:
    text = text.strip()
    if text.startswith("$ "):
        text = text[2:]
    return " ".join(text.split())


def split_env(text: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments in front, the command's words) of a command without placeholders."""
    words = shlex.split(text)
    env = {}
    while words and _ENV.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def program(text: str) -> str:
    """The first word after any leading environment assignments (no shell parsing: placeholders may be in it)."""
    words = normalize(text).split()
    while words and _ENV.match(words[0]):
        words.pop(0)
    return words[0] if words else ""


def looks_like_command(text: str) -> bool:
    return program(text) in PROGRAMS and len(normalize(text).split()) > 1


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join backslash continuations and drop comments; (line number of the first physical line, text)."""
    out, start, parts = [], None, []
    for number, raw in lines:
        line = strip_comment(raw)
        if start is None:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        text = normalize(" ".join(parts))
        if text:
            out.append((start, text))
        start, parts = None, []
    if parts:
        text = normalize(" ".join(parts))
        if text:
            out.append((start, text))
    return out


def _inline_commands(file: str, prose: list[tuple[int, str]]) -> list[DocCommand]:
    """Inline code spans that are commands; a span may run over a line break (markdown joins the lines)."""
    out = []
    joined, starts = "", []  # the prose as one string, and the offset at which each line starts
    for number, line in prose:
        starts.append((len(joined), number))
        joined += line + "\n"
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        text = normalize(m.group(1).replace("\n", " "))
        if looks_like_command(text):
            line = max(n for offset, n in starts if offset <= m.start())
            out.append(DocCommand(file, line, text, "inline"))
    return out


def extract(path: Path, root: Path) -> list[DocCommand]:
    """Every command in one markdown file, in the order they appear."""
    file = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    commands: list[DocCommand] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            marker, lang = fence.group(2), fence.group(3).lower()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                block.append((i + 1, lines[i]))
                i += 1
            i += 1  # the closing fence
            prose.append((i, ""))  # a block ends a paragraph: no inline span runs across it
            if lang in SHELL_LANGS:
                commands += [DocCommand(file, n, t, "fenced") for n, t in _logical_lines(block)]
            elif lang in ("", "text", "console-output"):
                commands += [DocCommand(file, n, t, "fenced") for n, t in _logical_lines(block) if looks_like_command(t)]
            continue
        indented = line.startswith(("    ", "\t")) and line.strip() and (i == 0 or not lines[i - 1].strip())
        if indented:
            block = []
            while i < len(lines) and (lines[i].startswith(("    ", "\t")) or not lines[i].strip()):
                block.append((i + 1, lines[i]))
                i += 1
            prose.append((i, ""))
            commands += [DocCommand(file, n, t, "indented") for n, t in _logical_lines(block) if looks_like_command(t)]
            continue
        prose.append((i + 1, line))
        i += 1
    commands += _inline_commands(file, prose)
    return sorted(commands, key=lambda c: c.line)


NOTEBOOK = "docs/notebook/"  # the dated lab notebook: its commands are history, composed but not run


def documented_commands(root: Path) -> list[DocCommand]:
    """The commands of README.md, docs/*.md and the lab notebook (docs/notebook/**) under the checkout `root`."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / NOTEBOOK).rglob("*.md"))]
    return [c for f in files if f.is_file() for c in extract(f, root)]


def in_notebook(cmd: DocCommand) -> bool:
    return cmd.file.startswith(NOTEBOOK)
