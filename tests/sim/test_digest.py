"""The weight-sync digest (``npu_compat.testing._digest``): one value per name -> tensor mapping."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from npu_compat.testing._digest import WeightsDigest, digest_of  # noqa: E402

pytestmark = pytest.mark.same_on_every_stack


def _weights() -> dict[str, object]:
    g = torch.Generator().manual_seed(3)
    return {"a.weight": torch.randn(3, 2, generator=g), "b.bias": torch.randn(4, generator=g)}


def test_the_digest_is_of_the_mapping_not_the_order_it_arrived_in() -> None:
    weights = _weights()
    forward, backward = WeightsDigest(), WeightsDigest()
    for name, tensor in weights.items():
        forward.update(name, tensor)
    for name, tensor in reversed(weights.items()):
        backward.update(name, tensor)
    assert forward.count == backward.count == 2
    assert forward.hexdigest() == backward.hexdigest()
    assert digest_of(weights.items()) == f"2 tensors, sha256 {forward.hexdigest()}"


@pytest.mark.parametrize(
    "change",
    [
        lambda w: w["a.weight"].view(-1)[0].add_(1e-7),  # one element
        lambda w: w.update({"b.bias": w["b.bias"].double()}),  # the dtype it was sent in
        lambda w: w.update({"c.bias": w.pop("b.bias")}),  # the name it sits under
        lambda w: w.update({"a.weight": w["a.weight"].t()}),  # the layout: t() of a 3x2 is another tensor
        lambda w: w.update({"a.weight": w["a.weight"].reshape(2, 3)}),  # the same bytes in another shape
    ],
    ids=["value", "dtype", "name", "layout", "shape"],
)
def test_any_change_of_a_tensor_changes_the_digest(change: object) -> None:
    weights = _weights()
    before = digest_of(weights.items())
    change(weights)  # type: ignore[operator]
    assert digest_of(weights.items()) != before
