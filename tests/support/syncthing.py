"""Two (or more) Syncthing instances on loopback, for the sync tests: each with its own --home, its
GUI/REST on 127.0.0.1 at a free port, no discovery, no relays, no NAT, no upgrades, no usage
reports; peers introduced by device ID at static addresses tcp://127.0.0.1:PORT; one folder
shared, watched (fsWatcher) and rescanned every few seconds. Nothing reaches past 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.support.waiting import HANG_S

FOLDER_ID = "calm-sync"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Syncthing:
    """One instance: `generate()`, then `share(folder, peers)`, then `start()`; `stop()` always."""

    def __init__(self, home: Path, name: str) -> None:
        self.home = home
        self.name = name
        self.api_key = secrets.token_hex(16)
        self.gui_port = free_port()
        self.listen_port = free_port()
        self.device_id = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = home / "syncthing.log"

    def generate(self) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["syncthing", "generate", f"--home={self.home}", "--no-default-folder"],
            capture_output=True, text=True, timeout=HANG_S, check=True,
        )  # fmt: skip
        for line in (out.stdout + out.stderr).splitlines():
            if "Device ID:" in line:
                self.device_id = line.split("Device ID:", 1)[1].strip()
        assert self.device_id, out.stdout + out.stderr
        return self.device_id

    def share(self, folder: Path, peers: list[Syncthing]) -> None:
        """Write the config: loopback only, the peers at their static addresses, `folder` shared."""
        config = self.home / "config.xml"
        tree = ET.parse(config)
        root = tree.getroot()
        gui = root.find("gui")
        assert gui is not None
        _set(gui, "address", f"127.0.0.1:{self.gui_port}")
        _set(gui, "apikey", self.api_key)
        options = root.find("options")
        assert options is not None
        for key, value in {
            "listenAddress": f"tcp://127.0.0.1:{self.listen_port}",
            "globalAnnounceEnabled": "false", "localAnnounceEnabled": "false", "relaysEnabled": "false",
            "natEnabled": "false", "startBrowser": "false", "urAccepted": "-1", "autoUpgradeIntervalH": "0",
            "crashReportingEnabled": "false", "reconnectionIntervalS": "1", "setLowPriority": "false",
            "stunServer": "", "announceLANAddresses": "false",
        }.items():  # fmt: skip
            _set(options, key, value)
        for peer in peers:
            device = ET.SubElement(root, "device", id=peer.device_id, name=peer.name, compression="metadata",
                                   introducer="false", introducedBy="")  # fmt: skip
            ET.SubElement(device, "address").text = f"tcp://127.0.0.1:{peer.listen_port}"
            ET.SubElement(device, "paused").text = "false"
            ET.SubElement(device, "autoAcceptFolders").text = "false"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".stfolder").mkdir(exist_ok=True)
        shared = ET.SubElement(root, "folder", id=FOLDER_ID, label=FOLDER_ID, path=str(folder),
                               type="sendreceive", rescanIntervalS="2", fsWatcherEnabled="true",
                               fsWatcherDelayS="1", ignorePerms="false", autoNormalize="true")  # fmt: skip
        ET.SubElement(shared, "filesystemType").text = "basic"
        for device_id in [self.device_id, *(p.device_id for p in peers)]:
            ET.SubElement(shared, "device", id=device_id, introducedBy="")
        tree.write(config)

    def start(self) -> None:
        env = {**os.environ, "STNOUPGRADE": "1", "STNORESTART": "1", "HOME": str(self.home)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["syncthing", "serve", f"--home={self.home}", "--no-browser", "--no-restart", "--no-upgrade",
                 f"--logfile={self.log_path}"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                if self.rest("/rest/system/ping").get("ping") == "pong":
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"syncthing {self.name} exited: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)  # (no event to wait for: syncthing says nothing when its GUI listens)
        raise RuntimeError(f"syncthing {self.name} did not answer on 127.0.0.1:{self.gui_port}")

    def rest(self, path: str, method: str = "GET") -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.gui_port}{path}", method=method,
                                         headers={"X-API-Key": self.api_key})  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        with opener.open(request, timeout=HANG_S) as reply:
            body = reply.read()
        return json.loads(body) if body else {}

    def connected(self, peer: Syncthing) -> bool:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            found = self.rest("/rest/system/connections").get("connections", {}).get(peer.device_id, {})
            return bool(found.get("connected"))
        return False

    def rescan(self) -> None:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            self.rest(f"/rest/db/scan?folder={FOLDER_ID}", method="POST")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)


def _set(parent: ET.Element, tag: str, value: str) -> None:
    element = parent.find(tag)
    if element is None:
        element = ET.SubElement(parent, tag)
    element.text = value
