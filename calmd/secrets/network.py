"""Wi-Fi and network tools that take a passphrase as a positional word or a property's value:
`networksetup -setairportnetwork IFACE SSID PASS` (and `-addpreferredwirelessnetworkatindex
IFACE SSID INDEX TYPE PASS`), `nmcli ... password X` and its properties (`wifi-sec.psk X`,
`802-1x.password X`, `wep-key0 X`), `wpa_passphrase SSID PASS`, `wpa_cli set_network ID psk X`,
`iwconfig ... key s:PASS` and iw's `key 0:PASS`, `create_ap IFACE IFACE SSID PASS`, netsh's
`key=PASS` (a hosted network's passphrase). A prompt (no passphrase given), `key off` and a
hex key after `iwconfig key` are told by their place; iwctl's `--passphrase` is named.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from calmd.secrets.names import name_kind
from calmd.secrets.shellwords import unquote
from calmd.secrets.values import literal


def _operands(args: Sequence[str]) -> list[str]:
    return [a for a in args[1:] if not a.startswith("-")]


def _networksetup(args: Sequence[str]) -> bool:
    """`-setairportnetwork IFACE SSID [PASS]`, `-addpreferredwirelessnetworkatindex IFACE SSID
    INDEX TYPE [PASS]`: the word at the passphrase's place."""
    lowered = [a.lower() for a in args]
    for flag, place in (("-setairportnetwork", 3), ("-addpreferredwirelessnetworkatindex", 5)):
        if flag in lowered:
            rest = args[lowered.index(flag) + 1 :]
            if len(rest) > place - 1 and literal(rest[place - 1]):
                return True
    return False


_NM_SECRETS = frozenset({"psk", "wep-key0", "wep-key1", "wep-key2", "wep-key3", "pin"})


def _nmcli(args: Sequence[str]) -> bool:
    """`nmcli dev wifi connect SSID password X`, `nmcli c modify C wifi-sec.psk X`: a property
    whose last part says password (`802-1x.private-key-password`), or psk and the WEP keys."""
    for i, arg in enumerate(args[1:-1], 1):
        prop = unquote(arg).lstrip("+").rsplit(".", 1)[-1].lower()
        if (prop in _NM_SECRETS or name_kind(prop) == "password") and literal(args[i + 1]):
            return True
    return False


def _wpa_passphrase(args: Sequence[str]) -> bool:
    positional = _operands(args)
    return len(positional) >= 2 and literal(positional[1]) is not None


def _wpa_cli(args: Sequence[str]) -> bool:
    """`wpa_cli set_network ID psk|password VALUE`."""
    words = [unquote(a) for a in args]
    for i, word in enumerate(words[:-1]):
        if word in ("psk", "password", "wep_key0", "sae_password") and "set_network" in words[:i]:
            return literal(args[i + 1]) is not None
    return False


# iwconfig's `key s:ASCII` (or `enc`), iw's `key 0:KEY`, `keys d:0:KEY`: a key given in the clear
_WIRELESS_KEY = re.compile(r"(?:s:|(?:d:)?\d:).+")


def _wireless_key(args: Sequence[str]) -> bool:
    for i, arg in enumerate(args[1:-1], 1):
        if arg in ("key", "enc", "keys") and _WIRELESS_KEY.fullmatch(unquote(args[i + 1])):
            return True
    return False


def _create_ap(args: Sequence[str]) -> bool:
    """`create_ap [options] WIFI_IFACE INTERNET_IFACE SSID [PASSPHRASE]` (`-n`: no internet
    interface, so the passphrase is third); lnxrouter's `-p PASS`."""
    valued = ("-c", "-w", "-g", "-d", "-e", "--freq-band", "--country", "--driver", "--mac", "--dhcp-dns",
              "--stop", "--list-clients", "--hostapd-debug", "--redirect-to-localhost", "--ap", "-o",
              "-p")  # fmt: skip
    operands = [w for k, w in enumerate(args[1:], 1) if not w.startswith("-") and args[k - 1] not in valued]
    place = 3 if "-n" in args else 4
    if len(operands) >= place and literal(operands[place - 1]):
        return True
    return "-p" in args[:-1] and literal(args[args.index("-p") + 1]) is not None


def _netsh(args: Sequence[str]) -> bool:
    """`netsh wlan set hostednetwork ... key=PASS` (`keyusage=persistent` is no key; `show profile
    ... key=clear` asks netsh to print one)."""
    lowered = [a.lower() for a in args]
    return (
        "wlan" in lowered
        and "show" not in lowered
        and any(a.startswith("key=") and a[4:] not in ("clear", "") and literal(args[k][4:]) for k, a in
                enumerate(lowered))
    )  # fmt: skip


# tool name -> (rule, check of the tool's argument words, its name first)
NETWORK_RULES: dict[str, tuple[str, Callable[[Sequence[str]], bool]]] = {
    "networksetup": ("wifi-password", _networksetup),
    "nmcli": ("wifi-password", _nmcli),
    "wpa_passphrase": ("wifi-password", _wpa_passphrase),
    "wpa_cli": ("wifi-password", _wpa_cli),
    "iwconfig": ("wifi-password", _wireless_key),
    "iw": ("wifi-password", _wireless_key),
    "create_ap": ("wifi-password", _create_ap),
    "lnxrouter": ("wifi-password", _create_ap),
    "netsh": ("wifi-password", _netsh),
    "netsh.exe": ("wifi-password", _netsh),
}
