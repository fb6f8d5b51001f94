"""Memory quantities as Kubernetes writes them, and what the operator refuses to read."""

from __future__ import annotations

import pytest

from snooze.api.gpupool import parse_pool_spec
from snooze.api.models import SpecError
from snooze.api.quantities import MAX_QUANTITY, QuantityError, format_gib, parse_quantity


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80Gi", 80 * 2**30),
        ("1.5G", 1_500_000_000),
        ("512Mi", 512 * 2**20),
        ("4e9", 4_000_000_000),
        (".5Ki", 512),
        ("7Ei", 7 * 2**60),
        (str(MAX_QUANTITY), MAX_QUANTITY),
    ],
)
def test_quantities_read_as_bytes(text: str, size: int) -> None:
    assert parse_quantity(text) == size


@pytest.mark.parametrize("text", ["1e400", "9999999999999999999999Ei", "8Ei", str(2**63)])
def test_larger_than_kubernetes_can_represent_is_refused(text: str) -> None:
    with pytest.raises(QuantityError, match="larger than Kubernetes can represent"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["80GB", "-1Gi", "1 Gi", "", "Gi"])
def test_what_is_not_a_quantity_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(QuantityError, match="such as '80Gi'"):
        parse_quantity(text)


def test_a_pool_spec_names_the_field_that_is_too_large() -> None:
    with pytest.raises(SpecError, match=r"spec.memory: '1e400' is larger than Kubernetes"):
        parse_pool_spec({"memory": "1e400"})


def test_format_gib() -> None:
    assert (format_gib(30 * 2**30), format_gib(1.5 * 2**30)) == ("30GiB", "1.5GiB")
