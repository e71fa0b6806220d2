#!/bin/bash
set -euo pipefail

cat > /app/convert.py <<'PY'
import click

MM_PER_UNIT = {"mm": 1.0, "cm": 10.0, "m": 1000.0, "km": 1_000_000.0, "in": 25.4, "ft": 304.8}
UNITS = click.Choice(sorted(MM_PER_UNIT))


@click.command()
@click.argument("value", type=float)
@click.option("--from", "source", type=UNITS, required=True)
@click.option("--to", "target", type=UNITS, required=True)
def main(value: float, source: str, target: str) -> None:
    result = round(value * MM_PER_UNIT[source] / MM_PER_UNIT[target], 4)
    text = f"{result:.4f}".rstrip("0").rstrip(".")
    click.echo(text if text not in ("", "-0") else "0")


if __name__ == "__main__":
    main()
PY
python /app/convert.py 1 --from ft --to cm
