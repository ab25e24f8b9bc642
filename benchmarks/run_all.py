"""Every benchmark of the project, side by side in one process group, as one markdown table.

Writes ``benchmarks/results.md`` and the table between the ``benchmarks`` markers of docs/REFERENCE.md.
Each row states the anchor it is compared with; ratios are from one run (the machine is noisy,
absolute times drift). Run: ``python benchmarks/run_all.py`` (or ``make bench``).
"""

from __future__ import annotations

import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, markdown  # noqa: E402 - importable once ROOT is on sys.path


def _rows(result: list) -> list[Row]:
    rows = []
    for row in result:
        if isinstance(row, Row):
            rows.append(row)
        else:
            rows.append(
                Row(
                    str(row["name"]),
                    float(row["median_s"]),
                    str(row["anchor"]),
                    float(row["ratio"]),
                    str(row.get("target", "")),
                )
            )
    return rows


def main() -> int:
    import torch

    from benchmarks import cli_start, compare, dashboard, loss_overhead, merge, miles_loss, stress, tracking

    started = time.perf_counter()
    rows: list[Row] = []
    for name, module in (
        ("loss_overhead", loss_overhead),
        ("miles_loss", miles_loss),
        ("merge", merge),
        ("tracking", tracking),
        ("compare", compare),
        ("dashboard", dashboard),
        ("stress", stress),
        ("cli_start", cli_start),
    ):
        print(f"running {name} ...", flush=True)
        rows += _rows(module.run())
    table = markdown(rows)
    header = (
        f"Measured on {platform.machine()} with {torch.get_num_threads()} torch threads, "
        f"Python {platform.python_version()}, torch {torch.__version__}, in "
        f"{time.perf_counter() - started:.0f} s."
    )
    text = f"{header}\n\n{table}\n"
    (ROOT / "benchmarks" / "results.md").write_text(text, encoding="utf-8")
    readme = ROOT / "docs" / "REFERENCE.md"
    content = readme.read_text(encoding="utf-8")
    content = re.sub(
        r"(<!-- benchmarks:start -->\n).*?(\n<!-- benchmarks:end -->)",
        lambda m: m.group(1) + text.rstrip("\n") + m.group(2),
        content,
        flags=re.S,
    )
    readme.write_text(content, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
