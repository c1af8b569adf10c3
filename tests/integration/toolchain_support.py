"""The role tests' targets now live in the one harness, ansible_lab (Target, LabTarget, LocalTarget,
make_target, PlaybookRun, run_playbook, parse). This module stays so that tests importing it keep
working; new tests import from ansible_lab."""

from __future__ import annotations

from ansible_lab import (  # noqa: F401
    BIN,
    LAB_MODULE_PYTHON,
    LAB_ROOT,
    ROOT,
    TARGET_ENV,
    LabTarget,
    LocalTarget,
    PlaybookRun,
    Target,
    make_target,
    parse,
    run_playbook,
)
