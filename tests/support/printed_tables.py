"""Reading the tables a benchmark prints: the rows under a header, and which cells are numbers."""
from __future__ import annotations


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def section(out: str, header: str) -> list[str]:
    """The table rows printed under the line containing ``header``, up to a blank or text line
    (a row starts with a number)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if header in line) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip() or not line.split()[0].isdigit():
            break
        rows.append(line)
    return rows
