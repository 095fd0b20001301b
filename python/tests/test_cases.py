"""The one case list as the Python tests see it (cases.py, from latentkv-cases): every list is
there and non-empty, names are unique within a list, tags and counts filter,
and reference.CASES (python/bench's copy of the presets) still matches the presets."""

import cases
from reference import CASES


def test_every_list_loads_with_unique_names():
    for name in ("preset", "edge", "decode", "random", "sweep", "mla-sweep"):
        listed = cases.cases(name)
        assert listed, name
        names = [c.name for c in listed]
        assert len(set(names)) == len(names), name
        assert all(len(c.shape) == 6 and all(x > 0 for x in c.shape) for c in listed), name


def test_reference_cases_match_the_presets():
    assert CASES["founding"] == cases.preset("seed")
    for name in ("deepseek-v2-lite", "deepseek-v3"):
        assert CASES[name] == cases.preset(name)


def test_random_list_has_the_suites_count():
    assert len(cases.cases("random")) == 60 and cases.RANDOM_SEED > 0


def test_tags_filter_and_count_limit():
    cheap = cases.cases("edge", "cpu-cheap")
    assert cheap and all("cpu-cheap" in c.tags for c in cheap)
    assert len(cheap) < len(cases.cases("edge"))  # the resident cuda-fused tiles are not cheap
    assert len(cases.shapes("random", count=8)) == 8
    assert all(c.shape[0] * c.shape[1] <= 16 for c in cases.cases("decode"))
