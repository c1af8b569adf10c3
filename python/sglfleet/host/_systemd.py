"""systemd as the fleet host's code talks to it: `systemctl` queries, and EnvironmentFile= files.

Queries take a `systemctl` callable (argv -> stdout) so that tests can hand in systemd's answers;
`query` is the real one. EnvironmentFile= files are parsed as systemd parses them
(src/basic/env-file.c, `parse_env_file_internal`, and src/core/execute.c, which drops assignments
whose name is not a valid variable name, `strv_env_clean_with_callback`), so what this module reads
is what a unit's process gets.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

#: argv -> stdout of a read-only `systemctl` query.
Systemctl = Callable[[Sequence[str]], str]

#: What env-file.c calls COMMENTS, WHITESPACE, NEWLINE and SHELL_NEED_ESCAPE (src/basic/string-util.h,
#: src/basic/escape.h).
_COMMENTS = "#;"
_WHITESPACE = " \t\n\r"
_NEWLINE = "\n\r"
_SHELL_NEED_ESCAPE = '"\\`$'
#: Why a line without "=" is ignored (`EnvIgnored.reason`).
NO_EQUALS = "no '=' in the line"
#: env-util.c `env_name_is_valid`: letters, digits and "_", not starting with a digit.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A byte that is not UTF-8, as `bytes.decode(errors="surrogateescape")` keeps it.
_UNDECODABLE_RE = re.compile("[\udc80-\udcff]")


def run(argv: Sequence[str], *, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (systemctl, systemd-run, journalctl) and capture its output; never raises on rc."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def query(argv: Sequence[str]) -> str:
    """stdout of a read-only query; a host without the command (no systemd) answers nothing."""
    try:
        return run(argv, timeout=60).stdout
    except FileNotFoundError:
        return ""


def unit_name(name: str) -> str:
    """`train` -> `train.service`; a name with a unit type suffix (`x.scope`, `a@b.service`) stays."""
    return name if "." in name.rsplit("@", 1)[-1] else f"{name}.service"


def parse_show(text: str, count: int) -> list[dict[str, str]]:
    """`systemctl show`'s output for `count` units: one block of KEY=VALUE lines per unit, separated by
    blank lines, in the order the units were named; a block systemd did not print comes back empty."""
    blocks = [
        dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        for block in text.strip().split("\n\n")
    ]
    return [blocks[i] if i < len(blocks) else {} for i in range(count)]


def show(units: Sequence[str], props: Iterable[str], systemctl: Systemctl = query) -> list[dict[str, str]]:
    """`systemctl show --property=...` of each unit, in order (a unit the host lacks: LoadState=not-found)."""
    if not units:
        return []
    out = systemctl(["systemctl", "show", f"--property={','.join(props)}", *units])
    return parse_show(out, len(units))


def split_shown_list(text: str) -> list[str]:
    """The words of a string-list property as `systemctl show` prints it: each word through
    `shell_maybe_quote(str, 0)` (systemd src/shared/bus-print-properties.c), i.e. as it is when it needs
    no quoting, else in double quotes with `"`, `\\`, `` ` `` and `$` escaped by a backslash."""
    words: list[str] = []
    word: list[str] = []
    started = quoted = False
    chars = iter(text)
    for ch in chars:
        if ch == "\\":
            word.append(next(chars, ""))
            started = True
        elif ch == '"':
            quoted = not quoted
            started = True
        elif ch == " " and not quoted:
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
    if started:
        words.append("".join(word))
    return words


def list_units(pattern: str, *, states: Sequence[str] = (), systemctl: Systemctl = query) -> list[str]:
    """The names of the units systemd has loaded that match `pattern`: every one, or those in `states`."""
    which = f"--state={','.join(states)}" if states else "--all"
    argv = ["systemctl", "list-units", which, "--plain", "--no-legend", "--full", pattern]
    return [line.split()[0] for line in systemctl(argv).splitlines() if line.split()]


#: src/basic/time-util.c `format_timespan`'s units (v252 :501-515), in microseconds.
_TIMESPAN_USEC = {
    "y": 31_557_600_000_000,
    "month": 2_629_800_000_000,
    "w": 604_800_000_000,
    "d": 86_400_000_000,
    "h": 3_600_000_000,
    "min": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
    "us": 1,
}
_TIMESPAN_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(y|month|w|d|h|min|s|ms|us)")


def parse_timespan(text: str) -> int | None:
    """Microseconds of a time span as `systemctl show` prints a ...USec property (`1min 30s`, `500ms`,
    `0`); None for `infinity` or a text that is no time span."""
    text = text.strip()
    if text == "0":
        return 0
    parts = text.split()
    matches = [_TIMESPAN_PART_RE.fullmatch(part) for part in parts]
    if not parts or not all(matches):
        return None
    return round(sum(float(m[1]) * _TIMESPAN_USEC[m[2]] for m in matches if m))


# --- EnvironmentFile= ----------------------------------------------------------------------------


class EnvFileError(ValueError):
    """An EnvironmentFile= that systemd refuses as a whole, so the unit does not start (its file and line
    are in the message)."""


@dataclasses.dataclass(frozen=True)
class EnvAssignment:
    name: str
    value: str
    #: The line the assignment starts on (1-based); a quoted value may continue on the next lines.
    line: int


@dataclasses.dataclass(frozen=True)
class EnvIgnored:
    """A line systemd does not turn into a variable (it logs it and goes on)."""

    line: int
    text: str
    reason: str


@dataclasses.dataclass(frozen=True)
class EnvFile:
    #: The assignments systemd keeps, in file order (a name set twice appears twice; the last one wins).
    assignments: tuple[EnvAssignment, ...] = ()
    ignored: tuple[EnvIgnored, ...] = ()
    #: The line a quoted value opened on when the file ended inside it: systemd takes the rest of the
    #: file as that value. None when every quote is closed.
    unterminated_quote: int | None = None

    @property
    def values(self) -> dict[str, str]:
        """What the unit's process gets: each name's last value."""
        return {a.name: a.value for a in self.assignments}


class _Parser:
    """A port of env-file.c's `parse_env_file_internal` state machine (systemd v254 and later: before
    v254, a comment line that ends in a backslash went on to the next line). One method per state; each
    takes one character and returns the next state."""

    def __init__(self, text: str, source: str = "<text>") -> None:
        self.text = text
        self.source = source
        # Lines as the line numbers count them: only "\n" ends one (str.splitlines also breaks on \r,
        # \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029, which are ordinary characters to systemd).
        self.lines = text.split("\n")
        self.assignments: list[EnvAssignment] = []
        self.ignored: list[EnvIgnored] = []
        self.key: list[str] = []
        self.value: list[str] = []
        self.last_key_ws: int | None = None  # where the key's trailing whitespace starts
        self.last_value_ws: int | None = None  # where an unquoted value's trailing whitespace starts
        self.line = 1  # of the character being read
        self.start = 1  # the line the key started on
        self.quote_line = 0  # the line the last quote opened on

    def parse(self) -> EnvFile:
        steps = {
            "PRE_KEY": self._pre_key,
            "KEY": self._key,
            "PRE_VALUE": self._pre_value,
            "VALUE": self._value,
            "VALUE_ESCAPE": self._value_escape,
            "SINGLE_QUOTE_VALUE": self._single_quote,
            "DOUBLE_QUOTE_VALUE": self._double_quote,
            "DOUBLE_QUOTE_VALUE_ESCAPE": self._double_quote_escape,
            "COMMENT": self._comment,
            "COMMENT_ESCAPE": self._comment_escape,
        }
        state = "PRE_KEY"
        for c in self.text:
            state = steps[state](c)
            if c == "\n":
                self.line += 1
        unterminated = None
        if state in ("SINGLE_QUOTE_VALUE", "DOUBLE_QUOTE_VALUE", "DOUBLE_QUOTE_VALUE_ESCAPE"):
            unterminated = self.quote_line
        if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE") or unterminated is not None:
            self._push(chomp=state == "VALUE")
        elif state == "KEY":
            self._no_equals()
        return EnvFile(tuple(self.assignments), tuple(self.ignored), unterminated)

    def _source(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def _no_equals(self) -> None:
        self.ignored.append(EnvIgnored(self.start, self._source(self.start), NO_EQUALS))

    def _push(self, *, chomp: bool) -> None:
        key = "".join(self.key[: self.last_key_ws] if self.last_key_ws is not None else self.key)
        value = "".join(
            self.value[: self.last_value_ws] if chomp and self.last_value_ws is not None else self.value
        )
        # env-file.c `check_utf8ness_and_warn` (v252:273-296, called for every pushed key and value,
        # v252:370-372): invalid UTF-8 fails the whole file, and the unit with it.
        if _UNDECODABLE_RE.search(key):
            raise EnvFileError(
                f"{self.source}:{self.start}: invalid UTF-8 in the name {key!r}; systemd refuses the file"
            )
        if _UNDECODABLE_RE.search(value):
            raise EnvFileError(
                f"{self.source}:{self.start}: invalid UTF-8 in the value of {key}; systemd refuses the file"
            )
        if ENV_NAME_RE.match(key):
            self.assignments.append(EnvAssignment(key, value, self.start))
            return
        reason = f"{key!r} is not a variable name"
        if key.startswith("export ") and ENV_NAME_RE.match(key.removeprefix("export ").strip()):
            reason += " (systemd does not accept a shell's 'export ')"
        self.ignored.append(EnvIgnored(self.start, self._source(self.start), reason))

    def _pre_key(self, c: str) -> str:
        if c in _COMMENTS:
            return "COMMENT"
        if c in _WHITESPACE:
            return "PRE_KEY"
        self.key, self.last_key_ws, self.start = [c], None, self.line
        return "KEY"

    def _key(self, c: str) -> str:
        if c in _NEWLINE:
            self._no_equals()
            return "PRE_KEY"
        if c == "=":
            self.value, self.last_value_ws = [], None
            return "PRE_VALUE"
        if c not in _WHITESPACE:
            self.last_key_ws = None
        elif self.last_key_ws is None:
            self.last_key_ws = len(self.key)
        self.key.append(c)
        return "KEY"

    def _pre_value(self, c: str) -> str:
        if c in _NEWLINE:
            self._push(chomp=False)
            return "PRE_KEY"
        if c in "'\"":
            self.quote_line = self.line
            return "SINGLE_QUOTE_VALUE" if c == "'" else "DOUBLE_QUOTE_VALUE"
        if c == "\\":
            return "VALUE_ESCAPE"
        if c in _WHITESPACE:
            return "PRE_VALUE"
        self.value.append(c)
        return "VALUE"

    def _value(self, c: str) -> str:
        if c in _NEWLINE:
            self._push(chomp=True)
            return "PRE_KEY"
        if c == "\\":
            self.last_value_ws = None
            return "VALUE_ESCAPE"
        if c not in _WHITESPACE:
            self.last_value_ws = None
        elif self.last_value_ws is None:
            self.last_value_ws = len(self.value)
        self.value.append(c)
        return "VALUE"

    def _value_escape(self, c: str) -> str:
        if c not in _NEWLINE:  # an escaped newline continues the value on the next line
            self.value.append(c)
        return "VALUE"

    def _single_quote(self, c: str) -> str:
        if c == "'":
            return "PRE_VALUE"
        self.value.append(c)
        return "SINGLE_QUOTE_VALUE"

    def _double_quote(self, c: str) -> str:
        if c == '"':
            return "PRE_VALUE"
        if c == "\\":
            return "DOUBLE_QUOTE_VALUE_ESCAPE"
        self.value.append(c)
        return "DOUBLE_QUOTE_VALUE"

    def _double_quote_escape(self, c: str) -> str:
        if c in _SHELL_NEED_ESCAPE:
            self.value.append(c)
        elif c != "\n":  # another character keeps its backslash, as a shell does; a newline goes
            self.value += ["\\", c]
        return "DOUBLE_QUOTE_VALUE"

    def _comment(self, c: str) -> str:
        if c == "\\":
            return "COMMENT_ESCAPE"
        return "PRE_KEY" if c in _NEWLINE else "COMMENT"

    def _comment_escape(self, c: str) -> str:
        return "PRE_KEY" if c in _NEWLINE else "COMMENT"


def parse_env_file(text: str) -> EnvFile:
    """An EnvironmentFile='s text as systemd reads it: `NAME=VALUE` lines; `#` and `;` comments; a value
    in single quotes (taken as is) or double quotes (`\\"`, `\\\\`, `\\$` and `` \\` `` unescaped); an
    unquoted value keeps its inner spaces and loses its trailing ones; a backslash at the end of a line
    continues the value. A name that is not a variable name (`export NAME=...` included) is ignored,
    as systemd ignores it. Values are not expanded (`$X` stays `$X`)."""
    return _Parser(text).parse()


def read_env_file(path: Path) -> EnvFile:
    """`parse_env_file` of the file's bytes (OSError when it cannot be read; EnvFileError, naming the file
    and line, when a name or value is not UTF-8, which systemd refuses). The bytes are decoded as they are:
    no newline translation, since a "\r" is a newline to systemd only where env-file.c says so."""
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    return _Parser(text, str(path)).parse()


def quote(value: str) -> str:
    """`value` as a double-quoted EnvironmentFile= value that systemd reads back as `value`."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
