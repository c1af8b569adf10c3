#!/usr/bin/env python3
"""Write each role's variable table into roles/<role>/README.md from its meta/argument_specs.yml.

The table sits between the markers below; everything else in the README is hand-written. With --check,
nothing is written and the exit status says whether every README is up to date (tests/unit runs it).

    python scripts/role_docs.py [--check] [ROLE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- BEGIN generated from meta/argument_specs.yml by scripts/role_docs.py: do not edit -->"
END = "<!-- END generated -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _description(spec: dict[str, Any]) -> str:
    desc = spec.get("description", "")
    parts = desc if isinstance(desc, list) else [desc]
    text = " ".join(str(p) for p in parts)
    # ansible-doc markup to Markdown: C(x) → `x`, I(x) → *x*.
    marks = {"C(": ("`", "`"), "I(": ("*", "*"), "V(": ("`", "`"), "O(": ("`", "`")}
    for macro, (left, right) in marks.items():
        while macro in text:
            start = text.index(macro)
            end = text.find(")", start)
            if end < 0:
                break
            text = text[:start] + left + text[start + 2 : end] + right + text[end + 1 :]
    return _cell(text)


def _default(spec: dict[str, Any]) -> str:
    if "default" not in spec:
        return "*required*" if spec.get("required") else "-"
    value = spec["default"]
    shown = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    shown = shown.removesuffix("...").strip()
    return f"`{_cell(shown)}`" if shown else '`""`'


def table(role: Path) -> str:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    lines = [BEGIN, ""]
    for entry, spec in specs.items():
        title = f"`{role.name}`" if entry == "main" else f"`{role.name}` entry point `{entry}`"
        lines += [f"Variables of {title} (`ansible-doc -t role -r roles {role.name}` shows the same):", ""]
        lines += ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, opt in spec.get("options", {}).items():
            kind = opt.get("type", "str")
            if kind == "list" and "elements" in opt:
                kind = f"list of {opt['elements']}"
            choices = f" One of: {', '.join(f'`{c}`' for c in opt['choices'])}." if "choices" in opt else ""
            lines.append(f"| `{name}` | {kind} | {_default(opt)} | {_description(opt)}{choices} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def render(readme: str, generated: str) -> str:
    if BEGIN in readme and END in readme:
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + generated + tail
    return readme.rstrip("\n") + "\n\n## Variables\n\n" + generated + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a README is stale")
    parser.add_argument("roles", nargs="*", help="role names (default: every role with argument_specs)")
    args = parser.parse_args(argv)
    roles = [ROOT / "roles" / r for r in args.roles] or sorted(
        p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml")
    )
    stale = []
    for role in roles:
        readme_path = role / "README.md"
        readme = readme_path.read_text() if readme_path.exists() else f"# Role `{role.name}`\n"
        wanted = render(readme, table(role))
        if wanted != readme:
            stale.append(str(readme_path.relative_to(ROOT)))
            if not args.check:
                readme_path.write_text(wanted)
    if args.check and stale:
        print("stale: " + ", ".join(stale) + " (run: python scripts/role_docs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
