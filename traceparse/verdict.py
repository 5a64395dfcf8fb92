"""Thin verdicts: a value and declared thresholds become a severity; a finding declares how it is shown.

A rule is a measure, declared thresholds and prose; :func:`grade` is the one
place that turns a figure into ``info``, ``warning`` or ``critical``, and
:class:`Column` lets a finding say what its item columns and headline figures
are, so the renderer never guesses a unit from a key's name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Severities, least to most severe.
SEVERITIES = ("info", "warning", "critical")


def severity_rank(severity: str) -> int:
    """Position of ``severity`` in :data:`SEVERITIES` (higher is worse)."""
    return SEVERITIES.index(severity)


#: The units a column or figure may declare, and what each means on screen.
UNITS = {
    "ns": "a duration in integer nanoseconds (shown in ns, us, ms or s)",
    "pct": "a percentage (shown with one decimal and %)",
    "bytes": "a byte count, shown in SI units (kB, MB, GB)",
    "bytes_binary": "a byte count, shown in binary units (KiB, MiB, GiB)",
    "count": "a whole number (shown with thousands separators)",
    "problem_count": ("a count of rows the figures could not use (untimed, skipped, of unknown memory): shown as a "
                      "count, and as a headline figure left off the screen when zero (a zero says nothing; JSON keeps it)"),
    "text": "text, left-aligned; text longer than a screen column is shortened",
    "name": "a kernel, routine or API name: shortened on screen (return type, parameters dropped), whole in JSON",
    "gbps": "GB/s, 1 GB = 10^9 bytes",
    "flops": "floating-point operations (shown in GFLOP)",
    "ratio": "a dimensionless ratio",
    "flop_per_byte": "arithmetic intensity, FLOP per byte (each to the significant figures in force, not marked ×)",
    "metric": ("a counter metric's value (IPC, warps per instruction): each to the significant figures in force, "
               "not marked × (it is a rate, not a multiple)"),
    "number": "any other number or value, shown as is",
    "id": "an identifier (a store id, a format): left-aligned, never shortened",
}


def grade(value: float | None, *, warning: float | None = None, critical: float | None = None,
          higher_is_worse: bool = True) -> str:
    """The severity of ``value`` against its thresholds: ``"info"``, ``"warning"`` or ``"critical"``.

    With ``higher_is_worse`` a value at or above ``critical`` is critical, else
    at or above ``warning`` a warning; otherwise a value *below* ``critical`` is
    critical, else below ``warning`` a warning. A missing value or threshold
    never raises the severity.

    >>> grade(30, warning=25, critical=50), grade(5, warning=50, critical=10, higher_is_worse=False)
    ('warning', 'critical')
    >>> grade(None, warning=1)
    'info'
    """
    if value is None:
        return "info"

    def reached(limit: float | None) -> bool:
        if limit is None:
            return False
        return value >= limit if higher_is_worse else value < limit

    if reached(critical):
        return "critical"
    if reached(warning):
        return "warning"
    return "info"


@dataclass(frozen=True)
class Column:
    """One declared column of a finding's items (or one headline figure): its key, its label, its unit.

    ``unit`` is one of :data:`UNITS`. ``shown``: for a share, the key of each row's value as shown where the rule
    rounded it within a whole of its own (:func:`traceparse.figures.shares_within`: an API call's share within its
    class's), which the screen and the HTML report show instead of rounding ``key`` among the table's rows.
    """

    key: str
    label: str
    unit: str = "number"
    shown: str | None = None

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"column {self.key!r}: unit {self.unit!r} is not one of {', '.join(UNITS)}")

    def to_dict(self) -> dict:
        """The column as JSON gives it (``shown`` only where it is set)."""
        data = asdict(self)
        if data["shown"] is None:
            del data["shown"]
        return data


def aggregated_note(ignored: int, what: str = "memcpy", timed: str = "copies") -> str:
    """The sentence a finding adds when it left out aggregated rows that its timed events already count."""
    if not ignored:
        return ""
    return f" {ignored} aggregated {what} rows ignored: the trace's timed {timed} already count those calls."


#: An info finding whose time at stake is under this share of its trace's span has nothing to say.
QUIET_SHARE = 0.01


def is_quiet(finding, span_ns: int | None = None) -> bool:
    """True for a finding with nothing to say, which ``analyze`` folds into one line.

    That is an info finding that either found no time at stake
    (``impact_ns`` 0, or under :data:`QUIET_SHARE` of the trace's span
    ``span_ns``), or has no time at stake and nothing to list (no items:
    it says only that the trace lacks what the rule needs). Warnings are
    never quiet.
    """
    if finding.severity != "info":
        return False
    if finding.impact_ns is None:
        return not finding.items
    return finding.impact_ns == 0 or (bool(span_ns) and finding.impact_ns < QUIET_SHARE * span_ns)
