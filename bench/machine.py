"""The machine a bench runs on, and the flags every bench shares.

- CPU facts: the model, which vector/matrix flags /proc/cpuinfo lists (CPU_FLAGS: the ones that
  decide float32/bfloat16 speed), the core count, the load average, library versions.
- `--quick`: one argument and one rule for every bench (`add_quick`, `apply_quick`): the bench's
  QUICK settings replace the defaults of every option the command line did not give.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # a CPU with one of these has bfloat16 units


def _cpuinfo() -> tuple[str, set]:
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or "unknown CPU", flags


def cpu_model() -> str:
    """The CPU's model name ("unknown CPU" where /proc/cpuinfo does not say)."""
    return _cpuinfo()[0]


def cpu_flags() -> set:
    """Every flag /proc/cpuinfo lists for the first CPU (empty where it cannot be read)."""
    return _cpuinfo()[1]


def cpu_facts(wanted=CPU_FLAGS) -> tuple[str, dict]:
    """The CPU model and {flag: listed?} for each of `wanted`."""
    model, flags = _cpuinfo()
    return model, {flag: flag in flags for flag in wanted}


def flags_text(flags: dict, sep: str = "  ") -> str:
    """"avx2 yes  avx512f no ..." from cpu_facts' dict."""
    return sep.join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items())


def has_bf16_units() -> bool:
    return bool(set(BF16_FLAGS) & cpu_flags())


def cores() -> int:
    return os.cpu_count() or 1


def load() -> float:
    """The 1-minute load average (other processes' work and ours)."""
    return os.getloadavg()[0]


def load_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(wanted=CPU_FLAGS) -> str:
    """One line: CPU model, cores, the flags of `wanted` it has, the load averages."""
    model, flags = cpu_facts(wanted)
    have = " ".join(f for f, on in flags.items() if on) or "none of " + "/".join(wanted)
    return f"{model}, {cores()} cores, flags {have}, load average {load_text()}"


def versions(names) -> dict:
    """{distribution: version or "not installed"} (read from the installed metadata)."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def facts(names=()) -> dict:
    """The machine for a result.json: cpu, cores, flags, load, Python and `names`' versions."""
    model, flags = cpu_facts()
    return {"cpu": model, "cores": cores(), "flags": flags, "load": list(os.getloadavg()),
            "python": platform.python_version(), **versions(names)}


# ---------------------------------------------------------------------------
# --quick
# ---------------------------------------------------------------------------
def add_quick(parser, quick: dict, help: str = "") -> None:
    """The `--quick` switch: `quick` ({dest: value}) unless the option was given."""
    parser.add_argument("--quick", action="store_true",
                        help=help or f"try it: {quick} unless given")


def apply_quick(args, quick: dict, argv=None):
    """With --quick, each of `quick` whose option (--dest-with-dashes, or --opt=value) is not
    on the command line (`argv`, else sys.argv) takes its quick value."""
    if getattr(args, "quick", False):
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        for key, value in quick.items():
            if f"--{key.replace('_', '-')}" not in given:
                setattr(args, key, value)
    return args
