"""The one import guard of the sglfleet modules: they are thin adapters over the `sglfleet` package, which
must be importable by the interpreter that runs them on the target (the sglfleet venv, role
sglfleet_runtime). Used as

    from ansible.module_utils.sglfleet_deps import SGLFLEET

    with SGLFLEET:
        from sglfleet.fleet import load_ledger, record_phase
    ...
    module = AnsibleModule(...)
    SGLFLEET.require(module)

so that a target without the package gets Ansible's standard "missing required library" error (with the
import's traceback under -vvv) instead of a traceback, and the module still parses its arguments first."""

from __future__ import annotations

import traceback

from ansible.module_utils.basic import missing_required_lib

HINT = (
    "the sglfleet modules run with the sglfleet venv's python: ansible_python_interpreter="
    "/opt/sglfleet/venv/bin/python, which role sglfleet_runtime creates"
)


class ImportGuard:
    """A context manager that keeps an ImportError of its block for `require()` to report."""

    def __init__(self, library: str, url: str | None = None) -> None:
        self.library = library
        self.url = url
        self.error: str | None = None
        self.missing = library

    @property
    def ok(self) -> bool:
        return self.error is None

    def __enter__(self) -> ImportGuard:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, ImportError):
            self.error = traceback.format_exc()
            # the package itself, or one of its dependencies (proxmoxer, httpx, ...): name the one missing
            self.missing = getattr(exc, "name", None) or self.library
            return True
        return False

    def require(self, module) -> None:
        """Fail the module with missing_required_lib's message when the guarded import failed."""
        if self.error is not None:
            reason = None if self.missing == self.library else f"for {self.library}"
            message = missing_required_lib(self.missing, reason=reason, url=self.url)
            module.fail_json(msg=f"{message} ({HINT})", exception=self.error)


SGLFLEET = ImportGuard("sglfleet")
