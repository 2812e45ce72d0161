"""One argparse ``type=`` per kind of command-line value.

Every subcommand declares its arguments with these, so a bad value is refused by argparse before
the command does any work: ``llmsla <cmd>: error: argument --x: <why>`` and exit code 2, never a
traceback, a silent wrap-around (a port of 99999) or an allocation sized by the value (a time
range of millennia). Each raises :class:`argparse.ArgumentTypeError` with the reason.

The rules are the configuration's own where there is one: :func:`port` and :func:`host` are
:func:`llmsla.config.check_port` / :func:`~llmsla.config.check_host`, and :func:`key` checks a
flag that sets a configuration key with that key's declared type, bounds, choices and ``check``
(:func:`llmsla.config.check_value`), so the flag and the key refuse the same values.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from llmsla import config

log = logging.getLogger(__name__)

#: Longest duration a command accepts (a year): longer is a typo, and some are scheduled as
#: event-loop timers or sized into arrays.
MAX_DURATION_S = 366 * 86400.0
#: Earliest time a ``--from``/``--to`` may name: nothing llmsla records is older.
TIME_MIN = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: How far into the future a time may lie.
TIME_MAX_AHEAD = dt.timedelta(days=366)

_RELATIVE = re.compile(r"^(?:now)?(?:-(\d+(?:\.\d+)?)([smhdw]))?$")


_F = TypeVar("_F", bound=Callable[..., Any])


def _typed(name: str, fn: _F) -> _F:
    fn.__name__ = name  # argparse names the type in its own messages
    return fn


def _error(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _error(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise _error(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise _error(f"expected a finite number, got {text!r}")
    return value


# -- addresses --------------------------------------------------------------------------------------
def port(text: str) -> int:
    """A TCP port someone connects to: 1..65535."""
    try:
        return config.check_port(_int(text), "")
    except config.ConfigError as exc:
        raise _error(str(exc)) from None


def port0(text: str) -> int:
    """A listen port where 0 means a free one (printed once listening): 0..65535."""
    try:
        return config.check_port(_int(text), "", allow_zero=True)
    except config.ConfigError as exc:
        raise _error(str(exc)) from None


def host(text: str) -> str:
    """A listen address: an IP literal or a syntactically valid host name (that it resolves is
    found out when binding: :func:`llmsla.httpkit.serve` reports that as one line)."""
    try:
        return config.check_host(text, "")
    except config.ConfigError as exc:
        raise _error(str(exc)) from None


def url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (:func:`llmsla.config.url_problem`)."""
    if (why := config.url_problem(text)) is not None:
        raise _error(why)
    return text


url = _typed("URL", url)


def label(text: str) -> str:
    """A name the events may carry as a label (a model, pool, zone or arm name)."""
    if (why := config.label_problem(text)) is not None:
        raise _error(why)
    return text


label = _typed("name", label)


# -- numbers ----------------------------------------------------------------------------------------
def number(kind: type = float, *, minimum: float | None = None, maximum: float | None = None,
           above: float | None = None) -> Callable[[str], Any]:
    """An int or a finite float with optional bounds (``above``: strictly greater)."""
    def parse(text: str) -> Any:
        value = _int(text) if kind is int else _float(text)
        if minimum is not None and value < minimum:
            raise _error(f"must be >= {minimum}, got {value}")
        if above is not None and value <= above:
            raise _error(f"must be > {above}, got {value}")
        if maximum is not None and value > maximum:
            raise _error(f"must be <= {maximum}, got {value}")
        return value
    what = "int" if kind is int else "float"
    return _typed(f"{what} >= {minimum}" if minimum is not None else f"{what} > {above}" if above is not None else what,
                  parse)


positive_int = number(int, minimum=1)
non_negative_int = number(int, minimum=0)
positive_float = number(float, above=0)
non_negative_float = number(float, minimum=0)
fraction = number(float, minimum=0, maximum=1)
#: seconds, 0 allowed (commands document what 0 means: "until stopped", "all"), at most a year
duration_s = number(float, minimum=0, maximum=MAX_DURATION_S)
#: seconds, more than 0, at most a year
positive_duration_s = number(float, above=0, maximum=MAX_DURATION_S)


def key(name: str) -> Callable[[str], Any]:
    """The value of a flag that sets configuration key ``name`` (``worker.max_batch``), read and
    checked as the key is in the file and the environment."""
    section, _, field_name = name.partition(".")
    if section not in config.SECTIONS or field_name not in getattr(config.SECTIONS[section], "__dataclass_fields__", {}):
        raise KeyError(name)  # a programming error: the flag names a key that does not exist

    def parse(text: str) -> Any:
        try:
            return config.check_value(name, text)
        except config.ConfigError as exc:
            raise _error(str(exc)) from None
    return _typed(name, parse)


def each(parse: Callable[[str], Any], n: int, names: str) -> Callable[[str], list[Any]]:
    """``n`` comma-separated values (``names`` says which, e.g. "train,val,test"), each read by
    ``parse``."""
    def parse_all(text: str) -> list[Any]:
        parts = text.split(",")
        if len(parts) != n:
            raise _error(f"expected {n} comma-separated values {names}, got {text!r}")
        out = []
        for name, part in zip(names.split(","), parts, strict=True):
            try:
                out.append(parse(part))
            except argparse.ArgumentTypeError as exc:
                raise _error(f"{name}: {exc}") from None
        return out
    return _typed(f"{n} values", parse_all)


def memory_size(text: str) -> str:
    """A process memory size as the JVM and Flink write it: a positive whole number of
    megabytes or gigabytes (``1536m``, ``2g``)."""
    m = re.fullmatch(r"(\d+)([mg])", text.strip())
    if not m or int(m.group(1)) == 0:
        raise _error(f"expected a size such as 1536m or 2g, got {text!r}")
    return m.group(0)


memory_size = _typed("memory size", memory_size)


# -- time -------------------------------------------------------------------------------------------
#: a relative time as its own command-line word (``--from -14d``), which argparse takes for an option
_RELATIVE_WORD = re.compile(r"^-\d+(?:\.\d+)?[smhdw]$")


def attach_relative_times(argv: list[str]) -> list[str]:
    """``--from -14d`` -> ``--from=-14d``: argparse reads a word that starts with ``-`` and is not a
    plain negative number as an option, so the documented spelling would fail with "expected one
    argument". No option or positional of llmsla can be such a word, so attaching it is safe."""
    out: list[str] = []
    for word in argv:
        if out and _RELATIVE_WORD.match(word) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def time(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """A point in time (UTC): ``now``; an offset back from now, ``now-6h`` or ``-6h`` (units s, m,
    h, d, w); epoch seconds; or ISO 8601 (``2025-01-31T12:00:00Z``; no offset = UTC). It must lie
    between 1970 and a year from now, so no command sizes anything by a range of millennia."""
    now = now or dt.datetime.now(dt.UTC)
    text = text.strip()
    m = _RELATIVE.match(text) if text else None
    t: dt.datetime | None = None
    out_of_range = _error(f"{text!r}: a time must lie between {TIME_MIN.date()} and a year from now")
    try:
        if m:
            try:
                t = now - dt.timedelta(seconds=float(m.group(1) or 0) * config.DURATION_UNIT_S[m.group(2) or "s"])
            except OverflowError:  # before year 1
                raise out_of_range from None
        else:
            try:
                seconds = float(text)
            except ValueError:
                seconds = None
            if seconds is not None and math.isfinite(seconds):
                t = dt.datetime.fromtimestamp(seconds, dt.UTC)
            else:
                ts = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
                t = ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)
    except (ValueError, OverflowError, OSError):
        t = None
    if t is None:
        raise _error(f"cannot read {text!r} as a time; use ISO 8601 (2025-01-31T12:00:00Z), epoch seconds, "
                     "now, or an offset such as now-6h / -30m / -7d")
    if not TIME_MIN <= t <= now + TIME_MAX_AHEAD:
        raise out_of_range
    return t


time = _typed("time", time)


def epoch_ms(text: str) -> int:
    """Epoch milliseconds, within the range :func:`time` accepts."""
    value = _int(text)
    try:
        time(str(value / 1000))
    except argparse.ArgumentTypeError:
        raise _error(f"{value} ms since the epoch: a time must lie between {TIME_MIN.date()} and a year from now") from None
    return value


epoch_ms = _typed("epoch ms", epoch_ms)


# -- paths ------------------------------------------------------------------------------------------
def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not an existing, readable regular file, else None: stat only, nothing is
    opened (opening a FIFO would block). What :func:`input_file` and the readers of files that
    a key names (the receiver's policy) check."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "file not found"
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, socket or device)"
    if not os.access(path, os.R_OK):
        return "not readable (permission denied)"
    return None


def input_file(text: str) -> Path:
    """An existing, readable regular file (a directory, FIFO or device is refused)."""
    if (why := file_problem(text)) is not None:
        raise _error(f"{text}: {why}")
    return Path(text)


input_file = _typed("file", input_file)


def input_dir(text: str) -> Path:
    """An existing, readable directory."""
    p = Path(text)
    if not p.is_dir():
        raise _error(f"{text}: {'not a directory' if p.exists() else 'no such directory'}")
    if not os.access(p, os.R_OK | os.X_OK):
        raise _error(f"{text}: not readable (permission denied)")
    return p


input_dir = _typed("directory", input_dir)


def _probe_writable(d: Path) -> str | None:
    """Why no file can be created in directory ``d``, else None: a real attempt (a temporary
    file, removed), which also holds for root and for a read-only file system."""
    try:
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def output_file(text: str) -> Path:
    """A file to write: its parent directory exists and takes new files, and the path is not a
    directory (an existing file is replaced)."""
    p = Path(text)
    if p.is_dir():
        raise _error(f"{text}: is a directory; give a file name")
    parent = p.parent
    if not parent.is_dir():
        raise _error(f"{text}: cannot write there: {parent} is {'not a directory' if parent.exists() else 'missing'}")
    if p.exists() and not os.access(p, os.W_OK):
        raise _error(f"{text}: not writable (permission denied)")
    if (why := _probe_writable(parent)) is not None:
        raise _error(f"{text}: cannot write into {parent}: {why}")
    return p


output_file = _typed("output file", output_file)


def output_file_or_stdout(text: str) -> Path | str:
    """:func:`output_file`, or ``-`` for standard output."""
    return "-" if text == "-" else output_file(text)


output_file_or_stdout = _typed("output file", output_file_or_stdout)


def writable_dir(text: str) -> Path:
    """A directory to write into: an existing one that takes new files, or a missing one that
    can be created (its nearest existing parent is a directory that takes new entries). Nothing
    is created here: the command creates it when it first writes (``simulate --no-events
    --spool D`` leaves no D behind)."""
    p = Path(text)
    if p.exists():
        if not p.is_dir():
            raise _error(f"{text}: exists and is not a directory")
        if (why := _probe_writable(p)) is not None:
            raise _error(f"{text}: cannot write into the directory: {why}")
        return p
    parent = p.absolute().parent
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise _error(f"{text}: cannot create the directory: {parent} is not a directory")
    if (why := _probe_writable(parent)) is not None:
        raise _error(f"{text}: cannot create the directory: cannot write into {parent}: {why}")
    return p


writable_dir = _typed("directory", writable_dir)


class OldSpelling(argparse.Action):
    """A flag's old spelling, kept for one release after a rename (``--policy`` meant three
    things): it sets the new flag's ``dest`` through the same ``type=``, warns once naming the
    new spelling, and is hidden from ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        log.warning("%s is renamed %s; the old name works for one more release", option_string, self.new)
        setattr(namespace, self.dest, values)
