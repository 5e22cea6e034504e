"""MQRFH2 headers: parsing the header MQ puts in front of a body that carries message
properties (MQGMO_PROPERTIES_FORCE_MQRFH2), and reading the JMS header fields (<jms>) and
application properties (<usr>) out of its folders."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple
from xml.etree import ElementTree

_RFH2_FIXED_LENGTH = 36  # MQRFH_STRUC_LENGTH_FIXED_2
# Groups nested in a <usr> folder (a property `a.b.c` is two groups deep). JMS producers nest
# none; the bound keeps the walk off Python's recursion limit and the names it builds (each
# level repeats its path) small, whatever a message's header holds.
MAX_USR_GROUP_DEPTH = 64
_FOLDER_CODECS = {1208: "utf-8", 819: "latin-1", 437: "cp437", 850: "cp850", 1252: "cp1252"}
_UTF16_CCSIDS = frozenset({1200, 13488, 17584})


@dataclass(frozen=True)
class Rfh2:
    """One MQRFH2 header: where the next part starts and how it is encoded, and its folders."""

    length: int
    encoding: int
    ccsid: int
    format: bytes
    name_value_ccsid: int
    folders: tuple[str, ...]


class Rfh2Error(ValueError):
    """The bytes announced as an MQRFH2 header are not one."""


def parse_rfh2(data: bytes, encoding: int) -> Rfh2:
    """Parse the MQRFH2 at the start of `data`; `encoding` is the MQ encoding of the structure
    before it (the MQMD's), which fixes the byte order of its integers."""
    if len(data) < _RFH2_FIXED_LENGTH or data[:4] != b"RFH ":
        raise Rfh2Error("no MQRFH2 structure id")
    # MQENC_INTEGER_NORMAL (1) is big-endian; MQENC_INTEGER_REVERSED (2, x86) little-endian.
    order = ">" if encoding & 0x0F == 1 else "<"
    version, length, next_encoding, next_ccsid = struct.unpack_from(order + "4i", data, 4)
    next_format = data[20:28]
    _flags, name_value_ccsid = struct.unpack_from(order + "2i", data, 28)
    if version != 2:
        raise Rfh2Error(f"MQRFH2 version {version}, expected 2")
    if length < _RFH2_FIXED_LENGTH or length > len(data):
        raise Rfh2Error(f"MQRFH2 StrucLength {length} outside 36..{len(data)}")
    folders: list[str] = []
    position = _RFH2_FIXED_LENGTH
    while position < length:
        if position + 4 > length:
            raise Rfh2Error("MQRFH2 folder length runs past StrucLength")
        (folder_length,) = struct.unpack_from(order + "i", data, position)
        position += 4
        if folder_length < 0 or position + folder_length > length:
            raise Rfh2Error(f"MQRFH2 folder of {folder_length} bytes runs past StrucLength")
        raw_folder = data[position : position + folder_length]
        folders.append(_decode_folder(raw_folder, name_value_ccsid, order))
        position += folder_length
    return Rfh2(length, next_encoding, next_ccsid, next_format, name_value_ccsid, tuple(folders))


def _decode_folder(raw: bytes, ccsid: int, order: str) -> str:
    if ccsid in _UTF16_CCSIDS:
        codec = "utf-16-be" if order == ">" else "utf-16-le"
    else:
        codec = _FOLDER_CODECS.get(ccsid, "")
        if not codec:
            raise Rfh2Error(f"MQRFH2 NameValueCCSID {ccsid} not supported")
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as exc:
        raise Rfh2Error(f"MQRFH2 folder not in CCSID {ccsid}: {exc}") from exc
    # Folders are padded to a multiple of four bytes with blanks (some writers use NULs).
    return text.rstrip(" \x00")


class _JmsField(NamedTuple):
    """A <jms> folder field as a JMS header: its name and the type of its value."""

    name: str
    kind: type


# The <jms> folder's fields (IBM MQ "MQRFH2 JMS folder"), as JMS header names.
_JMS_FIELDS: Mapping[str, _JmsField] = {
    "Dst": _JmsField("JMSDestination", str),
    "Rto": _JmsField("JMSReplyTo", str),
    "Tms": _JmsField("JMSTimestamp", int),
    "Exp": _JmsField("JMSExpiration", int),
    "Cid": _JmsField("JMSCorrelationID", str),
    "Pri": _JmsField("JMSPriority", int),
    "Dlv": _JmsField("JMSDeliveryMode", int),
    "Gid": _JmsField("JMSXGroupID", str),
    "Seq": _JmsField("JMSXGroupSeq", int),
}
_XSI = "http://www.w3.org/2001/XMLSchema-instance"
_ROOT_TAG = re.compile(r"\A(\s*<[A-Za-z_][\w.\-]*)")


def rfh2_properties(folders: tuple[str, ...] | list[str]) -> dict[str, object]:
    """Application properties from <usr> (typed by their dt attribute; nested groups become
    dotted names) and JMS header fields from <jms>. Other folders (mcd, mqext) are MQ's own."""
    properties: dict[str, object] = {}
    for text in folders:
        if "xsi:" in text and "xmlns:xsi" not in text:
            # MQ writes null properties as <name xsi:nil="true"/> without declaring xsi.
            text = _ROOT_TAG.sub(rf'\1 xmlns:xsi="{_XSI}"', text, count=1)
        try:
            root = ElementTree.fromstring(text)
        except ElementTree.ParseError as exc:
            raise Rfh2Error(f"MQRFH2 folder is not well-formed XML: {exc}") from exc
        if root.tag == "usr":
            _usr_properties(root, "", properties)
        elif root.tag == "jms":
            for child in root:
                field = _JMS_FIELDS.get(child.tag)
                if field is not None:
                    properties[field.name] = _typed(child.text or "", field.kind, child.tag)
    return properties


def _usr_properties(
    element: ElementTree.Element, prefix: str, out: dict[str, object], depth: int = 0
) -> None:
    for child in element:
        name = prefix + child.tag
        if len(child):
            if depth == MAX_USR_GROUP_DEPTH:
                raise Rfh2Error(
                    f"<usr> nested deeper than {MAX_USR_GROUP_DEPTH} groups (at {name[:60]!r})"
                )
            _usr_properties(child, name + ".", out, depth + 1)
        elif child.get(f"{{{_XSI}}}nil") == "true":
            out[name] = None
        else:
            out[name] = _usr_value(child.text or "", child.get("dt", "string"), name)


def _usr_value(text: str, dt: str, name: str) -> object:
    if dt in ("i1", "i2", "i4", "i8", "int"):
        return _typed(text, int, name)
    if dt in ("r4", "r8"):
        return _typed(text, float, name)
    if dt == "boolean":
        if text.strip() in ("1", "true"):
            return True
        if text.strip() in ("0", "false"):
            return False
        raise Rfh2Error(f"property {name}: {text!r} is not a boolean")
    if dt == "bin.hex":
        return _typed(text, bytes.fromhex, name)
    return text  # "string", or a type this module does not know


def _typed(text: str, kind: Callable[[str], object], name: str) -> object:
    try:
        return kind(text.strip())
    except ValueError as exc:
        raise Rfh2Error(f"property {name}: {text!r}: {exc}") from exc
