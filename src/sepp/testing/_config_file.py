"""The server's configuration as a launched server gets it: a TOML file in a directory of its
own (the server watches the file's directory and hot-reloads it), and the environment
overrides that pin its address, data dir and logging."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ._output import join_host_port
from ._toml import dumps as toml_dumps

# Config overrides inherited from the caller's environment would make tests
# depend on the shell they run in; they are dropped (pass ``env=`` instead).
_INHERITED_OVERRIDE = re.compile(r"SEPP_[A-Z0-9_]+__[A-Z0-9_]+", re.I)


def write_config_file(path: Path, config: Mapping[str, object]) -> None:
    """Write ``config`` as TOML to ``path`` atomically (the server watches it)."""
    text = toml_dumps(config)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _config_sets_admin_enabled(config: Mapping[str, object]) -> bool:
    admin = config.get("admin")
    return isinstance(admin, Mapping) and admin.get("enabled") is not None


def server_env(
    *,
    host: str,
    port: int | None,
    data_dir: Path,
    config: Mapping[str, object],
    extra_env: Mapping[str, str],
) -> dict[str, str]:
    """The server process's environment: ours without inherited config overrides, then the
    overrides `sepp_server()` documents, then the caller's `env`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "SEPP_CONFIG" and not _INHERITED_OVERRIDE.fullmatch(key)
    }
    env["SEPP_SERVER__LISTEN_ADDR"] = join_host_port(host, port if port is not None else 0)
    env["SEPP_SERVER__DB_PATH"] = str(data_dir)
    if not _config_sets_admin_enabled(config):
        env["SEPP_ADMIN__ENABLED"] = "false"
    # If admin is switched on, a fixed port would clash between servers.
    env["SEPP_ADMIN__LISTEN_ADDR"] = "127.0.0.1:0"
    env["RUST_LOG"] = "sepp=info"
    env["NO_COLOR"] = "1"
    env.update(extra_env)
    return env


def make_workdir(data_dir: str | os.PathLike[str] | None) -> tuple[Path, Path, Path]:
    """Create the temp dir; return it, the config file path and the data dir path."""
    workdir = Path(tempfile.mkdtemp(prefix="sepp-test-"))
    # The config file sits alone in its directory: the server watches the
    # file's parent directory for hot reload.
    config_dir = workdir / "config"
    config_dir.mkdir()
    data_path = Path(data_dir).resolve() if data_dir is not None else workdir / "data"
    return workdir, config_dir / "sepp.toml", data_path
