"""The server's admin JSON API (`/admin/api/v1/...`), read with the standard library's HTTP:
what the job API cannot show without consuming (queue depths, dead letters in place)."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import trio

from ._failures import CliError, UsageError

ADMIN_URL_ENV = "SEPP_ADMIN_URL"
ADMIN_KEY_ENV = "SEPP_ADMIN_KEY"
DEFAULT_ADMIN_URL = "http://127.0.0.1:9465"
API_PREFIX = "/admin/api/v1"
TIMEOUT_S = 10.0


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "admin API",
        "Read from the server's admin API (its [admin] section; the admin UI's address, not"
        f" the job API's). Its key comes from ${ADMIN_KEY_ENV} or --admin-key-file, never"
        " from a flag; a server whose admin API listens on loopback without keys needs none.",
    )
    group.add_argument(
        "--admin",
        metavar="URL",
        default=os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL,
        help=f"the admin API's base URL (default: ${ADMIN_URL_ENV}, else {DEFAULT_ADMIN_URL})",
    )
    group.add_argument(
        "--admin-key-file",
        metavar="PATH",
        help=f"read the admin key from PATH (default: ${ADMIN_KEY_ENV})",
    )


class AdminApi:
    """GETs against one admin API; every failure is one `CliError` that says what to check."""

    def __init__(self, base_url: str, key: str | None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(
                f"--admin {base_url!r}: expected http://host:port or https://host:port"
            )
        self.base_url = base_url.rstrip("/")
        self._key = key

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AdminApi:
        key = os.environ.get(ADMIN_KEY_ENV) or None
        if args.admin_key_file is not None:
            try:
                with open(args.admin_key_file, encoding="utf-8") as file:
                    key = file.read().strip() or None
            except OSError as exc:
                raise UsageError(f"--admin-key-file: {exc.strerror}: {exc.filename}") from None
            if key is None:
                raise UsageError(f"--admin-key-file {args.admin_key_file}: the file is empty")
        return cls(args.admin, key)

    async def get(self, path: str, **query: str | int | None) -> Any:
        """The JSON at `API_PREFIX + path`, fetched in a worker thread."""
        return await trio.to_thread.run_sync(self._get, path, query, abandon_on_cancel=True)

    def _get(self, path: str, query: dict[str, str | int | None]) -> Any:
        params = {name: str(value) for name, value in query.items() if value is not None}
        url = self.base_url + API_PREFIX + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self._key is not None:
            request.add_header("Authorization", f"Bearer {self._key}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise CliError(self._refusal(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                f"cannot reach the admin API at {self.base_url}: {reason} (is the server's"
                f" [admin] section enabled, and is this its address? set --admin or"
                f" ${ADMIN_URL_ENV})"
            ) from None
        try:
            return json.loads(body)
        except ValueError:
            raise CliError(
                f"{url} did not answer JSON: is {self.base_url} the sepp admin API?"
            ) from None

    def _refusal(self, exc: urllib.error.HTTPError) -> str:
        try:
            detail = json.loads(exc.read()).get("error") or ""
        except (ValueError, AttributeError, OSError):
            detail = ""
        said = f": {detail}" if detail else ""
        if exc.code == 401:
            if self._key is None:
                return (
                    f"the admin API at {self.base_url} needs a key{said}: set ${ADMIN_KEY_ENV}"
                    " or --admin-key-file"
                )
            return f"the admin API at {self.base_url} refused the key{said}"
        if exc.code == 403:
            return f"the admin API at {self.base_url} refused this key's role{said}"
        if exc.code == 404:
            return (
                f"the admin API at {self.base_url} has no {exc.url or 'such page'}{said}"
                " (is this the admin address, not the job API's?)"
            )
        return f"the admin API at {self.base_url} answered HTTP {exc.code}{said}"
