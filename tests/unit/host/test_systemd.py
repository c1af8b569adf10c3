"""sglfleet.host._systemd: EnvironmentFile= read as systemd reads it, its quoting, and systemctl's answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglfleet.host import _systemd as systemd

# A file with every construct env-file.c's state machine distinguishes. What systemd 252 handed a unit
# started with EnvironmentFile= this file (systemd-run --pipe ... /usr/bin/env in lab CT 200, Debian 12):
# every value below but F, which systemd >= 254 takes and 252 does not (before v254 a comment ending in
# a backslash went on to the next line; env-file.c COMMENT_ESCAPE). `export A_EXPORTED=1` gave nothing:
# its key "export A_EXPORTED" is no variable name, and execute.c drops it (strv_env_clean_with_callback).
SAMPLE = r"""export A_EXPORTED=1
B=plain value  
C='single $x \\n'
D="dq \"q\" \\$ \\\\ \\n end"
E=a\
continued
# comment \
F=after comment
  G  =  spaced  
H="multi
line"
I='a'"b" c
noequals
1BAD=x
J=
K=x # not a comment
L=last
L=wins
"""  # noqa: W291 - the trailing spaces are part of the sample

SYSTEMD = {
    "B": "plain value",
    "C": r"single $x \\n",
    "D": r'dq "q" \$ \\ \n end',
    "E": "acontinued",
    "F": "after comment",
    "G": "spaced",
    "H": "multi\nline",
    "I": "abc",
    "J": "",
    "K": "x # not a comment",
    "L": "wins",
}


def test_values_are_what_systemd_hands_the_process() -> None:
    env = systemd.parse_env_file(SAMPLE)
    assert env.values == SYSTEMD
    assert [(a.name, a.line) for a in env.assignments if a.name in "EHL"] == [
        ("E", 5), ("H", 10), ("L", 17), ("L", 18)
    ]  # fmt: skip
    assert env.unterminated_quote is None


def test_export_is_ignored_as_systemd_ignores_it_and_named() -> None:
    env = systemd.parse_env_file(SAMPLE)
    assert "A_EXPORTED" not in env.values
    assert [(i.line, i.text) for i in env.ignored] == [
        (1, "export A_EXPORTED=1"),
        (13, "noequals"),
        (14, "1BAD=x"),
    ]
    assert "'export A_EXPORTED' is not a variable name" in env.ignored[0].reason
    assert "export" in env.ignored[0].reason.split("(", 1)[1]
    assert env.ignored[1].reason == systemd.NO_EQUALS


def test_an_unclosed_quote_takes_the_rest_of_the_file_and_is_reported() -> None:
    env = systemd.parse_env_file('A=1\nB="open\nC=2\n')
    assert env.values == {"A": "1", "B": "open\nC=2\n"}
    assert env.unterminated_quote == 2


@pytest.mark.parametrize(
    "value",
    [
        "",
        "plain",
        "two  words ",
        ' "quoted" ',
        "back\\slash\\",
        "$HOME ${X} `id`",
        "a'b",
        "#hash;",
        "new\nline",
        "ü",
    ],
)
def test_quote_reads_back_as_the_value(value: str) -> None:
    assert systemd.parse_env_file(f"K={systemd.quote(value)}\n").values == {"K": value}


def test_read_env_file_reads_crlf_files_and_fails_on_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_bytes(b'A=1\r\nB="2"\r\n')
    assert systemd.read_env_file(path).values == {"A": "1", "B": "2"}
    with pytest.raises(OSError):
        systemd.read_env_file(tmp_path / "missing.env")


def test_show_reads_one_block_per_unit_in_order() -> None:
    asked: list[list[str]] = []

    def systemctl(argv: list[str]) -> str:
        asked.append(list(argv))
        # systemctl show prints one block per unit, a blank line between them (systemctl-show.c)
        return (
            "Id=a.service\nActiveState=active\nMainPID=7\n\nId=b.service\nActiveState=inactive\nMainPID=0\n"
        )

    shown = systemd.show(["a.service", "b.service", "c.service"], ("Id", "ActiveState", "MainPID"), systemctl)
    assert asked == [
        ["systemctl", "show", "--property=Id,ActiveState,MainPID", "a.service", "b.service", "c.service"]
    ]
    assert shown == [
        {"Id": "a.service", "ActiveState": "active", "MainPID": "7"},
        {"Id": "b.service", "ActiveState": "inactive", "MainPID": "0"},
        {},
    ]
    assert systemd.show([], ("Id",), systemctl) == [] and len(asked) == 1


def test_list_units_takes_the_first_column() -> None:
    answers = {"--all": "sglang@0.service loaded active running x\nsglang@1.service loaded failed failed x\n"}

    def systemctl(argv: list[str]) -> str:
        assert argv[-1] == "sglang@*.service"
        return answers.get(argv[2], "sglang@0.service loaded active running x\n")

    assert systemd.list_units("sglang@*.service", systemctl=systemctl) == [
        "sglang@0.service",
        "sglang@1.service",
    ]
    assert systemd.list_units("sglang@*.service", states=("active",), systemctl=systemctl) == [
        "sglang@0.service"
    ]


def test_query_answers_nothing_without_the_command_and_run_reports_failure() -> None:
    assert systemd.query(["/nonexistent/systemctl", "show"]) == ""
    assert systemd.query(["echo", "Id=x"]) == "Id=x\n"
    failed = systemd.run(["sh", "-c", "echo no >&2; exit 3"])
    assert (failed.returncode, failed.stderr) == (3, "no\n")


def test_unit_name_adds_service_only_without_a_type() -> None:
    assert [systemd.unit_name(n) for n in ("train", "train.service", "s.scope", "a@b", "a@b.service")] == [
        "train.service", "train.service", "s.scope", "a@b.service", "a@b.service"
    ]  # fmt: skip


def test_read_env_file_keeps_carriage_returns_where_systemd_sees_them(tmp_path: Path) -> None:
    # systemd 252's parse_env_file_internal (compiled from env-file.c) gives A=x, B=1 and Q="a\r\nb":
    # a backslash escapes the "\r" and the "\n" then ends the value; a quoted "\r\n" is kept as it is.
    path = tmp_path / "x.env"
    path.write_bytes(b'A=x\\\r\nB=1\r\nQ="a\r\nb"\r\n')
    env = systemd.read_env_file(path)
    assert env.values == {"A": "x", "B": "1", "Q": "a\r\nb"}
    assert [(a.name, a.line) for a in env.assignments] == [("A", 1), ("B", 2), ("Q", 3)]


def test_lines_are_counted_and_shown_by_newline_only() -> None:
    # \v, \f, \x1c, \x85 and \u2028 are ordinary characters to systemd (str.splitlines breaks on them).
    env = systemd.parse_env_file("A=1\x0bB=2\nC\x85D\n1BAD=x\n")
    assert env.values == {"A": "1\x0bB=2"}
    assert [(i.line, i.text) for i in env.ignored] == [(2, "C\x85D"), (3, "1BAD=x")]


def test_read_env_file_refuses_invalid_utf8_naming_file_and_line(tmp_path: Path) -> None:
    # env-file.c check_utf8ness_and_warn (v252:273-296, :370-372): the whole file fails; a comment is
    # never pushed, so a bad byte there is fine.
    path = tmp_path / "x.env"
    path.write_bytes(b"# caf\xe9\nA=1\nB=caf\xe9\n")
    with pytest.raises(systemd.EnvFileError, match=rf"^{path}:3: invalid UTF-8 in the value of B"):
        systemd.read_env_file(path)
    path.write_bytes(b"# caf\xe9\nA=1\n")
    assert systemd.read_env_file(path).values == {"A": "1"}


@pytest.mark.parametrize(
    ("text", "usec"),
    [("0", 0), ("3s", 3_000_000), ("1min 30s", 90_000_000), ("1h 500ms", 3_600_500_000), ("infinity", None)],
)
def test_parse_timespan_reads_what_systemctl_show_prints(text: str, usec: int | None) -> None:
    assert systemd.parse_timespan(text) == usec


def test_a_string_list_reads_back_as_systemctl_show_quotes_it() -> None:
    # bus-print-properties.c prints each word of an "as" property through shell_maybe_quote(str, 0).
    shown = r'A=1 "B=two words" "C=\$HOME \"q\"" A=3  '
    assert systemd.split_shown_list(shown) == ["A=1", "B=two words", 'C=$HOME "q"', "A=3"]
    assert systemd.split_shown_list("") == []
