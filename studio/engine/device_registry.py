"""The device registry: the devices a user added (remote agents), kept per user in the config
folder (``devices.json``), with each agent's token in a file only the user can read (0600)
beside it. The host CPU and an HTP simulator per catalog chip are always there and not stored.

Device ids: ``agent:NAME`` runs on the agent's host CPU, ``agent:NAME@BACKEND`` on one of its
backends (``htp-sim:CHIP`` on an x86 agent, ``htp:CHIP`` on a Snapdragon); the figures carry
the source label the agent gives its backend.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import platformdirs

from studio.core.devices import agent_device
from studio.core.devices.agent import backend_of, name_of
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, atomic_write_text
from studio.engine.devices.agent_client import AgentClient

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def config_dir() -> Path:
    """``QSTUDIO_CONFIG_DIR`` or the user's config folder."""
    env = os.environ.get("QSTUDIO_CONFIG_DIR")
    if env:
        return Path(env)

    return platformdirs.user_config_path("qstudio", appauthor=False)


@dataclass(frozen=True)
class AgentDevice:
    name: str
    url: str
    cafile: str = ""  # the certificate (or CA) an https agent is trusted by; "": the system's

    @property
    def id(self) -> str:
        return f"agent:{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Registry:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder else config_dir()
        self.file = self.folder / "devices.json"
        self.settings_file = self.folder / "settings.json"

    # ---- settings: the QAIRT SDK folder adb runs take qnn-net-run and the libraries from
    def settings(self) -> dict[str, Any]:
        if not self.settings_file.is_file():
            return {}
        try:
            data = json.loads(self.settings_file.read_text())
        except (ValueError, OSError) as exc:
            raise StudioError(f"the settings file {self.settings_file} is unreadable ({exc}): "
                              "fix or delete it") from None
        return data if isinstance(data, dict) else {}

    def sdk_root(self) -> tuple[Path | None, str]:
        """(the QAIRT SDK folder, where it was set): the setting, else ``QNN_SDK_ROOT`` /
        ``QAIRT_SDK_ROOT`` from the environment (the SDK's own variables)."""
        set_to = self.settings().get("qairt_sdk")
        if set_to:
            return Path(set_to), "settings"
        for var in ("QNN_SDK_ROOT", "QAIRT_SDK_ROOT"):
            if os.environ.get(var):
                return Path(os.environ[var]), var
        return None, ""

    def set_sdk_root(self, folder: str | None) -> Path | None:
        """Set (or with None / "" clear) the QAIRT SDK folder."""
        data = self.settings()
        if not folder:
            data.pop("qairt_sdk", None)
            atomic_write_json(self.settings_file, data)
            return None
        root = Path(folder).expanduser().resolve()
        if not (root / "lib").is_dir() or not (root / "bin").is_dir():
            raise StudioError(f"{root} is not a QAIRT SDK folder (it has no bin/ and lib/): give "
                              "the folder the SDK unpacked into, e.g. .../qairt/2.37.0.250724")
        data["qairt_sdk"] = str(root)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.settings_file, data)
        return root

    def _read(self) -> dict[str, Any]:
        if not self.file.is_file():
            return {"agents": {}}
        try:
            data = json.loads(self.file.read_text())
        except (ValueError, OSError) as exc:
            raise StudioError(f"the device registry {self.file} is unreadable ({exc}): fix or "
                              "delete it") from None
        if not isinstance(data, dict) or not isinstance(data.get("agents"), dict):
            raise StudioError(f"the device registry {self.file} is not a device list: fix or "
                              "delete it")
        return data

    def agents(self) -> list[AgentDevice]:
        return [AgentDevice(n, a["url"], a.get("cafile", ""))
                for n, a in sorted(self._read()["agents"].items())]

    def get(self, name: str) -> AgentDevice:
        for a in self.agents():
            if a.name == name:
                return a
        raise StudioError(f"no device named {name!r}: add it with studio devices add {name} "
                          "--url URL --token-file F")

    def _token_file(self, name: str) -> Path:
        return self.folder / "tokens" / name

    def token(self, name: str) -> str:
        f = self._token_file(name)
        try:
            return f.read_text().strip()
        except OSError:
            raise StudioError(f"the token of device {name!r} is missing ({f}): add the device "
                              "again with its token") from None

    def add(self, name: str, url: str, token: str, cafile: str = "") -> AgentDevice:
        if not NAME.match(name or ""):
            raise StudioError(f"device names are letters, digits, '.', '_' and '-' (not "
                              f"{name!r})")
        if not re.match(r"^https?://[^\s/]+(:\d+)?/?$", url or ""):
            raise StudioError(f"the agent URL must look like http://HOST:PORT, not {url!r}")
        if not token.strip():
            raise StudioError("the pairing token is empty: copy it from the agent's output")
        if cafile and not Path(cafile).is_file():
            raise StudioError(f"the certificate file {cafile} does not exist")
        data = self._read()
        data["agents"][name] = {"url": url.rstrip("/"),
                                **({"cafile": str(Path(cafile).resolve())} if cafile else {})}
        tok = self._token_file(name)
        tok.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_text(tok, token.strip())
        os.chmod(tok, 0o600)
        atomic_write_json(self.file, data)
        return AgentDevice(name, url.rstrip("/"), str(Path(cafile).resolve()) if cafile else "")

    def remove(self, name: str) -> None:
        data = self._read()
        if name not in data["agents"]:
            raise StudioError(f"no device named {name!r}")
        del data["agents"][name]
        atomic_write_json(self.file, data)
        self._token_file(name).unlink(missing_ok=True)

    def client(self, name: str):
        a = self.get(name)
        return AgentClient(a.url, self.token(name), cafile=a.cafile or None)


def parse_device_id(device_id: str) -> tuple[str, str]:
    """``agent:NAME[@BACKEND]`` -> (NAME, BACKEND), BACKEND ``cpu`` by default (the id read by
    :func:`studio.core.devices.device`, the one parser of device ids)."""
    dev = agent_device(device_id)
    return name_of(dev), backend_of(dev)
