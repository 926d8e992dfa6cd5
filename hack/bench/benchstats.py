"""Number helpers the bench summaries share (summary.py, flows_table.py)."""
import math
import statistics


def num(v):
    """A TSV cell as a float, or None for NA/empty/NaN."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def med(xs):
    """Median of the values that are not None, or None."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x, fmt="%.2f"):
    """A number for a table cell; "-" for None."""
    return "-" if x is None else fmt % x
