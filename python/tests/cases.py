"""The one case list of latentkv (tests/common/cases.h) for the Python tests, so they run the shapes
the C++ tests and latentkv-bench run, edge shapes derived from the kernels' tile constants.

The list comes from the latentkv-cases executable, built with the C++ tests (scripts/test.sh builds
before pytest runs): the path in the environment variable LATENTKV_CASES, else the newest
build*/tests/common/latentkv-cases of this checkout. Without it, collection fails with a message
saying how to build it: the tests must not silently run without their shapes.

    cases.params("edge", "cpu-cheap")   pytest.param((B, S, D, R, H, Dh), id=name) per case
    cases.shapes("random", count=8)     the (B, S, D, R, H, Dh) tuples
    cases.preset("seed")                one preset's tuple
"""

import json
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE = "latentkv-cases"


class Case(NamedTuple):
    name: str
    shape: tuple  # (B, S, D, R, H, Dh)
    dtype: str  # "float32", "bfloat16", "float16"
    tags: frozenset  # "cpu-cheap", "fp32", "bf16", "fp16", "cpu-blocked", "cuda-fused", ...


def _fail(message):
    pytest.fail(f"python/tests/cases.py: {message}", pytrace=False)


def _executable():
    env = os.environ.get("LATENTKV_CASES")
    if env:
        path = Path(env)
        if not path.is_file():
            _fail(f"LATENTKV_CASES = {env!r} is not a file; point it at a built {EXECUTABLE}")
        return path
    found = [p for p in ROOT.glob(f"build*/tests/common/{EXECUTABLE}") if p.is_file()]
    if not found:
        _fail(f"no {EXECUTABLE} under {ROOT}/build*/tests/common/ and LATENTKV_CASES is not set; "
              f"build it with the C++ tests (scripts/test.sh, or cmake --build build --target {EXECUTABLE}) "
              f"or set LATENTKV_CASES to its path")
    return max(found, key=lambda p: p.stat().st_mtime)


def _load():
    path = _executable()
    try:
        text = subprocess.run([str(path)], check=True, capture_output=True, text=True, timeout=60).stdout
        data = json.loads(text)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        _fail(f"running {path} did not give the case list: {e}")
    lists = {}
    for name, rows in data["lists"].items():
        lists[name] = [
            Case(row["name"],
                 tuple(row[k] for k in ("batch", "seq", "model_dim", "rank", "heads", "head_dim")),
                 row["dtype"], frozenset(row["tags"]))
            for row in rows
        ]
    return path, data["random_seed"], lists


SOURCE, RANDOM_SEED, LISTS = _load()


def cases(list_name, *tags, count=None):
    """The cases of one list ("preset", "edge", "decode", "random", "sweep", "mla-sweep") that carry
    every tag given, the first `count` of them when count is given."""
    if list_name not in LISTS:
        raise KeyError(f"list_name = {list_name!r} is not a case list; the lists: {', '.join(LISTS)}")
    picked = [c for c in LISTS[list_name] if set(tags) <= c.tags]
    return picked if count is None else picked[:count]


def shapes(list_name, *tags, count=None):
    """The (B, S, D, R, H, Dh) tuples of cases(list_name, *tags, count=count)."""
    return [c.shape for c in cases(list_name, *tags, count=count)]


def params(list_name, *tags, count=None):
    """cases(...) as pytest parameters: the shape tuple, with the case's name as its id."""
    return [pytest.param(c.shape, id=c.name) for c in cases(list_name, *tags, count=count)]


def preset(name):
    """The (B, S, D, R, H, Dh) of a named preset ("seed", "seed-x16", "deepseek-v2-lite", ...)."""
    for c in LISTS["preset"]:
        if c.name == name:
            return c.shape
    raise KeyError(f"name = {name!r} is not a preset; the presets: {', '.join(c.name for c in LISTS['preset'])}")
