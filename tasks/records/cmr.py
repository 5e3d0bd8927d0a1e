"""A granule's CMR temporal values (seed 004's "CMR Temporal Values"), read from its CMR metadata file.

The file is the first of the granule's ``files`` whose name ends ``cmr.json`` (UMM-G), ``cmr.xml`` (ECHO10) or
``cmr_iso.xml`` (ISO 19115-2), at ``s3://{bucket}/{key}`` or its ``filename`` URL, read through the object store.
Selection, per the seed:

- ``beginningDateTime``/``endingDateTime``: the RangeDateTime's Beginning/EndingDateTime (ISO: the TimePeriod's
  begin/endPosition) when the range has both; else SingleDateTime (ISO: the TimeInstant's timePosition) for both;
  else what the range has (an open range keeps its beginning). (The seed's table says ``BeginningDateTime`` for
  the end too: a typo, Cumulus reads ``EndingDateTime``.)
- ``productionDateTime``: ``DataGranule.ProductionDateTime`` (ISO: the LE_ProcessStep's dateTime);
- ``lastUpdateDateTime``: the most recent of the UMM-G ``ProviderDates`` of Type Update, Insert or Create
  (ECHO10: of ``LastUpdate`` and ``InsertTime``; ISO: the date of the citation titled ``UpdateTime``).

Values are kept as the file writes them; one that is not an ISO 8601 date-time is left out. A file that is
missing, unreadable, too large, not JSON/XML, or not UMM-G/ECHO10 gives no values, and the reason is logged:
it never fails the granule's write.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from xml.parsers import expat

from tasks.core import config
from tasks.core.errors import RefusedInput
from tasks.core.object_store import LocalStore, open_url
from tasks.core.runtime import run_logger

CMR_FILE_BYTES = 4 * 1024 * 1024  # a granule's CMR file is a few KB; more is not metadata
TEMPORAL_ATTRS = ("beginningDateTime", "endingDateTime", "productionDateTime", "lastUpdateDateTime")
UPDATE_TYPES = ("Update", "Insert", "Create")


class CmrFileError(RefusedInput):
    """A CMR file that gives no temporal values: why."""


def _name(file: Mapping[str, Any]) -> str:
    for attr in ("fileName", "name", "key", "filename"):
        if isinstance(file.get(attr), str):
            return file[attr]
    return ""


def cmr_file(files: Sequence[Any]) -> Mapping[str, Any] | None:
    """The granule's CMR metadata file (first ``*cmr.json`` / ``*cmr.xml``), or None."""
    for file in files or []:
        if isinstance(file, Mapping) and _name(file).endswith(("cmr.json", "cmr.xml", "cmr_iso.xml")):
            return file
    return None


def file_url(file: Mapping[str, Any]) -> str:
    """``s3://{bucket}/{key}``, else the ``filename`` URL; CmrFileError when the file has no location."""
    if isinstance(file.get("bucket"), str) and isinstance(file.get("key"), str):
        return f"s3://{file['bucket']}/{file['key'].lstrip('/')}"
    if isinstance(file.get("filename"), str) and file["filename"].startswith(("s3://", "file://")):
        return file["filename"]
    raise CmrFileError(f"{_name(file)!r} has no location (bucket and key, or an s3:// or file:// filename)")


def read_limited(url: str) -> bytes:
    """The object's bytes, at most ``CMR_FILE_BYTES``; a local file only inside the configured object store (a
    message must not make us read the machine's files)."""
    store, key = open_url(url)
    if isinstance(store, LocalStore):
        home = config.object_store()
        path = store.path(key)
        if not isinstance(home, LocalStore) or home.root not in path.parents:
            raise CmrFileError(f"{url} is outside the object store")
    try:
        with store.open(key) as handle:
            data = handle.read(CMR_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CmrFileError(f"{url} does not exist") from None
    except Exception as error:  # noqa: BLE001 - S3 refusals, permissions, a directory: all mean "unreadable"
        raise CmrFileError(f"{url} is unreadable: {type(error).__name__}: {error}") from None
    if len(data) > CMR_FILE_BYTES:
        raise CmrFileError(f"{url} is over {CMR_FILE_BYTES} bytes")
    return data


def _refuse(*_args: Any) -> None:
    raise CmrFileError("XML with a DOCTYPE or entity declarations is refused")


def parse_xml(data: bytes) -> ET.Element:
    """The document's root element, parsed by expat with DOCTYPEs and entities refused (no entity expansion,
    no external fetches)."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse
    parser.StartElementHandler = lambda tag, attrs: builder.start(tag, attrs)
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        raise CmrFileError(f"not well-formed XML: {error}") from None
    return builder.close()


def _datetime(value: Any) -> datetime | None:
    """``value`` as an aware date-time when it is ISO 8601 text (naive: UTC), else None."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _most_recent(values: Sequence[Any]) -> str | None:
    dated = [(moment, value.strip()) for value in values if (moment := _datetime(value)) is not None]
    return max(dated, key=lambda pair: pair[0])[1] if dated else None


def _select(begin: Any, end: Any, single: Any, production: Any, updates: Sequence[Any]) -> dict[str, str]:
    """The seed's selection rules over the values found; date-times only, as written."""
    if not (_datetime(begin) and _datetime(end)) and _datetime(single):
        begin = end = single
    values = dict(zip(TEMPORAL_ATTRS, (begin, end, production, _most_recent(updates))))
    return {attr: value.strip() for attr, value in values.items() if _datetime(value) is not None}


def _path(doc: Any, *steps: str) -> Any:
    for step in steps:
        doc = doc.get(step) if isinstance(doc, Mapping) else None
    return doc


def ummg_temporal(doc: Any) -> dict[str, str]:
    """The temporal values of a UMM-G document (a dict)."""
    if not isinstance(doc, Mapping) or not any(
        k in doc for k in ("GranuleUR", "TemporalExtent", "DataGranule", "ProviderDates")
    ):
        raise CmrFileError("not a UMM-G granule (no GranuleUR, TemporalExtent, DataGranule or ProviderDates)")
    dates = doc.get("ProviderDates") if isinstance(doc.get("ProviderDates"), list) else []
    return _select(
        _path(doc, "TemporalExtent", "RangeDateTime", "BeginningDateTime"),
        _path(doc, "TemporalExtent", "RangeDateTime", "EndingDateTime"),
        _path(doc, "TemporalExtent", "SingleDateTime"),
        _path(doc, "DataGranule", "ProductionDateTime"),
        [d.get("Date") for d in dates if isinstance(d, Mapping) and d.get("Type") in UPDATE_TYPES],
    )


def echo10_temporal(root: ET.Element) -> dict[str, str]:
    """The temporal values of an ECHO10 ``<Granule>`` document."""
    if root.tag != "Granule":
        raise CmrFileError(f"not an ECHO10 granule (root element <{root.tag}>)")
    return _select(
        root.findtext("Temporal/RangeDateTime/BeginningDateTime"),
        root.findtext("Temporal/RangeDateTime/EndingDateTime"),
        root.findtext("Temporal/SingleDateTime"),
        root.findtext("DataGranule/ProductionDateTime"),
        [root.findtext("LastUpdate"), root.findtext("InsertTime")],
    )


def _children(elements: Sequence[ET.Element], path: str) -> list[ET.Element]:
    """The elements at ``path`` (``/``-separated tags as written, prefixes included) below each of ``elements``."""
    for tag in path.split("/"):
        elements = [child for element in elements for child in element if child.tag == tag]
    return elements


def _text(elements: Sequence[ET.Element], path: str) -> str | None:
    found = _children(elements, path)
    return found[0].text if found else None


ISO_DATA_ID = "gmd:identificationInfo/gmd:MD_DataIdentification"
ISO_TEMPORAL = "gmd:extent/gmd:EX_Extent/gmd:temporalElement/gmd:EX_TemporalExtent/gmd:extent"


def iso_temporal(root: ET.Element) -> dict[str, str]:
    """The temporal values of an ISO 19115-2 granule (``gmd:DS_Series`` as CMR writes it, prefixes as Cumulus reads
    them)."""
    metadata = _children([root], "gmd:composedOf/gmd:DS_DataSet/gmd:has/gmi:MI_Metadata")
    if root.tag != "gmd:DS_Series" or not metadata:
        raise CmrFileError(f"not an ISO granule (root element <{root.tag}> without gmd:DS_Series/…/gmi:MI_Metadata)")
    identifications = _children(metadata, ISO_DATA_ID)
    with_extent = [i for i in identifications if _children([i], "gmd:extent")][:1]
    updates = [
        i
        for i in identifications
        if _text([i], "gmd:citation/gmd:CI_Citation/gmd:title/gco:CharacterString") == "UpdateTime"
    ]
    return _select(
        _text(with_extent, f"{ISO_TEMPORAL}/gml:TimePeriod/gml:beginPosition"),
        _text(with_extent, f"{ISO_TEMPORAL}/gml:TimePeriod/gml:endPosition"),
        _text(with_extent, f"{ISO_TEMPORAL}/gml:TimeInstant/gml:timePosition"),
        _text(
            metadata,
            "gmd:dataQualityInfo/gmd:DQ_DataQuality/gmd:lineage/gmd:LI_Lineage/gmd:processStep/gmi:LE_ProcessStep/gmd:dateTime/gco:DateTime",
        ),
        [_text(updates[:1], "gmd:citation/gmd:CI_Citation/gmd:date/gmd:CI_Date/gmd:date/gco:DateTime")],
    )


def read_temporal(url: str) -> dict[str, str]:
    """The temporal values of the CMR file at ``url``; CmrFileError saying why there are none."""
    data = read_limited(url)
    if url.endswith("cmr_iso.xml"):
        return iso_temporal(parse_xml(data))
    if not url.endswith("cmr.json"):
        return echo10_temporal(parse_xml(data))
    try:
        document = json.loads(data)
    except ValueError as error:  # UnicodeDecodeError included
        raise CmrFileError(f"not JSON: {error}") from None
    return ummg_temporal(document)


def granule_temporal(granule_id: str, files: Sequence[Any]) -> dict[str, str]:
    """The granule's CMR temporal values, or {} with the reason logged (never an error)."""
    file = cmr_file(files)
    if file is None:
        return {}
    try:
        return read_temporal(file_url(file))
    except CmrFileError as error:
        run_logger(__name__).warning("granule %s: no CMR temporal values: %s", granule_id, error)
        return {}
