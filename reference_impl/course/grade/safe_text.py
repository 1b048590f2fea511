"""Text from a submission made safe for each file a grader opens.

A folder name, a failure message or a rank's output is whatever the student made it: bytes that
are not UTF-8 (a folder's name comes as ``os.fsdecode`` gives it, with surrogate escapes), lone
surrogates, control characters, a cell that a spreadsheet runs as a formula, a ``|`` that ends
a Markdown table's cell. Each function here makes text safe for one kind of file, keeping what
it said readable: what cannot be written is shown as an escape (``\\xff``, ``\\x00``,
``\\ud800``), never dropped in silence.
"""
from __future__ import annotations

import re

# What no file gets as it is: C0 controls but tab and newline, DEL and the C1 controls,
# surrogates (a byte that was not UTF-8, or a lone half of a pair), the bidirectional overrides
# and isolates (which make text read other than it is) and the two BMP non-characters XML
# refuses.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069"
                     "\ufffe\uffff]")
_SURROGATE_ESCAPES = range(0xDC80, 0xDD00)  # os.fsdecode's stand-ins for the bytes 0x80-0xff
# A spreadsheet cell starting with one of these is run as a formula (OWASP's list, and the
# full-width forms some spreadsheets read the same way).
_FORMULA_STARTS = tuple("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_MARKDOWN_ESCAPED = re.compile(r"([\\|`<>\[\]])")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if code in _SURROGATE_ESCAPES:
        return f"\\x{code - 0xDC00:02x}"  # the byte the folder's name held
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_text(text) -> str:
    """``text`` as it can be written to any UTF-8 file and read by anyone: escapes for what
    is not a character or is a control character (tab and newline kept)."""
    text = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, text.replace("\r\n", "\n"))


def for_xml(text) -> str:
    """``text`` holding only characters XML 1.0 allows (ElementTree escapes ``<``, ``&`` and
    quotes itself)."""
    return for_text(text)


def for_csv_cell(text) -> str:
    """``text`` for a cell of a sheet: as :func:`for_text`, and a cell a spreadsheet would run
    as a formula (``=``, ``+``, ``-``, ``@`` first, spaces before it or not) starts with ``'``,
    which shows it as text."""
    text = for_text(text)
    return "'" + text if text.lstrip(" ").startswith(_FORMULA_STARTS) else text


def for_markdown_cell(text) -> str:
    """``text`` as one line of a Markdown table's cell: what would end the cell (``|``), start
    code, a link or HTML is escaped."""
    one_line = " ".join(for_text(text).split())
    return _MARKDOWN_ESCAPED.sub(r"\\\1", one_line)


def for_markdown_code(text) -> str:
    """``text`` as code in a Markdown table's cell: fenced by more backticks than it holds in a
    row, with its ``|`` escaped (a table ends a cell there even inside code)."""
    one_line = " ".join(for_text(text).split()).replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", one_line)), default=0))
    padding = " " if one_line.startswith("`") or one_line.endswith("`") else ""
    return f"{fence}{padding}{one_line}{padding}{fence}"


def head_and_tail(text: str, limit: int) -> str:
    """``text``, or when it is longer than ``limit`` characters its first and last parts (where
    a failure says what went wrong and where it ended), saying how much was cut between."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return (f"{text[:head]}\n[... {len(text) - limit:,} characters cut ...]\n"
            f"{text[len(text) - tail:]}")
