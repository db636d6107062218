"""The preflight's checks come from the stage declarations: every check a declaration names
exists, and a stage whose new tokens must fit after the prompt names the setting that
counts them."""

from __future__ import annotations

from studio.core.settings import SECTION_KEYS
from studio.core.stagegraph import DECLARATIONS
from studio.services.preflight import CHECKS


def test_every_declared_check_exists_and_names_its_setting():
    asked = {c for d in DECLARATIONS for c in d.preflight}
    assert asked == set(CHECKS)  # none unknown, none unused
    for d in DECLARATIONS:
        if "prompt-fits" in d.preflight:
            section, _, key = d.new_tokens.partition(".")
            assert key in SECTION_KEYS[section] and d.new_tokens in d.settings, d.name
        else:
            assert not d.new_tokens, d.name
