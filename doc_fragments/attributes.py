"""The documentation every sglfleet module shares: what its `attributes` mean.

A module names it in DOCUMENTATION (`ansible-doc -M library` finds it through ansible.cfg's
doc_fragment_plugins; in the collection it is `sglfleet.ops.attributes`, in plugins/doc_fragments/):

    extends_documentation_fragment:
      - attributes            # check_mode and diff_mode: what they mean
      - attributes.read_only  # a module that only reads: both attributes, whole

and a module that changes something gives, under its own `attributes`, each one's `support` and its own
`details` (what check mode reports, what the diff shows); the descriptions come from here.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description:
      - Runs in check mode, changes nothing, and reports as C(changed) exactly what a real run would change.
  diff_mode:
    description:
      - With C(--diff), returns the configuration before and after what it changes (or would change, in
        check mode).
"""

    # A module that only reads: the same look in check mode, nothing a diff could show.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - Only reads; it runs the same look in check mode.
  diff_mode:
    support: none
    details:
      - Only reads; it changes nothing a diff could show.
"""

    # A module that returns facts.
    FACTS = r"""
options: {}
attributes:
  facts:
    description:
      - Returns C(ansible_facts), which update the host's facts.
"""
