"""Build-time metadata: the project URLs and the PyPI description, from one setting.

`[tool.hatch.metadata.hooks.custom] urls` in pyproject.toml is the one place the project's
public addresses are written. Empty (until the project has a home), the metadata lists no
URLs and the description keeps the text of the README's links into `docs/` but not the
links, which would break on PyPI. With a `Documentation` address (the docs site's base URL,
e.g. the Read the Docs build of `docs/`), those links point at its pages instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface

# [text](target): the README's links are inline, and link texts hold no brackets.
_LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_ABSOLUTE = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def page_url(docs_base: str, target: str) -> str:
    """The docs site's address for a `docs/PAGE.md#anchor` link (Sphinx: PAGE.html)."""
    path, _, anchor = target.partition("#")
    page = path.removeprefix("docs/").removesuffix(".md")
    url = docs_base.rstrip("/") + "/" + ("" if page == "index" else f"{page}.html")
    return f"{url}#{anchor}" if anchor else url


# The README's section for contributors (the repository's two commands): not for PyPI.
_CONTRIBUTORS = re.compile(r"^## Developing\n.*?(?=^## )", re.MULTILINE | re.DOTALL)


def pypi_description(readme: str, docs_base: str) -> str:
    """The README without its contributors' section, every relative link made absolute or
    reduced to its text."""
    readme = _CONTRIBUTORS.sub("", readme)

    def rewrite(match: re.Match[str]) -> str:
        text, target = match["text"], match["target"]
        if _ABSOLUTE.match(target):
            return match[0]
        if docs_base and target.startswith("docs/") and target.split("#")[0].endswith(".md"):
            return f"[{text}]({page_url(docs_base, target)})"
        return text  # no address for it on PyPI: keep the words

    return _LINK.sub(rewrite, readme)


def project_urls(urls: dict[str, str]) -> dict[str, str]:
    """The configured addresses, plus the changelog page when the docs have an address."""
    chosen = {label: url for label, url in urls.items() if url}
    if "Documentation" in chosen and "Changelog" not in chosen:
        chosen["Changelog"] = page_url(chosen["Documentation"], "docs/changelog.md")
    return chosen


class SeppMetadataHook(MetadataHookInterface):
    """Fills in `readme` and `urls` (both `dynamic` in pyproject.toml)."""

    def update(self, metadata: dict[str, Any]) -> None:
        urls = project_urls(dict(self.config.get("urls", {})))
        readme = Path(self.root, "README.md").read_text(encoding="utf-8")
        metadata["readme"] = {
            "content-type": "text/markdown",
            "text": pypi_description(readme, urls.get("Documentation", "")),
        }
        metadata["urls"] = urls  # set even when empty, so no field is left "Dynamic"
