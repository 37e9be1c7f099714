"""docs/configuration.md says one thing about what a reload applies: its table of top-level
keys is the configuration model's keys, each marked as the code reloads it."""

from __future__ import annotations

import re
from pathlib import Path

from osas.config import RELOADABLE, OsasConfig

PAGE = Path(__file__).parent.parent / "docs" / "configuration.md"


def documented() -> dict[str, str]:
    """The reload table: key -> when a change takes effect ("on reload", "at a restart")."""
    section = PAGE.read_text(encoding="utf-8").split("## Reloading the configuration")[1]
    section = section.split("\n## ")[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (on reload|at a restart)\b", section, re.MULTILINE)
    assert len(rows) == len(dict(rows)), "a key listed twice"
    return dict(rows)


def test_the_reload_table_lists_every_key_once_as_the_code_reloads_it():
    table = documented()
    assert set(table) == set(OsasConfig.model_fields)
    for key, when in table.items():
        assert (when == "on reload") == (key in RELOADABLE), key


def test_no_other_page_says_the_configuration_is_read_only_at_start():
    """The sentence the chart, the overlay and install.md once said, contradicting the reload."""
    root = PAGE.parent.parent
    pages = [*root.glob("docs/*.md"), *root.glob("deploy/**/*.yaml"), *root.glob("charts/**/*")]
    said = [
        str(page.relative_to(root))
        for page in pages
        if page.is_file()
        and re.search(r"reads (it|its configuration) at start", page.read_text(errors="ignore"))
    ]
    assert said == []
